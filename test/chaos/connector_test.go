package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// connector runs the real outbox-cdc binary, one process (incarnation) at a
// time, all writing to one log file.
type connector struct {
	bin     string
	cfgPath string
	logPath string
	dsn     string // direct (not proxied) DSN, to read the slot
	slot    string

	mu sync.Mutex
	// httpAddr is the current process's HTTP address; spareAddr a standby's
	// (takeover swaps them).
	httpAddr, spareAddr string
	cur                 *incarnation
	standby             *incarnation // launched beside cur, not yet streaming
	incs                []*incarnation
	// env is added to the environment of the processes launched while it
	// is set (setEnv): pg-restore-default-backoff runs one process with a
	// setting of the file overridden.
	env []string
	// runbooks: hanging transactions a start found, and their runbooks.
	runbooks []string
}

// setEnv sets the variables the next processes get on top of the file
// (OUTBOX_CDC_* overrides it); none, to go back to the file alone.
func (c *connector) setEnv(kv ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.env = kv
}

// incarnation is one connector process.
type incarnation struct {
	N      int
	Reason string // initial, after-kill, after-exit
	Start  time.Time
	Ready  time.Time
	// SlotAtStart and CkptAtStart are the slot's confirmed_flush_lsn and the
	// connector's checkpoint read after the previous process was gone and
	// its walsender had exited: PostgreSQL resends from there.
	SlotAtStart lsn.LSN
	CkptAtStart lsn.LSN

	proc *cdctest.Process // nil in the checker's tests, which build incarnations by hand
	addr string           // its HTTP address
	// ownLog is a standby's log file: it runs beside the active process,
	// whose lines would otherwise be taken for its own.
	ownLog string
	done   chan struct{} // closed once proc has exited, after err and ExitAt are set
	err    error         // cmd.Wait's result, read after done
	killed bool          // guarded by connector.mu
	// expected is set when an operations fault saw the process exit as it
	// must (exit 1 with the right message); guarded by connector.mu.
	expected bool
	ExitAt   time.Time
	// Backfilled: the process published rows of a publication gap from the
	// table (its log says so; set by the analysis).
	Backfilled bool
}

// exitCode is the process's exit status once done: -1 when a signal ended it.
func (in *incarnation) exitCode() int {
	if in.err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(in.err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func (in *incarnation) exited() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// start launches a new process and waits until /readyz answers 200.
func (c *connector) start(ctx context.Context, reason string) (*incarnation, error) {
	for attempt := 0; ; attempt++ {
		in, err := c.launch(ctx, reason)
		if err != nil {
			return in, err
		}
		err = c.waitReady(ctx, in, time.Minute)
		if err != nil && attempt < 3 && in.exited() && hangingExit(c.logTail(30)) {
			// A start that found a hanging transaction of an earlier
			// process (a broker killed around its EndTxn): the connector's
			// runbook, then a start again, as while it runs (checkConnector).
			done, herr := abortHanging(ctx, c.logTail(30))
			if herr != nil {
				return in, fmt.Errorf("connector #%d stopped at start on a hanging transaction; its runbook failed: %w", in.N, herr)
			}
			c.mu.Lock()
			c.runbooks = append(c.runbooks, fmt.Sprintf("connector #%d stopped at start on a hanging transaction at %s; runbook: %v",
				in.N, in.ExitAt.Format("15:04:05.000"), done))
			c.mu.Unlock()
			reason = "after-hanging-abort"
			continue
		}
		if err != nil {
			return in, err
		}
		in.Ready = time.Now()
		return in, nil
	}
}

// startRunbooks are the hanging-transaction runbooks start ran.
func (c *connector) startRunbooks() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.runbooks...)
}

// launch starts a new process without waiting for it.
func (c *connector) launch(ctx context.Context, reason string) (*incarnation, error) {
	c.mu.Lock()
	if c.cur != nil && !c.cur.exited() {
		c.mu.Unlock()
		return nil, errors.New("connector already running")
	}
	n := len(c.incs) + 1
	c.mu.Unlock()

	slot, ckpt, err := c.restartPosition(ctx)
	if err != nil {
		return nil, err
	}
	in := &incarnation{N: n, Reason: reason, SlotAtStart: slot, CkptAtStart: ckpt}
	if err := c.exec(in, c.addr()); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cur = in
	c.incs = append(c.incs, in)
	c.mu.Unlock()
	return in, nil
}

func (c *connector) addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.httpAddr
}

