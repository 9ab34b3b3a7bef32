package chaos

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Restores the writers do not wait for. pg-restore pauses the writers until
// the connector runs again, so a reconnect finds the restored server's WAL
// still ending before what it had been sent, which a WAL-end check alone
// catches. An application does not wait: it writes to the restored server
// at once, and its WAL passes the connector's old position within seconds.
// A WAL end then proves nothing: a connector that trusted it would resume
// past the restored server's first transactions and skip them for good
// (docs/operations.md, "Restores": the history marks). These kinds restore
// under a running connector; the writers go on as soon as the server is
// back (the ledger has dropped what the restore undid), and a burst of
// padded rows (fillPast) moves the WAL past the old server's end before the
// connector can reconnect:
//
//   - pg-restore-writing: half the time the connector's only way to the
//     server (the PostgreSQL proxy) opens once the WAL passed the old end,
//     as when a load balancer or a DNS name points at the restored server
//     later; otherwise the burst races the reconnect (backoff 1 s).
//   - pg-restore-default-backoff: the connector runs with the default
//     postgres.reconnect_backoff_max (30 s; the suite's file sets 1 s) and
//     the restore takes 3–8 s longer: its backoff has grown when the server
//     is back, and the writers have seconds.
//   - pg-restore-older: two copies, A then B; B is restored under load and
//     the connector recovers on it; then A, older than the last restore:
//     the marks and positions saved in B's history are not in A's, and the
//     same LSNs carry a third history.
//
// The running connector must stop (server_rewound) when it had been sent
// WAL past the restored end (an undone event was consumed); the runbook is
// pg-restore's (afterRewind). Every event the restored server holds, those
// written before the connector's reconnect too, must be delivered.

const (
	// fillBytes is the random text of each row of the burst: incompressible
	// (TOAST compresses a repeated pad to nothing), so each row moves the
	// WAL by about as much.
	fillBytes = 128 << 10
	// fillMax bounds the burst (50 MiB of WAL).
	fillMax = 400
	// fillMargin: the burst goes this far past the old server's end, read
	// before its stop, which covers the shutdown checkpoint record and what
	// the connector wrote meanwhile (marks, checkpoint saves).
	fillMargin = 64 << 10
	// defaultBackoff is postgres.reconnect_backoff_max's default
	// (docs/configuration.md).
	defaultBackoff = 30 * time.Second
)

// restoreOpts shape one restore under load.
type restoreOpts struct {
	hold bool          // the connector's way to the server opens once the WAL passed the old end
	slow time.Duration // the restore keeps the server down this much longer
	// pause keeps the writers paused until the connector runs again, as
	// pg-restore does (pg-restore-compacted, half the time).
	pause bool
	// must and may bound the running connector's stop: when it must stop
	// (an undone event was consumed), and when it may.
	must, may time.Duration
}

// pgRestoreUnderLoad runs pg-restore-writing, pg-restore-default-backoff
// and pg-restore-older.
func (r *run) pgRestoreUnderLoad(ctx context.Context, kind string, f *faultRecord) (string, error) {
	o := restoreOpts{must: opsExitTimeout, may: 10 * time.Second}
	var desc string
	switch kind {
	case fPGRestoreWriting:
		o.hold = r.rng.IntN(2) == 0
	case fPGRestoreBackoff:
		d, err := r.withDefaultBackoff(ctx, kind)
		if err != nil {
			return d, err
		}
		desc = d + "; "
		o.slow = r.between(3*time.Second, 8*time.Second)
		o.must, o.may = defaultBackoff+time.Minute, defaultBackoff+15*time.Second
	}
	n := 1
	if kind == fPGRestoreOlder {
		n = 2
	}
	dirs, err := r.coldCopies(ctx, n)
	defer removeCopies(dirs)
	if err != nil {
		return desc, err
	}
	on := r.between(2*time.Second, 6*time.Second)
	sleepCtx(ctx, on) // the workload goes on over the last copy
	desc += fmt.Sprintf("%d cold copies, workload on for %v", n, on)
	if kind != fPGRestoreOlder {
		return r.restoreWriting(ctx, f, kind, dirs[0], o, desc+"; ")
	}
	if desc, err = r.restoreWriting(ctx, f, kind, dirs[1], o, desc+"; the last copy "); err != nil {
		return desc, err
	}
	on = r.between(time.Second, 3*time.Second)
	sleepCtx(ctx, on) // the restored server's own history: marks, checkpoints and positions saved in it
	return r.restoreWriting(ctx, f, kind, dirs[0], o, desc+fmt.Sprintf("; %v later the first (older) copy ", on))
}

// withDefaultBackoff stops the connector (SIGTERM) and starts one with the
// default postgres.reconnect_backoff_max; the processes after it read the
// suite's file (1 s) again.
func (r *run) withDefaultBackoff(ctx context.Context, kind string) (string, error) {
	if err := r.conn.stop(time.Minute); err != nil {
		r.opsFailed(kind, "clean stop before the restart with the default backoff: %v", err)
	}
	r.conn.setEnv("OUTBOX_CDC_POSTGRES_RECONNECT_BACKOFF_MAX=" + defaultBackoff.String())
	in, err := r.conn.start(ctx, "default-backoff")
	r.conn.setEnv()
	if err != nil {
		return "", fmt.Errorf("start with the default reconnect backoff: %w", err)
	}
	return fmt.Sprintf("#%d runs with postgres.reconnect_backoff_max %v", in.N, defaultBackoff), nil
}

