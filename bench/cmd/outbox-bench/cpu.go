package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPU accounting reads /proc: utime+stime of a process plus cutime+cstime,
// the time of children it has reaped. PostgreSQL's postmaster reaps every
// backend and walsender, so the postmaster's total plus that of its live
// children is everything the server has spent, across connections opening
// and closing between two readings.

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// procTicks is one process's own and reaped children's CPU time.
type procTicks struct {
	ppid   int
	own    int64 // utime + stime
	kids   int64 // cutime + cstime
	zombie bool  // exited, not yet reaped: its time is in neither field
}

func readProcTicks(pid int) (procTicks, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTicks{}, err
	}
	return parseProcStat(b)
}

// parseProcStat parses /proc/<pid>/stat; the command name may hold spaces
// and parentheses, so fields are counted from the last ')'.
func parseProcStat(b []byte) (procTicks, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procTicks{}, fmt.Errorf("proc stat: no command name in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 15 {
		return procTicks{}, fmt.Errorf("proc stat: %d fields", len(f)+2)
	}
	n := func(field int) int64 {
		v, _ := strconv.ParseInt(f[field-3], 10, 64)
		return v
	}
	return procTicks{ppid: int(n(4)), own: n(14) + n(15), kids: n(16) + n(17), zombie: f[0] == "Z"}, nil
}

// treeTicks is the CPU time of root and all its descendants, including
// descendants already reaped. 0 if root is gone.
func treeTicks(root int) int64 {
	if root <= 0 {
		return 0
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	all := make(map[int]procTicks, len(entries))
	children := make(map[int][]int)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		t, err := readProcTicks(pid)
		if err != nil {
			continue // exited meanwhile
		}
		all[pid] = t
		children[t.ppid] = append(children[t.ppid], pid)
	}
	if _, ok := all[root]; !ok {
		return 0
	}
	var sum int64
	stack := []int{root}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		t := all[pid]
		sum += t.own + t.kids
		stack = append(stack, children[pid]...)
	}
	return sum
}

// waitReaped waits up to timeout until no child of parent is a zombie, so
// that the time of a child that just exited has reached the parent's
// cutime/cstime.
func waitReaped(parent int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		zombies := false
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if t, err := readProcTicks(pid); err == nil && t.ppid == parent && t.zombie {
				zombies = true
				break
			}
		}
		if !zombies {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ownTicks is one process's CPU including reaped children; 0 if it is gone.
func ownTicks(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	t, err := readProcTicks(pid)
	if err != nil {
		return 0
	}
	return t.own + t.kids
}

// machineTicks returns jiffies of all CPUs from /proc/stat: busy (user,
// nice, system, irq, softirq), steal (time the hypervisor gave to someone
// else) and the total of all states.
func machineTicks() (busy, steal, total int64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, 0
	}
	fields := strings.Fields(sc.Text()) // cpu user nice system idle iowait irq softirq steal guest guest_nice
	for i, v := range fields[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += n
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			steal += n
		default:
			busy += n
		}
	}
	return busy, steal, total
}

// postmasterPID reads the first line of postmaster.pid.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("postmaster pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster pid: %q: %w", line, err)
	}
	return pid, nil
}

// findProcess returns the first process whose command line contains arg, or 0.
func findProcess(arg string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(b, []byte(arg)) {
			return pid
		}
	}
	return 0
}

// cpuProbe names the processes one measurement accounts for.
type cpuProbe struct {
	pgPID     int // postmaster: the whole server
	kafkaPID  int
	clientPID int // the connector process, if any
	pathPID   int // the PostgreSQL backend serving the reader (walsender or relay connection)
}

type cpuSnap struct {
	at                          time.Time
	busy, steal, total          int64
	pg, kafka, client, path, me int64
}

func (p cpuProbe) snap() cpuSnap {
	s := cpuSnap{at: time.Now()}
	s.busy, s.steal, s.total = machineTicks()
	s.pg = treeTicks(p.pgPID)
	s.kafka = ownTicks(p.kafkaPID)
	s.client = ownTicks(p.clientPID)
	s.path = ownTicks(p.pathPID)
	// Not ownTicks: this process reaps pg_recvlogical and the connector,
	// whose time must not count as the benchmark's.
	if t, err := readProcTicks(os.Getpid()); err == nil {
		s.me = t.own
	}
	return s
}

// CPUUsage is CPU time spent between two snapshots, in seconds.
type CPUUsage struct {
	WallSeconds float64 `json:"wall_seconds"`
	// MachineBusyCores is the average number of busy cores (of Cores).
	MachineBusyCores float64 `json:"machine_busy_cores"`
	Postgres         float64 `json:"postgres_seconds"`
	// PostgresPath is the backend serving the reader: the walsender of the
	// connector's slot, or the polling relay's connection.
	PostgresPath float64 `json:"postgres_path_seconds"`
	Kafka        float64 `json:"kafka_seconds"`
	// Client is the connector process or pg_recvlogical.
	Client float64 `json:"client_seconds"`
	// Bench is this program: writers, consumer, and the relay when it runs.
	Bench float64 `json:"bench_seconds"`
	// Other is machine busy time not accounted to the above (other users of
	// the machine, kernel threads, interrupts).
	Other float64 `json:"other_seconds"`
	// Steal is time the hypervisor ran something else while this machine
	// wanted a CPU: a noisy neighbour, not counted as busy.
	Steal float64 `json:"steal_seconds"`
}

func usage(a, b cpuSnap) CPUUsage {
	sec := func(t int64) float64 { return float64(t) / clockTicks }
	u := CPUUsage{
		WallSeconds: b.at.Sub(a.at).Seconds(),
		Postgres:    sec(b.pg - a.pg), PostgresPath: sec(b.path - a.path), Kafka: sec(b.kafka - a.kafka),
		Client: sec(b.client - a.client), Bench: sec(b.me - a.me),
	}
	busy := sec(b.busy - a.busy)
	u.Steal = sec(b.steal - a.steal)
	if u.WallSeconds > 0 {
		u.MachineBusyCores = busy / u.WallSeconds
	}
	u.Other = max(0, busy-u.Postgres-u.Kafka-u.Client-u.Bench)
	return u
}
