// Package testenv starts real PostgreSQL and Apache Kafka servers for tests.
//
// Each server runs as a child process in its own process group, with its data
// in a fresh temporary directory, listening on free loopback ports. Tests can
// stop, crash and restart the servers on the same data and ports to exercise
// recovery paths. Setting OUTBOX_CDC_TEST_PG_DSN or
// OUTBOX_CDC_TEST_KAFKA_BROKERS makes the harness use an already running
// server instead; lifecycle operations then return ErrExternal.
//
// The package is Linux-only: it relies on process groups, Pdeathsig and /proc.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrExternal is returned by lifecycle operations (stop, crash, restart) on a
// server the harness did not start, such as one named by
// OUTBOX_CDC_TEST_PG_DSN or OUTBOX_CDC_TEST_KAFKA_BROKERS.
var ErrExternal = errors.New("testenv: server is external, lifecycle is not managed")

// ErrNotRunning is returned by Crash and Kill when the server is already down.
var ErrNotRunning = errors.New("testenv: server is not running")

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago. All listeners are held open until every port is chosen so the same
// port is never handed out twice in one call. Another process may still grab
// a port before the caller binds it; the window is small enough for tests.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns one free TCP port on 127.0.0.1 (see FreePorts).
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// RepoRoot returns the directory holding go.mod, found by walking up from the
// working directory (go test runs each package in its own directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("repo root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// waitPortFree polls until 127.0.0.1:port can be bound again, so a restarted
// server can reuse the port of the process that just died.
func waitPortFree(ctx context.Context, port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			return l.Close()
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("port %d still in use: %w", port, err)
		}
	}
}

// sleepCtx waits d or until ctx ends. Its callers use it only as the
// interval of a loop that polls a real state (a port, the process table, a
// server's answer) until it holds or ctx ends: never as synchronization.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// process is a server child process running in its own process group.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // cmd.Wait's result, read only after done is closed
}

// startReady starts a server's cmd (startProcess), hands the process to
// started, and waits until ready says it serves; a server that does not
// get ready is killed, and the error carries the tail of its log.
func startReady(ctx context.Context, name string, cmd *exec.Cmd, logPath string, started func(*process), ready func(context.Context) error) error {
	proc, err := startProcess(cmd, logPath)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	started(proc)
	if err := ready(ctx); err != nil {
		kctx, cancel := detachedContext(30 * time.Second)
		defer cancel()
		_ = proc.kill(kctx)
		return withLog(err, logPath)
	}
	return nil
}

// startProcess starts cmd in a new process group with its output appended to
// logPath. Pdeathsig makes the kernel kill the child if the test binary dies
// (for example on an interrupted go test) so no server is left behind.
func startProcess(cmd *exec.Cmd, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// The child inherits the descriptor; our copy is not needed after Start.
	defer logFile.Close()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pgid is the process group id, equal to the leader's pid thanks to Setpgid.
func (p *process) pgid() int { return p.cmd.Process.Pid }

// exited reports whether the leader process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the leader, which is expected to shut its children down
// as part of its own shutdown protocol, and waits for the leader and all its
// descendants to be gone. If ctx ends first everything is killed.
func (p *process) stop(ctx context.Context, sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	kids := p.descendants()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	err := p.wait(ctx)
	if err == nil {
		err = waitGone(ctx, p.pgid(), kids)
	}
	if err != nil {
		kctx, cancel := detachedContext(30 * time.Second)
		defer cancel()
		_ = p.kill(kctx)
		return err
	}
	return nil
}

// kill sends SIGKILL to the leader, its process group and all its
// descendants, then waits until every one of them is gone. The group alone
// is not enough: PostgreSQL backends call setsid() and so leave the
// postmaster's group, and surviving backends would keep shared memory
// attached and block a restart on the same data directory.
func (p *process) kill(ctx context.Context) error {
	pid := p.pgid()
	var victims []int
	if !p.exited() {
		// Freeze the leader so it cannot fork while its children are
		// collected. Process.Signal is safe against PID reuse.
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		victims = p.descendants()
		_ = p.cmd.Process.Kill()
	}
	// A process group id cannot be reused while any member lives, so this
	// never hits an unrelated group.
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", pid, err)
	}
	for _, v := range victims {
		_ = syscall.Kill(v, syscall.SIGKILL)
	}
	if err := p.wait(ctx); err != nil {
		return err
	}
	return waitGone(ctx, pid, victims)
}

// descendants lists the live descendants of the leader, found by walking
// parent links in /proc.
func (p *process) descendants() []int {
	children := map[int][]int{}
	for pid, st := range procTable() {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	var out []int
	queue := []int{p.pgid()}
	for len(queue) > 0 {
		next := children[queue[0]]
		queue = append(queue[1:], next...)
		out = append(out, next...)
	}
	return out
}

// wait blocks until the leader has exited or ctx is done.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for pid %d: %w", p.pgid(), ctx.Err())
	}
}

// waitGone polls until no live process is left in group pgid and none of
// pids is alive. Orphans are reparented to PID 1, which may never reap them
// in a container, so zombies count as gone.
func waitGone(ctx context.Context, pgid int, pids []int) error {
	for {
		table := procTable()
		alive := 0
		for pid, st := range table {
			if st.pgrp == pgid || slices.Contains(pids, pid) {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("%d processes of group %d still alive: %w", alive, pgid, err)
		}
	}
}

type procStat struct{ ppid, pgrp int }

// procTable reads the parent and process group of every live (non-zombie)
// process from /proc.
func procTable() map[int]procStat {
	table := map[int]procStat{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return table
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// Format: pid (comm) state ppid pgrp ...; comm may contain spaces
		// and parentheses, so split after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		table[pid] = procStat{ppid: ppid, pgrp: pgrp}
	}
	return table
}

// tailFile returns the last n lines of a log file for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return tail(string(b), n)
}

// Tail returns the last n lines of s (cdctest quotes a child's log with it).
func Tail(s string, n int) string { return tail(s, n) }

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// withLog wraps err with the tail of a server log, which is usually where the
// real reason for a failed start is.
func withLog(err error, logPath string) error {
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, logPath, tailFile(logPath, 30))
}

// closeSignal lets Close interrupt a Restart that holds the server lock
// while waiting for readiness, so an interrupted test run shuts down
// promptly instead of waiting out the restart.
type closeSignal struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newCloseSignal() closeSignal {
	ctx, cancel := context.WithCancel(context.Background())
	return closeSignal{ctx, cancel}
}

// bind returns a context that also ends when Close is called.
func (c closeSignal) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// detachedContext returns a context for cleanup work that must run even when
// the caller has no context to give, bounded so a hung server cannot hang the
// test binary.
func detachedContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
