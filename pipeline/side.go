package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// progress is what a run delivered so far: the snapshot finished, the
// events acknowledged (every mode) and the end of the last transaction
// handed over; a replay reports it (Replay.Progress), the checkpoint loop
// and the history marks wait for events.
type progress struct {
	snapDone atomic.Bool   // setup, or the snapshot at its end
	events   atomic.Int64  // the deliveries' acknowledgements
	at       atomic.Uint64 // the processor, at each commit
}

// report is the replay's progress over pl's range.
func (g *progress) report(pl *plan, done bool) ReplayProgress {
	return ReplayProgress{From: pl.start, To: pl.stopAt, At: lsn.LSN(g.at.Load()), Events: g.events.Load(), Done: done}
}

func (p *Pipeline) progressLoop(ctx context.Context) {
	every(ctx, time.Second, func() { p.plan.progress(p.prog.report(p.plan, false)) })
}

// every runs fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// repairMargin is how much earlier than the last delivered commit the
// printed verify starts: verify selects rows by created_at, which is when
// their transaction began, so a transaction open that long before its commit
// is still covered. An earlier start only costs verify time.
const repairMargin = 5 * time.Minute

// runbook adds to the fatal error for a lost slot (dropped or invalidated)
// what to run once a new slot exists: the events committed after the last
// checkpoint were not delivered and are in the outbox table only.
func (p *Pipeline) runbook(err error) error {
	var f *fault.FatalError
	if !errors.As(err, &f) || !slices.Contains([]string{"slot_missing", "slot_invalidated", "slot_or_publication_missing"}, f.Reason) {
		return err
	}
	last, ok := p.held.Held()
	if !ok {
		return err
	}
	return &fault.FatalError{Reason: f.Reason, Err: fmt.Errorf("%w\n%s", err, p.repairCommand(last))}
}

// repairHold is where a lost slot's rows may begin, for retention: the
// repair command's --since, or every row when the checkpoint records no
// commit time.
func repairHold(c offsets.Checkpoint) time.Time {
	if c.CommitTime.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return c.CommitTime.Add(-repairMargin).UTC()
}

// repairCommand says how to republish what was committed after c.
func (p *Pipeline) repairCommand(c offsets.Checkpoint) string {
	cfg := p.cfg.ConfigPath
	if cfg == "" {
		cfg = "<config file>"
	}
	if c.CommitTime.IsZero() {
		return fmt.Sprintf("the last checkpoint (%v, saved %s) records no commit time: after the connector created a new slot, run "+
			"outbox-cdc verify --config %s --repair --since <a time before the first event you may miss, earlier than %s>",
			c.LSN, c.UpdatedAt.UTC().Format(time.RFC3339), cfg, c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the last delivered transaction (checkpoint %v) committed at %s; events committed after it may be missing "+
		"from Kafka. Once the connector runs again (it creates a new slot), republish them with:\n  outbox-cdc verify --config %s --repair --since %s",
		c.LSN, c.CommitTime.UTC().Format(time.RFC3339Nano), cfg, c.CommitTime.Add(-repairMargin).UTC().Format(time.RFC3339))
}