// exec starts in's process, serving HTTP on addr, its output appended to
// the log after a header that names it.
func (c *connector) exec(in *incarnation, addr string) error {
	path := c.logPath
	if in.ownLog != "" {
		path = in.ownLog
	}
	// The listen address comes from the environment: a standby runs beside
	// the active process on the spare one.
	c.mu.Lock()
	vars := append([]string{"OUTBOX_CDC_HTTP_LISTEN=" + addr}, c.env...)
	extra := strings.Join(c.env, " ")
	c.mu.Unlock()
	if extra != "" {
		extra = ", " + extra
	}
	header := fmt.Sprintf("\n===== chaos: incarnation %d (%s) at %s, slot confirmed %v, checkpoint %v%s =====\n",
		in.N, in.Reason, time.Now().Format("15:04:05.000"), in.SlotAtStart, in.CkptAtStart, extra)
	cmd := cdctest.Command(c.bin, vars, "run", "--config", c.cfgPath)
	p, err := cdctest.Start(cmd, cdctest.Options{Name: fmt.Sprintf("connector %d", in.N), Log: path, Append: true, Header: header})
	if err != nil {
		return err
	}
	in.proc, in.addr, in.done, in.Start = p, addr, make(chan struct{}), p.Started
	go func() {
		<-p.Done()
		in.err, in.ExitAt = p.Err(), p.ExitedAt()
		close(in.done)
	}()
	return nil
}

// waitReady polls /readyz until 200 (the process streams), the process
// exits, or timeout.
func (c *connector) waitReady(ctx context.Context, in *incarnation, timeout time.Duration) error {
	return c.waitOK(ctx, in, "/readyz", timeout)
}

// waitOK polls path on in's HTTP address until it answers 200.
func (c *connector) waitOK(ctx context.Context, in *incarnation, path string, timeout time.Duration) error {
	return in.proc.WaitOK(ctx, in.addr, path, timeout)
}

// keepGoroutines saves the current process's goroutine dump (http.pprof)
// as results/last-run-goroutines.txt, the evidence of a hang, and says so.
func (c *connector) keepGoroutines() string {
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + c.addr() + "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return fmt.Sprintf("goroutine dump: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Sprintf("goroutine dump: %v", err)
	}
	path := filepath.Join("results", "last-run-goroutines.txt")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Sprintf("goroutine dump: %v", err)
	}
	return "goroutine dump of the connector kept in test/chaos/" + path
}

// metric reads one metric from the running process's /metrics: the sum
// of its series (cdctest.Metrics.Value).
func (c *connector) metric(name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return cdctest.Metric(ctx, c.addr(), name)
}

// kill sends SIGKILL to the running process and waits for it to be gone.
func (c *connector) kill() (*incarnation, error) {
	c.mu.Lock()
	in := c.cur
	if in == nil {
		c.mu.Unlock()
		return nil, errors.New("no connector process")
	}
	in.killed = true
	c.mu.Unlock()
	if err := in.proc.Kill(); err != nil {
		return in, err
	}
	<-in.done
	return in, nil
}

// stop sends SIGTERM and waits for a clean exit.
func (c *connector) stop(timeout time.Duration) error {
	c.mu.Lock()
	in := c.cur
	if in != nil {
		in.killed = true // an exit we asked for
	}
	c.mu.Unlock()
	if in == nil || in.exited() {
		return nil
	}
	err := in.proc.Stop(timeout)
	<-in.done
	return err
}

// unexpectedExit returns the current process if it exited without being
// killed or stopped by the suite.
func (c *connector) unexpectedExit() *incarnation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil && c.cur.exited() && !c.cur.killed && !c.cur.expected {
		return c.cur
	}
	return nil
}

// current returns the process started last.
func (c *connector) current() *incarnation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// expectExit waits until in exits on its own, for at most timeout, and
// checks that it failed the way an operator needs: exit code 1 and an error
// line matching want. An exit, whatever its code, is marked expected (it is
// not "the connector exited on its own"); the problems found are returned
// in err. took is from since to the exit.
func (c *connector) expectExit(ctx context.Context, in *incarnation, since time.Time, timeout time.Duration, want *regexp.Regexp) (took time.Duration, line string, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-in.done:
	case <-t.C:
		return 0, "", fmt.Errorf("connector #%d did not stop within %v", in.N, timeout)
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	c.mu.Lock()
	in.expected = true
	c.mu.Unlock()
	took = in.ExitAt.Sub(since)
	lines := errorLines(c.logOf(in.N))
	for _, l := range lines {
		if want.MatchString(l) {
			line = l
			break
		}
	}
	var problems []string
	if code := in.exitCode(); code != 1 {
		problems = append(problems, fmt.Sprintf("exit code %d, want 1 (%v)", code, in.err))
	}
	if line == "" {
		problems = append(problems, fmt.Sprintf("no error line matches %q; error lines: %q", want, lines))
	}
	if len(problems) > 0 {
		return took, line, fmt.Errorf("connector #%d stopped after %v but %s", in.N, took.Round(time.Millisecond), strings.Join(problems, "; "))
	}
	return took, line, nil
}

