package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
)

// Faults that undo committed transactions (docs/operations.md, "Restores"):
// pg-restore puts back a file-level copy of the data directory taken earlier
// in the fault; pg-promote-behind (promote_test.go) promotes a standby that
// had not received the last transactions. The database itself undoes them:
// the writers' ledger drops them (their copies in Kafka are counted apart,
// "undone", neither lost nor unexpected) and the writers go on from what the
// database now holds. The connector must notice and stop; the suite then
// does what its messages and docs/operations.md say, and the verdict is
// checked against what the server holds.

// Reasons of the processes started after a rewind (the first one may be
// refused, in the exactly_once run).
const (
	reasonAfterRestore = "after-restore"
	reasonAfterPromote = "after-promotion"
)

var (
	// wantRewound: the running connector reconnects to the restored server
	// (reason server_rewound): its WAL ends before what it had sent
	// (replication.sameServer); it lacks the history mark the reconnect
	// resumes at (replication checkMark); or it sends, below where the
	// stream was, a transaction the connector did not decode there before
	// (pipeline diverged: a restore to a point past the mark).
	wantRewound = regexp.MustCompile(`WAL ends at \S+ on timeline \d+, before \S+, which it had sent the connector: it was restored from an older copy` +
		`|the server lacks history mark \d+ \(.*?\), which the connector decoded at or after \S+: it was restored from an older copy` +
		`|after a reconnect the server sent a transaction \(xid \d+, commit \S+\) the connector did not decode there before it reached \S+: the server was restored from an older copy`)
	// wantPromoted: the running connector reconnects to the promoted
	// standby: a timeline it had read past the fork of (timeline_fork), no
	// slot there (PostgreSQL < 17 has no failover slot), or no history mark
	// the stream resumes at (checked first: the standby was promoted before
	// it replayed the mark's commit).
	wantPromoted = regexp.MustCompile(`(?i)moved from timeline \d+ to \d+|slot or the publication was dropped|slot \S+ was dropped` +
		`|the server lacks history mark \d+ \(.*?\), which the connector decoded at or after \S+: it was restored from an older copy or replaced by a server that was behind`)
	// wantCommittedRefused: exactly_once refuses a committed Kafka position
	// the server does not have (pipeline.trustCommitted, NotInHistory).
	wantCommittedRefused = regexp.MustCompile(`committed to Kafka \(topic (\S+), key ([^,]+), timeline \d+\) (lies beyond this server's WAL end|was written on timeline \d+ after this server's history left it)`)
	// repairLine is the verify --repair command a lost slot's runbook prints.
	repairLine = regexp.MustCompile(`verify --config \S+ --repair --since (\S+?)(?:\\n|"|\s|$)`)
)

// pgMoved holds, once a promotion moved the primary, the address every
// direct DSN of the suite was made with and the current primary's.
var pgMoved atomic.Pointer[[2]string]

// direct returns dsn pointed at the current primary: the suite's own
// connections (writers, sampler, checks) follow a promotion.
func direct(dsn string) string {
	if m := pgMoved.Load(); m != nil {
		return strings.Replace(dsn, m[0], m[1], 1)
	}
	return dsn
}

// undo moves the events the database no longer holds (table: what it holds
// now) to l.undone and sets each aggregate's next seq after the highest the
// table holds, so the writers continue from there. The caller holds l.gate
// for writing: no writer is inside a transaction.
func (l *ledger) undo(table map[string]tableRow) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A table-less event has no row: it survived if a row of its
	// transaction did (every transaction that emits one inserts a row too).
	type txnKey struct {
		writer int
		txn    int64
	}
	survived := map[txnKey]bool{}
	for _, e := range l.events {
		if _, ok := table[e.ID]; ok && !e.Message {
			survived[txnKey{e.Writer, e.Txn}] = true
		}
	}
	var kept []event
	n := 0
	top := map[string]int{}
	for _, row := range table {
		top[row.Agg] = max(top[row.Agg], row.Seq)
	}
	for _, e := range l.events {
		_, inTable := table[e.ID]
		if inTable && !e.Message || e.Message && survived[txnKey{e.Writer, e.Txn}] {
			kept = append(kept, e)
			if e.Message {
				top[e.Agg] = max(top[e.Agg], e.Seq)
			}
			continue
		}
		l.undone = append(l.undone, e)
		n++
	}
	l.events = kept
	for _, w := range l.writers {
		for _, a := range append(slices.Clip(w.aggs), w.msgAggs...) {
			a.next = top[a.id] + 1
		}
	}
	return n
}

// undoneIDs are the events a restore or a promotion undid.
func (l *ledger) undoneIDs() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]bool, len(l.undone))
	for _, e := range l.undone {
		m[e.ID] = true
	}
	return m
}

