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
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrExternal is returned by lifecycle operations (stop, crash, restart) on a
// server the harness did not start, such as one named by
// OUTBOX_CDC_TEST_PG_DSN or OUTBOX_CDC_TEST_KAFKA_BROKERS.
var ErrExternal = errors.New("testenv: server is external, lifecycle is not managed")

// errNotRunning is returned when an operation needs a running process.
var errNotRunning = errors.New("testenv: server is not running")

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

// signal sends sig to the leader only; servers forward it to their children
// as part of their own shutdown protocol.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// killGroup sends SIGKILL to the whole process group, so children of the
// leader (PostgreSQL backends) cannot outlive it and keep ports or shared
// memory busy, then waits for the leader to be reaped and the group to empty.
func (p *process) killGroup(ctx context.Context) error {
	if err := syscall.Kill(-p.pgid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", p.pgid(), err)
	}
	if err := p.wait(ctx); err != nil {
		return err
	}
	return waitGroupGone(ctx, p.pgid())
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

// waitGroupGone polls /proc until no live process is left in the group.
// Orphaned children are reparented to PID 1, which may never reap them in a
// container, so zombies are ignored instead of waited for.
func waitGroupGone(ctx context.Context, pgid int) error {
	for groupAlive(pgid) {
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("process group %d still alive: %w", pgid, err)
		}
	}
	return nil
}

func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		// Without /proc fall back to kill(0), which also counts zombies.
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Format: pid (comm) state ppid pgrp ...; comm may contain spaces,
		// so split after the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(fields[2]); err == nil && g == pgid {
			return true
		}
	}
	return false
}

// tailFile returns the last n lines of a log file for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return tail(string(b), n)
}

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

// detachedContext returns a context for cleanup work that must run even when
// the caller has no context to give, bounded so a hung server cannot hang the
// test binary.
func detachedContext(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