// errorLines are the lines of a process's log that report a failure: slog
// ERROR records (text or JSON) and the plain "outbox-cdc: ..." messages of
// start-up errors.
func errorLines(log string) []string {
	var out []string
	for l := range strings.SplitSeq(log, "\n") {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, `"level":"ERROR"`) || strings.HasPrefix(l, "outbox-cdc:") {
			out = append(out, l)
		}
	}
	return out
}

// logOf returns what process n wrote: its part of the shared log file, or
// a standby's own file.
func (c *connector) logOf(n int) string {
	if b, err := os.ReadFile(fmt.Sprintf("%s.%d", c.logPath, n)); err == nil {
		return string(b)
	}
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.Index(s, fmt.Sprintf("===== chaos: incarnation %d (", n))
	if i < 0 {
		return ""
	}
	s = s[i:]
	if nl := strings.IndexByte(s, '\n'); nl >= 0 {
		s = s[nl+1:]
	} else {
		return ""
	}
	if j := strings.Index(s, "\n===== chaos: incarnation "); j >= 0 {
		s = s[:j]
	}
	return s
}

// close kills whatever still runs (test cleanup).
func (c *connector) close() {
	c.mu.Lock()
	ins := []*incarnation{c.cur, c.standby}
	for _, in := range ins {
		if in != nil {
			in.killed = true
		}
	}
	c.mu.Unlock()
	for _, in := range ins {
		if in != nil && in.proc != nil && !in.exited() {
			_ = in.proc.Kill()
			<-in.done
		}
	}
}

func (c *connector) incarnations() []*incarnation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*incarnation(nil), c.incs...)
}

// restartPosition waits until no walsender serves the slot (the last
// status update of a killed process may still be on its way through the
// proxy) and returns the slot's confirmed position and the connector's
// checkpoint: a new process resumes from the larger, and PostgreSQL may
// resend anything after the slot's.
func (c *connector) restartPosition(ctx context.Context) (slot, ckpt lsn.LSN, err error) {
	return c.slotPosition(ctx, func(pid *int32) bool { return pid == nil }, "still active 30s after the connector died")
}

// slotPosition polls the slot until released(active_pid) and returns its
// confirmed position read in that moment, and the checkpoint; stuck says
// what a 30 s wait means.
func (c *connector) slotPosition(ctx context.Context, released func(pid *int32) bool, stuck string) (slot, ckpt lsn.LSN, err error) {
	if c.dsn == "" {
		return 0, 0, nil // checker tests with a stand-in binary
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, direct(c.dsn))
	if err != nil {
		return 0, 0, fmt.Errorf("read slot: %w", err)
	}
	defer conn.Close(context.Background())
	for {
		var pid *int32
		var confirmed *string
		err := conn.QueryRow(ctx, `SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, c.slot).
			Scan(&pid, &confirmed)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0, nil // first start: the connector creates it
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read slot: %w", err)
		}
		if released(pid) {
			if confirmed != nil {
				slot, _ = lsn.Parse(*confirmed)
			}
			break
		}
		select {
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("slot %s %s", c.slot, stuck)
		case <-time.After(10 * time.Millisecond): // poll interval of pg_replication_slots
		}
	}
	ckpt, err = readCheckpoint(ctx, conn, c.slot)
	return slot, ckpt, err
}

// readCheckpoint reads the connector's checkpoint row (checkpoint.store
// table, the default); zero when there is none yet.
func readCheckpoint(ctx context.Context, conn *pgx.Conn, slot string) (lsn.LSN, error) {
	var s string
	err := conn.QueryRow(ctx, `SELECT lsn::text FROM outbox_cdc.checkpoints WHERE slot = $1`, slot).Scan(&s)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // no table / schema yet
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read checkpoint: %w", err)
	}
	return lsn.Parse(s)
}

// logTail returns the last n lines of the connector log, or of the
// current process's own log when it has one (a promoted standby).
func (c *connector) logTail(n int) string {
	path := c.logPath
	if in := c.current(); in != nil && in.ownLog != "" {
		path = in.ownLog
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