// pgRestore takes a file-level copy of the stopped server (a fast stop, the
// copy, a restart: a cold backup), lets the workload go on for 2–6 s, then
// stops the server and restores the copy. The writers are paused from the
// restore until the connector runs again, so the WAL-end checks alone see
// the rewind; the restores the writers do not wait for, which only the
// history marks see, are restore_writing_test.go's.
func (r *run) pgRestore(ctx context.Context, f *faultRecord) (string, error) {
	if err := stopPG(ctx); err != nil {
		return "", err
	}
	copyDir, err := env.pg.CopyData(ctx)
	if err != nil {
		return "", err
	}
	if err := restartPG(ctx); err != nil {
		return "", err
	}
	copied := time.Now()
	on := r.between(2*time.Second, 6*time.Second)
	sleepCtx(ctx, on) // the workload goes on over the copy
	if r.rng.IntN(2) == 0 {
		// Half the time the rows written since the copy have all reached
		// Kafka before the restore undoes them.
		_ = r.waitCaughtUp(ctx, time.Now(), 30*time.Second)
	}

	r.ledger.gate.Lock()
	defer r.ledger.gate.Unlock()
	in := r.conn.current()
	how := "connector running"
	if r.rng.IntN(3) == 0 {
		// A third of the time the connector is stopped first and started on
		// the restored server: its start checks decide.
		if err := r.conn.stop(time.Minute); err != nil {
			r.opsFailed(fPGRestore, "clean stop before the restore: %v", err)
		}
		in, how = nil, "connector stopped (SIGTERM) before it"
	}
	if err := stopPG(ctx); err != nil {
		return "", err
	}
	// Only now: until the stop returned the sampler may still read the
	// old server, whose history ends here.
	f.Rewound = time.Now()
	if err := env.pg.RestoreData(ctx, copyDir); err != nil {
		return "", err
	}
	if err := restartPG(ctx); err != nil {
		return "", err
	}
	undone, seen, err := r.undoLedger(ctx)
	if err != nil {
		return "", err
	}
	desc := fmt.Sprintf("copied, workload on for %v, restored %v after the copy (%s): %d events undone (%d of them consumed)",
		on, f.Rewound.Sub(copied).Round(time.Millisecond), how, undone, seen)
	// A connector that was sent WAL past the restored end must stop; the
	// proof it was: an undone event reached the consumer.
	wait := opsExitTimeout
	if seen == 0 {
		wait = 10 * time.Second
	}
	return r.afterRewind(ctx, f, fPGRestore, reasonAfterRestore, in, wantRewound, seen > 0, wait, desc)
}

// undoLedger reads what the server holds now and drops the rest from the
// ledger; seen counts the undone events the live consumer had read.
func (r *run) undoLedger(ctx context.Context) (undone, seen int, err error) {
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	table, err := readTable(rctx, direct(r.dsn))
	if err != nil {
		return 0, 0, fmt.Errorf("read the outbox after the rewind: %w", err)
	}
	before := r.ledger.undoneIDs()
	undone = r.ledger.undo(table)
	for id := range r.ledger.undoneIDs() {
		if _, ok := r.live.seenAt(id); ok && !before[id] {
			seen++
		}
	}
	return undone, seen, nil
}

// afterRewind checks that the running connector stops (exit 1, want in an
// error line; required when must, else allowed within wait), then follows
// the runbook (refusal_test.go): start it; in the exactly_once run the
// start must refuse the position committed to Kafka when the connector had
// committed past the server's end (required when must), the suite writes
// the tombstone the message names and starts it again; a lost slot's
// repair command, if a process printed one, is run (pg-promote-behind,
// whose writers are still paused: the caller holds the gate).
func (r *run) afterRewind(ctx context.Context, f *faultRecord, kind, reason string, in *incarnation, want *regexp.Regexp, must bool, wait time.Duration, desc string) (string, error) {
	if in != nil {
		var done bool
		if desc, done = r.rewindExit(ctx, f, kind, in, want, must, wait, desc); done {
			return desc, nil
		}
	}
	return r.launchAfterRewind(ctx, f, kind, reason, must, desc)
}

