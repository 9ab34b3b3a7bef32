package pipeline

import (
	"context"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
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
)

// gated confirms no position the guard has not vouched for.
type gated struct {
	replication.Positions
	g *guards
}

func (x gated) Acked() lsn.LSN { return min(x.Positions.Acked(), x.g.Verified()) }

// guardLoop runs the guard until ctx ends or the outbox leaves the stream.
func (p *Pipeline) guardLoop(ctx context.Context, g *guards) {
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
		switch why, gap, src := g.Check(ctx); {
		case gap:
			_ = p.failGap(g, src, why) // reaches Run through fail
			return
		case why != "":
			p.fail(schemaError(why))
			return
		}
	}
}

// failGap stops the connector because the outbox left the stream, and
// records the gap: its position, bound and the transactions that had ended
// before it.
func (p *Pipeline) failGap(g *guards, src replication.Source, why string) error {
	verified := g.Verified()
	p.rep.found(gapInfo{Since: verified, Xmin: g.Xmin(), Finished: g.finished(verified)})
	err := replication.LeftStreamError(src, why, verified, p.plan.checkpoints != nil)
	p.fail(err)
	return err
}

// schemaError is the fatal error for an outbox table that lost a mapped
// column while the connector ran: its rows could only be dead-lettered.
func schemaError(problem string) error {
	return &fault.FatalError{Reason: "schema_mismatch", Err: &fault.PrerequisiteError{
		Problem: problem + " while the connector ran; nothing after the last complete transaction was confirmed",
		Fix: "restore the column (ALTER TABLE ... ADD COLUMN) or map another one under outbox.columns, and restart; " +
			"rows written while it was missing then go to the dead-letter topic with the reason",
	}}
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

// finalPause spaces the readings of the final check.
const finalPause = 20 * time.Millisecond

// finalCheck runs when the stream no longer reads, so that a clean stop
// confirms everything acknowledged instead of what the periodic readings
// vouched for so far: it reads until the acknowledged watermark is vouched
// for (at most GuardMargin and a little). It returns the error for an outbox
// found outside the stream (the gap is recorded), nil otherwise.
func (p *Pipeline) finalCheck(ctx context.Context) error {
	g := p.plan.guard
	if g == nil || p.rep.open() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	deadline := time.Now().Add(replication.GuardMargin + 200*time.Millisecond)
	for g.Verified() < p.tracker.Acked() && time.Now().Before(deadline) {
		if why, gap, src := g.Check(ctx); gap {
			return p.failGap(g, src, why)
		}
		time.Sleep(finalPause)
	}
	return nil
}
