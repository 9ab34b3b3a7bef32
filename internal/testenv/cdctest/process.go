// Package cdctest holds the test helpers that the integration suite, the
// chaos suite and the benchmark share around the connector they test: the
// run-the-binary harness (Process), the /metrics scraper (Scrape, Metrics)
// and the environment cleaner (DropSlot, DeleteTopics). testenv starts the
// servers; this package runs and observes what connects to them.
//
// The package is Linux-only, as testenv is: it relies on Pdeathsig and /proc.
package cdctest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// ErrExited is wrapped by the errors of waits that ended because the process
// exited first.
var ErrExited = errors.New("exited")

// ErrStillRunning is wrapped by the errors of Stop and Kill when the process
// outlived the grace period.
var ErrStillRunning = errors.New("still running")

// Options says where a process's output goes.
type Options struct {
	// Name starts every error message ("connector 3", "debezium drain-1").
	Name string
	// Log receives stdout and stderr; it is truncated unless Append is set
	// (several processes, one after another, sharing one file).
	Log    string
	Append bool
	// Header is written to Log before the process starts, to tell apart the
	// processes that share it.
	Header string
}

// Process is a child process whose output goes to a log file. It dies with
// the test binary (Pdeathsig). One goroutine waits for it; Done is closed
// when it has exited.
type Process struct {
	Cmd     *exec.Cmd
	Name    string
	LogPath string
	Started time.Time

	done   chan struct{}
	err    error     // cmd.Wait's result, set before done is closed
	exitAt time.Time // set before done is closed
}

// Command is bin with args and the test binary's environment less the
// OUTBOX_CDC_ variables (CleanEnv), plus env.
func Command(bin string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(CleanEnv(), env...)
	return cmd
}

// CleanEnv is the environment without OUTBOX_CDC_ variables: they would
// override the configuration file under test, and the connector rejects
// unknown ones (the harness's own, OUTBOX_CDC_TEST_PG_DSN, say).
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_CDC_") {
			env = append(env, kv)
		}
	}
	return env
}

// Start starts cmd with its output in o.Log.
func Start(cmd *exec.Cmd, o Options) (*Process, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if o.Append {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(o.Log, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log: %w", o.Name, err)
	}
	defer f.Close() // the child has its own descriptor
	if o.Header != "" {
		if _, err := f.WriteString(o.Header); err != nil {
			return nil, fmt.Errorf("%s: log: %w", o.Name, err)
		}
	}
	cmd.Stdout, cmd.Stderr = f, f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p := &Process{Cmd: cmd, Name: o.Name, LogPath: o.Log, Started: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", o.Name, err)
	}
	go func() {
		p.err = cmd.Wait()
		p.exitAt = time.Now()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is cmd.Wait's result once Done is closed (nil before).
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// ExitedAt is when the process was seen to exit (zero before).
func (p *Process) ExitedAt() time.Time {
	if !p.Exited() {
		return time.Time{}
	}
	return p.exitAt
}

// ExitCode is the exit status once exited: -1 when a signal ended it or it
// still runs.
func (p *Process) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	if p.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Output is everything in the log file.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// LogTail is the last n lines of the log file (or why it cannot be read).
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	return testenv.Tail(string(b), n)
}

// WaitOK polls GET http://addr+path until it answers 200; it fails when the
// process exits first (wrapping ErrExited), after timeout, or when ctx ends.
// Each request has a second: a hung endpoint is a missed poll, not a hang.
func (p *Process) WaitOK(ctx context.Context, addr, path string, timeout time.Duration) error {
	cl := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return fmt.Errorf("%s %w before %s answered 200: %v", p.Name, ErrExited, path, p.err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return err
		}
		if resp, err := cl.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not 200 after %v", p.Name, path, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

// Kill sends SIGKILL and waits, at most 30 s, for the process to be gone.
func (p *Process) Kill() error {
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGKILL: %w", p.Name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second): // a SIGKILLed process is gone in milliseconds
		return fmt.Errorf("%s did not die within 30s of SIGKILL: %w", p.Name, ErrStillRunning)
	}
}

// Stop sends SIGTERM (the connector drains, confirms and exits) and requires
// exit code 0 within timeout; past it the process is killed and Stop fails
// wrapping ErrStillRunning. A process that had exited already is a failure
// too (wrapping ErrExited): it did not wait to be stopped.
func (p *Process) Stop(timeout time.Duration) error {
	if p.Exited() {
		return fmt.Errorf("%s had %w (%v)", p.Name, ErrExited, p.err)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGTERM: %w", p.Name, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM: %w", p.Name, timeout, ErrStillRunning)
	}
	if p.err != nil {
		return fmt.Errorf("%s exit after SIGTERM: %w", p.Name, p.err)
	}
	return nil
}

// Memory returns the process's peak resident set (VmHWM) and its resident
// set now (VmRSS), in bytes.
func (p *Process) Memory() (hwm, rss int64, err error) {
	path := fmt.Sprintf("/proc/%d/status", p.Pid())
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	hwm, rss, err = parseStatus(string(b))
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	return hwm, rss, nil
}

// parseStatus reads VmHWM and VmRSS ("VmHWM:	  123456 kB") from the text
// of /proc/PID/status (proc(5)); both must be there.
func parseStatus(s string) (hwm, rss int64, err error) {
	found := map[string]*int64{"VmHWM": &hwm, "VmRSS": &rss}
	seen := 0
	for line := range strings.SplitSeq(s, "\n") {
		key, val, ok := strings.Cut(line, ":")
		dst, want := found[key]
		if !ok || !want {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(val), "kB")), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s %q: %w", key, val, err)
		}
		*dst = kb << 10
		seen++
	}
	if seen != len(found) {
		return 0, 0, errors.New("no VmHWM or VmRSS")
	}
	return hwm, rss, nil
}
