package pipeline

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// defaultGuardInterval is how often the outbox's publication membership is
// read while acknowledged positions wait for it; the confirmed position
// trails by about one to two intervals. With nothing waiting it is read
// every guardIdleInterval, to notice a change on a quiet outbox.
const (
	defaultGuardInterval = 100 * time.Millisecond
	guardIdleInterval    = time.Second
	// guardMargin vouches for a reading that a transaction running at it
	// keeps from settling (a long transaction elsewhere in the cluster): a
	// reading that much later sees every commit written before it, barring
	// one held back for as long by a synchronous standby.
	guardMargin = time.Second
	// maxPending bounds the readings waiting to be vouched for.
	maxPending = 64
)

// guard keeps the outbox in the stream. PostgreSQL decodes an insert only if
// the table was in the publication when the insert was written, so an outbox
// dropped, renamed or removed from the publication stops producing events
// without any error in the stream. The guard reads the membership every
// interval and vouches for a position only once a later reading, which sees
// everything committed before it, still finds the table in place; nothing
// beyond that position is confirmed (gate), so a restart after the fix
// starts before the first insert that was not decoded.
type guard struct {
	src     replication.Source
	watch   *replication.Watch
	start   replication.Membership
	pending []reading // good readings not vouched for yet, oldest first
	last    uint64    // snapshot xmin of the last good reading
	// first is the WAL position read before the first reading, which found
	// every mapped column: a Relation message of a transaction committed
	// before it describes the table as it was, not as it is.
	first lsn.LSN

	verified atomic.Uint64 // position up to which membership held
	xmin     atomic.Uint64 // snapshot xmin of the reading behind verified
}

// reading is a good membership reading and when it was taken.
type reading struct {
	replication.Snapshot
	at time.Time
	// before is the snapshot xmin of the reading taken just before this
	// one. A transaction that committed between this reading's Before and
	// its snapshot can be below its own xmin, but was running at (or began
	// after) the one before: the gap's rows are bounded by that xmin.
	before uint64
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
	g.start, g.first = s.Membership, s.Before
	g.pending = []reading{{s, time.Now(), s.Xmin}}
	g.last = s.Xmin
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
	g.vouch(reading{s, time.Now(), g.last})
	g.last = s.Xmin
	return "", false
}

// vouch adds a good reading and moves the verified position. A reading
// vouches for its own position only once no commit written before it can
// have been invisible to it: once every transaction running at it has
// ended, seen by a later good reading (a commit record is written before
// the transaction stops running, so a commit before Before that the reading
// did not see was one of its running transactions). The outbox was in the
// stream at every good reading, and a removal between two of them shows in
// the later one, so the position is then safe.
func (g *guard) vouch(r reading) {
	best := -1
	for i, p := range g.pending {
		if p.Settled(r.Snapshot) || r.at.Sub(p.at) >= guardMargin {
			best = i
		}
	}
	if best >= 0 {
		g.advance(g.pending[best])
		g.pending = g.pending[best+1:]
	}
	if len(r.Running) == 0 { // nothing could be in flight: vouches for itself
		g.advance(r)
		g.pending = g.pending[:0]
		return
	}
	if len(g.pending) == maxPending {
		g.pending = g.pending[1:]
	}
	g.pending = append(g.pending, r)
}

func (g *guard) advance(r reading) {
	if r.Before > g.Verified() {
		g.xmin.Store(min(r.Xmin, r.before))
		g.verified.Store(uint64(r.Before))
	}
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
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			// Read often only while acknowledged positions wait for it.
			if p.tracker.Acked() <= g.Verified() && now.Sub(last) < guardIdleInterval {
				continue
			}
			last = now
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
	err := replication.LeftStreamError(p.cfg.Source, why, verified, p.cfg.Checkpoints != nil)
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
	if p.guard != nil {
		a = min(a, p.guard.Verified())
	}
	return a
}

// finalPause spaces the readings of the final check.
const finalPause = 20 * time.Millisecond

// finalCheck runs when the stream no longer reads, so that a clean stop
// confirms everything acknowledged instead of what the periodic readings
// vouched for so far: it reads until the acknowledged watermark is vouched
// for (at most guardMargin and a little). It returns the error for an outbox
// found outside the stream (the gap is recorded), nil otherwise.
func (p *Pipeline) finalCheck(ctx context.Context) error {
	g := p.guard
	if g == nil || p.gap.Load() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	deadline := time.Now().Add(guardMargin + 200*time.Millisecond)
	for g.Verified() < p.tracker.Acked() && time.Now().Before(deadline) {
		if why, gap := g.check(ctx); gap {
			return p.failGap(why, g.Verified(), g.xmin.Load())
		}
		time.Sleep(finalPause)
	}
	return nil
}
