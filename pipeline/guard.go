package pipeline

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// defaultGuardInterval is how often the outbox's publication membership is
// read. The confirmed position trails by up to two intervals.
const defaultGuardInterval = time.Second

// guard keeps the outbox in the stream. PostgreSQL decodes an insert only if
// the table was in the publication when the insert was written, so an outbox
// dropped, renamed or removed from the publication stops producing events
// without any error in the stream. The guard reads the membership every
// interval and vouches for a position only once a later reading, which sees
// everything committed before it, still finds the table in place; nothing
// beyond that position is confirmed (gate), so a restart after the fix
// starts before the first insert that was not decoded.
type guard struct {
	src   replication.Source
	watch *replication.Watch
	start replication.Membership
	prev  replication.Snapshot // the last good reading, vouched for by the next
	// first is the WAL position read before the first reading, which found
	// every mapped column: a Relation message of a transaction committed
	// before it describes the table as it was, not as it is.
	first lsn.LSN

	verified atomic.Uint64 // position up to which membership held
	xmin     atomic.Uint64 // snapshot xmin of the reading behind verified
}

// newGuard takes the first reading; from is the start position, vouched for
// by the setup that checked the table.
func newGuard(ctx context.Context, src replication.Source, from lsn.LSN) (*guard, error) {
	g := &guard{src: src, watch: replication.NewWatch(src)}
	s, err := g.watch.Read(ctx, 0)
	if err != nil {
		g.watch.Close()
		return nil, err
	}
	if why := s.LeftStream(src, s.Membership) + s.SchemaProblem(src); why != "" {
		g.watch.Close()
		return nil, &replication.PrerequisiteError{Problem: why, Fix: "see docs/operations.md, \"The outbox leaving the stream\""}
	}
	g.start, g.prev, g.first = s.Membership, s, s.Before
	g.verified.Store(uint64(from))
	g.xmin.Store(s.Xmin)
	return g, nil
}

// Verified is the highest position the membership readings vouch for.
func (g *guard) Verified() lsn.LSN { return lsn.LSN(g.verified.Load()) }

// check reads the membership once. It returns why the outbox left the stream
// (gap: inserts are no longer decoded) or why its rows can no longer be
// mapped, or "" (also on a failed reading, which only holds the gate).
func (g *guard) check(ctx context.Context) (why string, gap bool) {
	s, err := g.watch.Read(ctx, g.start.RelID)
	if err != nil {
		return "", false
	}
	if why := s.LeftStream(g.src, g.start); why != "" {
		return why, true
	}
	if why := s.SchemaProblem(g.src); why != "" {
		return why, false
	}
	// The previous reading's position is vouched for now: this reading's
	// snapshot was taken a whole interval later, so it sees every commit
	// before that position, including one that was caught between its WAL
	// record and its visibility back then.
	if g.prev.Before > g.Verified() {
		g.xmin.Store(g.prev.Xmin)
		g.verified.Store(uint64(g.prev.Before))
	}
	g.prev = s
	return "", false
}

func (g *guard) close() { g.watch.Close() }

// gated confirms no position the guard has not vouched for.
type gated struct {
	replication.Positions
	g *guard
}

func (x gated) Acked() lsn.LSN { return min(x.Positions.Acked(), x.g.Verified()) }

// guardLoop runs the guard until ctx ends or the outbox leaves the stream.
func (p *Pipeline) guardLoop(ctx context.Context, g *guard) {
	t := time.NewTicker(p.cfg.GuardInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch why, gap := g.check(ctx); {
		case gap:
			_ = p.failGap(why, g.Verified(), g.xmin.Load()) // reaches Run through fail
			return
		case why != "":
			p.fail(schemaError(why))
			return
		}
	}
}

// gapInfo is what a restart needs to publish the rows the stream could not
// decode: the position the guard vouched for and the snapshot xmin of the
// reading behind it. Every row written by a transaction at or above Xmin
// may have been written while the table was outside the publication.
type gapInfo struct {
	Since lsn.LSN
	Xmin  uint64
}

// failGap stops the connector because the outbox left the stream.
func (p *Pipeline) failGap(why string, verified lsn.LSN, xmin uint64) error {
	g := &gapInfo{Since: verified, Xmin: xmin}
	if old := p.gap.Load(); old != nil { // an earlier gap, not repaired yet
		g = &gapInfo{Since: min(old.Since, g.Since), Xmin: min(old.Xmin, g.Xmin)}
	}
	p.gap.Store(g)
	p.gapClear.Store(0)
	err := replication.LeftStreamError(p.cfg.Source, why, verified, p.plan.checkpoints != nil)
	p.fail(err)
	return err
}

// schemaError is the fatal error for an outbox table that lost a mapped
// column while the connector ran: its rows could only be dead-lettered.
func schemaError(problem string) error {
	return &replication.FatalError{Reason: "schema_mismatch", Err: &replication.PrerequisiteError{
		Problem: problem + " while the connector ran; nothing after the last complete transaction was confirmed",
		Fix: "restore the column (ALTER TABLE ... ADD COLUMN) or map another one under outbox.columns, and restart; " +
			"rows written while it was missing then go to the dead-letter topic with the reason",
	}}
}

// recordedGap is the gap to record with a checkpoint at acked: nil once the
// backfill ran and the watermark passed every row it published.
func (p *Pipeline) recordedGap(acked lsn.LSN) *gapInfo {
	g := p.gap.Load()
	if g == nil {
		return nil
	}
	if c := lsn.LSN(p.gapClear.Load()); c != 0 && acked >= c && p.gap.CompareAndSwap(g, nil) {
		p.log.Info("gap repaired", "since", g.Since)
		return nil
	}
	return p.gap.Load()
}

// confirmable is the acknowledged position that may be saved or confirmed:
// never beyond what the guard vouched for.
func (p *Pipeline) confirmable() lsn.LSN {
	a := p.tracker.Acked()
	if g := p.plan.guard; g != nil {
		a = min(a, g.Verified())
	}
	return a
}

// finalMargin separates the two readings of the final check: the first one
// covers every commit decoded before the stop, the second one, taken later,
// vouches that it saw them all.
const finalMargin = 100 * time.Millisecond

// finalCheck runs when the stream no longer reads, so that a clean stop
// confirms everything acknowledged instead of what the last periodic
// reading vouched for. It returns the error for an outbox found outside the
// stream (the gap is recorded), nil otherwise.
func (p *Pipeline) finalCheck(ctx context.Context) error {
	g := p.plan.guard
	if g == nil || p.gap.Load() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i := range 2 {
		if i == 1 {
			time.Sleep(finalMargin)
		}
		if why, gap := g.check(ctx); gap {
			return p.failGap(why, g.Verified(), g.xmin.Load())
		}
	}
	return nil
}