// coldCopies takes n cold backups (fast stop, copy, restart), 1–3 s of
// workload apart, oldest first. testenv's CopyData writes one place, so
// each copy is moved aside.
func (r *run) coldCopies(ctx context.Context, n int) ([]string, error) {
	var dirs []string
	for i := range n {
		if i > 0 {
			sleepCtx(ctx, r.between(time.Second, 3*time.Second)) // the workload between two copies
		}
		if err := stopPG(ctx); err != nil {
			return dirs, err
		}
		dir, err := env.pg.CopyData(ctx)
		if err != nil {
			return dirs, err
		}
		kept := fmt.Sprintf("%s-%d-%d", dir, len(r.faults), i)
		if err := os.Rename(dir, kept); err != nil {
			return dirs, fmt.Errorf("keep the copy: %w", err)
		}
		dirs = append(dirs, kept)
		if err := restartPG(ctx); err != nil {
			return dirs, err
		}
	}
	return dirs, nil
}

// removeCopies removes the copies of a fault: each is a whole cluster.
func removeCopies(dirs []string) {
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

// restoreWriting restores dir under the running connector: the writers are
// paused from the stop until the ledger matches the restored server, then
// go on at once beside the burst that moves the WAL past the old end.
func (r *run) restoreWriting(ctx context.Context, f *faultRecord, kind, dir string, o restoreOpts, desc string) (string, error) {
	r.ledger.gate.Lock()
	paused := true
	defer func() {
		if paused {
			r.ledger.gate.Unlock()
		}
	}()
	in := r.conn.current()
	oldEnd, err := walEnd(ctx, r.dsn)
	if err != nil {
		return desc, err
	}
	if err := stopPG(ctx); err != nil {
		return desc, err
	}
	// Only now: until the stop returned the sampler may still read the
	// old server, whose history ends here.
	f.rewindAt(time.Now())
	if err := env.pg.RestoreData(ctx, dir); err != nil {
		return desc, err
	}
	sleepCtx(ctx, o.slow) // a longer restore (a larger copy): the connector's backoff grows meanwhile
	if o.hold {
		env.pgProxy.Drop()
		defer env.pgProxy.Heal() // also on a failure below
	}
	if err := restartPG(ctx); err != nil {
		return desc, err
	}
	up := time.Now()
	undone, seen, err := r.undoLedger(ctx)
	if err != nil {
		return desc, err
	}
	desc += fmt.Sprintf("restored (old WAL end %v), down %v: %d events undone (%d of them consumed)",
		oldEnd, up.Sub(f.Rewound).Round(time.Millisecond), undone, seen)
	wait := o.may
	if seen > 0 {
		wait = o.must
	}
	if o.pause {
		return r.afterRewind(ctx, f, kind, reasonAfterRestore, in, wantRewound, seen > 0, wait, desc)
	}
	paused = false
	r.ledger.gate.Unlock() // the writers go on at once
	writing := time.Now()
	rows, passed, err := r.fillPast(ctx, oldEnd+fillMargin)
	if err != nil {
		return desc, err
	}
	desc += fmt.Sprintf("; writers on %v after the restart", writing.Sub(up).Round(time.Millisecond))
	if passed.IsZero() {
		desc += fmt.Sprintf(", %d padded rows did NOT move the WAL past it", rows)
	} else {
		desc += fmt.Sprintf(", WAL past the old end %v after the restart (%d padded rows)", passed.Sub(up).Round(time.Millisecond), rows)
	}
	if o.hold {
		env.pgProxy.Heal()
		desc += "; the connector's way to the server opened then"
	}
	desc, err = r.afterRewind(ctx, f, kind, reasonAfterRestore, in, wantRewound, seen > 0, wait, desc)
	if in != nil && in.exited() && !passed.IsZero() && !in.killed {
		desc += fmt.Sprintf(" [#%d exited %v after the WAL passed]", in.N, in.ExitAt.Sub(passed).Round(time.Millisecond))
	}
	return desc, err
}

// fillPast commits padded rows (one per transaction, the filler's own
// aggregate) until the server's WAL passes target; passed is when the
// writer learned of the commit that passed it, zero if fillMax rows did
// not.
func (r *run) fillPast(ctx context.Context, target lsn.LSN) (rows int, passed time.Time, err error) {
	w := r.filler()
	for rows < fillMax {
		evs, err := w.commitNext(ctx)
		if err != nil {
			return rows, time.Time{}, err
		}
		rows++
		if evs[0].PostLSN > target {
			return rows, evs[0].Committed, nil
		}
	}
	return rows, time.Time{}, nil
}

// filler is the writer of the bursts of padded rows.
func (r *run) filler() *writer {
	if r.fill == nil {
		n := r.m.Writers + 3 + secondWriters // after the publication gap's mixer
		r.fill = newWriter(n, r.dsn, []*aggregate{{id: "fill", typ: "payment", next: 1}}, 0, r.seed, r.ledger, r.wstats)
		r.fill.bucket, r.fill.fill = &r.bucket, fillBytes
		r.t.Cleanup(r.fill.closeConn)
	}
	return r.fill
}

// walEnd reads the current primary's WAL insert position.
func walEnd(ctx context.Context, dsn string) (lsn.LSN, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, direct(dsn))
	if err != nil {
		return 0, fmt.Errorf("read the WAL end: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var s string
	if err := conn.QueryRow(cctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("read the WAL end: %w", err)
	}
	return lsn.Parse(s)
}
