package cdctest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sh starts a shell script as a Process logging to dir/name.log.
func sh(t *testing.T, script string, o Options) *Process {
	t.Helper()
	if o.Log == "" {
		o.Log = filepath.Join(t.TempDir(), "child.log")
	}
	if o.Name == "" {
		o.Name = "child"
	}
	p, err := Start(Command("/bin/sh", nil, "-c", script), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second): // deadline
		t.Fatal("process did not exit")
	}
}

func TestStop(t *testing.T) {
	// Ready is printed once the trap is set, so SIGTERM meets the handler.
	const ready = `echo ready; while :; do sleep 0.01; done`
	for _, tt := range []struct {
		name, script string
		want         error  // nil: a clean stop
		wantText     string // part of the error
	}{
		{"exits 0 on SIGTERM", `trap 'exit 0' TERM; ` + ready, nil, ""},
		{"exits 3 on SIGTERM", `trap 'exit 3' TERM; ` + ready, nil, "exit status 3"},
		{"ignores SIGTERM", `trap '' TERM; ` + ready, ErrStillRunning, "did not exit within"},
		{"had exited", `exit 0`, ErrExited, "had exited"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := sh(t, tt.script, Options{})
			if tt.want == ErrExited {
				waitDone(t, p)
			} else {
				for !strings.Contains(p.Output(), "ready") {
					time.Sleep(5 * time.Millisecond) // poll of the child's log
				}
			}
			err := p.Stop(300 * time.Millisecond)
			switch {
			case tt.wantText == "" && err != nil:
				t.Fatalf("Stop: %v", err)
			case tt.wantText != "" && (err == nil || !strings.Contains(err.Error(), tt.wantText)):
				t.Fatalf("Stop: %v, want an error containing %q", err, tt.wantText)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Fatalf("Stop: %v, want %v", err, tt.want)
			}
			// However Stop ends, the process is gone.
			if !p.Exited() {
				t.Fatal("still running after Stop")
			}
		})
	}
}

func TestExitCodeAndKill(t *testing.T) {
	p := sh(t, "exit 7", Options{})
	waitDone(t, p)
	if p.ExitCode() != 7 || p.Err() == nil || p.ExitedAt().IsZero() {
		t.Fatalf("exit code %d, err %v, at %v", p.ExitCode(), p.Err(), p.ExitedAt())
	}
	q := sh(t, "exec sleep 30", Options{})
	if q.Exited() || q.ExitCode() != -1 || q.Err() != nil {
		t.Fatal("a running process looks exited")
	}
	if err := q.Kill(); err != nil || !q.Exited() || q.ExitCode() != -1 {
		t.Fatalf("Kill: %v, exited %v, code %d", err, q.Exited(), q.ExitCode())
	}
	if err := q.Kill(); err != nil {
		t.Fatalf("Kill of a dead process: %v", err)
	}
}

// Processes that share a log append to it after their headers; LogTail
// reads its end.
func TestLogAppendAndTail(t *testing.T) {
	log := filepath.Join(t.TempDir(), "shared.log")
	if err := os.WriteFile(log, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, o := range []Options{{Log: log, Append: true, Header: "== one\n"}, {Log: log, Append: true, Header: "== two\n"}} {
		waitDone(t, sh(t, "echo line"+string(rune('1'+i)), o))
	}
	p := sh(t, "echo a; echo b; echo c", Options{Log: log, Append: true})
	waitDone(t, p)
	if got, want := p.Output(), "old\n== one\nline1\n== two\nline2\na\nb\nc\n"; got != want {
		t.Fatalf("log %q, want %q", got, want)
	}
	if got := p.LogTail(2); got != "b\nc" {
		t.Fatalf("LogTail(2) = %q", got)
	}
	// Without Append the log starts empty.
	q := sh(t, "echo new", Options{Log: log})
	waitDone(t, q)
	if got := q.Output(); got != "new\n" {
		t.Fatalf("truncated log %q", got)
	}
}

func TestWaitOK(t *testing.T) {
	var ready atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && ready.Load() {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := sh(t, "exec sleep 30", Options{Name: "connector 1"})
	if err := p.WaitOK(context.Background(), addr, "/readyz", 100*time.Millisecond); err == nil ||
		errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "connector 1: /readyz not 200 after 100ms") {
		t.Fatalf("WaitOK of a 503: %v", err)
	}
	ready.Store(true)
	if err := p.WaitOK(context.Background(), addr, "/readyz", time.Minute); err != nil {
		t.Fatalf("WaitOK: %v", err)
	}
	q := sh(t, "exit 1", Options{Name: "connector 2"})
	err := q.WaitOK(context.Background(), "127.0.0.1:1", "/readyz", time.Minute)
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "connector 2 exited before /readyz answered 200: exit status 1") {
		t.Fatalf("WaitOK of an exited process: %v", err)
	}
}

func TestCleanEnv(t *testing.T) {
	t.Setenv("OUTBOX_CDC_TEST_SOMETHING", "x")
	t.Setenv("CDCTEST_KEEP", "y")
	cmd := Command("/bin/true", []string{"OUTBOX_CDC_HTTP_LISTEN=127.0.0.1:1"})
	var keep, listen bool
	for _, kv := range cmd.Env {
		switch {
		case kv == "CDCTEST_KEEP=y":
			keep = true
		case kv == "OUTBOX_CDC_HTTP_LISTEN=127.0.0.1:1":
			listen = true
		case strings.HasPrefix(kv, "OUTBOX_CDC_"):
			t.Errorf("%s reaches the child", kv)
		}
	}
	if !keep || !listen {
		t.Fatalf("env %v lacks the caller's own or the extra variables", cmd.Env)
	}
}

func TestMemory(t *testing.T) {
	for _, tt := range []struct {
		name, status string
		hwm, rss     int64
		wantErr      bool
	}{
		{"both", "Name:\tx\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n", 2 << 20, 1 << 20, false},
		{"no VmRSS", "VmHWM:\t2048 kB\n", 0, 0, true},
		{"a zombie has neither", "Name:\tx\nState:\tZ (zombie)\n", 0, 0, true},
		{"garbled", "VmHWM:\tlots kB\nVmRSS:\t1 kB\n", 0, 0, true},
	} {
		hwm, rss, err := parseStatus(tt.status)
		if hwm != tt.hwm || rss != tt.rss || (err != nil) != tt.wantErr {
			t.Errorf("%s: %d, %d, %v", tt.name, hwm, rss, err)
		}
	}
	p := sh(t, "exec sleep 30", Options{})
	if hwm, rss, err := p.Memory(); err != nil || hwm <= 0 || rss <= 0 || rss > hwm {
		t.Fatalf("Memory of a live process: %d, %d, %v", hwm, rss, err)
	}
}

func TestRun(t *testing.T) {
	t.Setenv("OUTBOX_CDC_TEST_SOMETHING", "x")
	code, out, err := Run(context.Background(), "/bin/sh", []string{"EXTRA=e"}, "-c", `echo "$EXTRA${OUTBOX_CDC_TEST_SOMETHING:-clean}"; echo err >&2; exit 2`)
	if err != nil || code != 2 || out != "eclean\nerr\n" {
		t.Fatalf("Run = %d, %q, %v", code, out, err)
	}
	// A run that ctx ended is an error, not an exit code to compare.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if code, _, err := Run(ctx, "/bin/sleep", nil, "30"); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run past its deadline = %d, %v", code, err)
	}
}