// rewindExit checks how the running connector in stopped after the rewind;
// done: it went on, as it may when must is false.
func (r *run) rewindExit(ctx context.Context, f *faultRecord, kind string, in *incarnation, want *regexp.Regexp, must bool, wait time.Duration, desc string) (string, bool) {
	took, line, exitErr := r.conn.expectExit(ctx, in, f.Rewound, wait, want)
	switch {
	case exitErr == nil:
		f.ExpectedExit = fmt.Sprintf("#%d exit 1 after %v: %s", in.N, took.Round(time.Millisecond), strings.TrimSpace(line))
		r.expectedExits = append(r.expectedExits, kind+": "+f.ExpectedExit)
		desc += fmt.Sprintf("; connector #%d exited 1 after %v", in.N, took.Round(time.Millisecond))
	case !in.exited() && !must:
		desc += fmt.Sprintf("; connector #%d went on (it had not been sent WAL past the server's end)", in.N)
		return desc, true
	default:
		r.opsFailed(kind, "%v", exitErr)
		desc += "; " + exitErr.Error()
		if !in.exited() {
			_ = r.conn.stop(time.Minute)
		}
	}
	return desc, false
}

// repairIfPrinted runs the verify --repair a process started since the
// rewind printed (a lost slot: the new slot starts at the server's current
// position, so what was committed after the last checkpoint and not
// delivered is republished from the table). The writers are paused, so
// nothing is in flight that verify would take for missing.
func (r *run) repairIfPrinted(ctx context.Context, kind string, since time.Time) string {
	var sinceArg string
	for _, in := range r.conn.incarnations() {
		if in.Start.Before(since) {
			continue
		}
		if m := repairLine.FindStringSubmatch(r.conn.logOf(in.N)); m != nil {
			sinceArg = m[1]
		}
	}
	if sinceArg == "" {
		return ""
	}
	if err := r.waitStreamed(ctx, r.m.CatchUp); err != nil { // lostslot_test.go
		r.opsFailed(kind, "before the repair: %v", err)
	}
	vctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(vctx, r.conn.bin, "verify", "--json", "--repair", "--config", r.conn.cfgPath, "--since", sinceArg)
	cmd.Env = cleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	var rep cli.VerifyReport
	jerr := json.Unmarshal(out, &rep)
	r.noteRepair(since, began, sinceArg, rep.Repair) // lostorder_test.go
	var ee *exec.ExitError
	if err != nil || jerr != nil || rep.Repair == nil {
		if errors.As(err, &ee) {
			err = fmt.Errorf("exit %d", ee.ExitCode())
		}
		r.opsFailed(kind, "verify --repair --since %s: %v %v\n%s", sinceArg, err, jerr, tail(stderr.String(), 2000))
		return fmt.Sprintf("; verify --repair --since %s failed", sinceArg)
	}
	return fmt.Sprintf("; verify --repair --since %s: %d rows, %d missing, %d republished", sinceArg, rep.Rows, rep.Missing.Count, rep.Repair.Published)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func stopPG(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return env.pg.Stop(sctx)
}

func restartPG(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return env.pg.Restart(rctx)
}

// dropUndone leaves out the copies of events a restore or a promotion
// undid, and counts them: the connector published them from WAL the server
// later lost, which it cannot take back (docs/operations.md, "Restores").
// The order rule then restarts after the undone tail: the writers wrote
// the same seqs again.
func dropUndone(rep *Report, recs []copyRec, undone map[string]bool) []copyRec {
	if len(undone) == 0 {
		return recs
	}
	kept := recs[:0:0]
	for _, c := range recs {
		if undone[c.ID] {
			rep.UndoneCopies++
			continue
		}
		kept = append(kept, c)
	}
	return kept
}

// walEpoch is one history of the server's WAL: the samples read while it
// lasted and the events it holds.
type walEpoch struct {
	samples []sample
	events  []event
}

// walEpochs splits the run at each restore or promotion (f.Rewound). A
// restored server's history holds every surviving event committed before
// it ended (the undone ones are out of the ledger); a promoted server's new
// slot is a new stream that says nothing of the old timeline, so its
// history holds only the events committed since the promotion.
func (o *observation) walEpochs(events []event, samples []sample) []walEpoch {
	type cut struct {
		at        time.Time
		newStream bool
	}
	var cuts []cut
	for _, f := range o.Faults {
		for _, at := range f.rewinds() {
			cuts = append(cuts, cut{at, f.NewStream})
		}
	}
	out := make([]walEpoch, len(cuts)+1)
	var floor time.Time // start of the current stream
	for i := range out {
		var from, to time.Time
		if i > 0 {
			from = cuts[i-1].at
			if cuts[i-1].newStream {
				floor = from
			}
		}
		if i < len(cuts) {
			to = cuts[i].at
		}
		in := func(t, lo time.Time) bool { return !t.Before(lo) && (to.IsZero() || t.Before(to)) }
		for _, s := range samples {
			if in(s.T, from) {
				out[i].samples = append(out[i].samples, s)
			}
		}
		for _, e := range events {
			if in(e.Committed, floor) {
				out[i].events = append(out[i].events, e)
			}
		}
	}
	return out
}
