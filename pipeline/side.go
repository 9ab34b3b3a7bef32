package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// checkpointInterval is how often a watermark moved by acknowledged events
// is saved. Shorter means fewer duplicates after a PostgreSQL crash, at one
// small write each time.
const checkpointInterval = 200 * time.Millisecond

// idleCheckpointInterval spaces saves of a watermark that only keepalives
// moved. On an idle database each save writes WAL whose keepalive moves the
// watermark again, so saving such moves every 200 ms never stops; they carry
// no events, so saving them late costs no duplicates. This keeps the
// checkpoint near the WAL end (status, lag) at the heartbeat's pace.
const idleCheckpointInterval = 10 * time.Second

func (p *Pipeline) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	saved := p.plan.stream.StartLSN
	acks := p.replayed.Load() // events acknowledged so far, in every mode
	last := time.Now()
	// A save writes WAL, so after one for acknowledged events the keepalive
	// moves the watermark past that write: saving that move once more leaves
	// the checkpoint at the WAL end after a burst; its own echo is not saved.
	trailing := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n := p.replayed.Load()
			events := n != acks
			if !events && !trailing && now.Sub(last) < idleCheckpointInterval {
				continue
			}
			// A save that only records a later bound (streamBoundMoved)
			// counts too: its own transaction moves the bound again.
			if s, r := p.saveCheckpointAs(ctx, saved, false, false); r == saveDone || r == saveStale {
				saved, acks, last, trailing = s, n, now, events && s != saved
			}
		}
	}
}

// saveCheckpoint saves the watermark if it moved past saved and past where
// this process started, and returns the position now saved. A failure is
// counted and logged; it costs duplicates after a PostgreSQL crash, never
// events, so streaming goes on.
func (p *Pipeline) saveCheckpoint(ctx context.Context, saved lsn.LSN) lsn.LSN {
	s, _ := p.saveCheckpointAs(ctx, saved, false, false)
	return s
}

// saveCheckpointAs saves, also when the position did not move if force;
// clean marks the save of a clean stop (quiesce).
func (p *Pipeline) saveCheckpointAs(ctx context.Context, saved lsn.LSN, force, clean bool) (lsn.LSN, saveResult) {
	if !p.snapDone.Load() {
		return saved, saveSkipped // the snapshot's start marker stays until it is done
	}
	// Up to the start position nothing was streamed by this process: a
	// standby still waiting for the slot would save a position older than
	// the active connector's.
	// (In exactly_once the stream starts there too, below the position
	// committed to Kafka: the hold keeps the checkpoint back, hold.go.)
	saved = max(saved, p.plan.stream.StartLSN)
	// Never a position the guard has not vouched for: a restart skips what
	// lies below the checkpoint.
	pr := p.history.proven()
	a := min(p.confirmable(), p.b.holdAt(), pr.at)
	gap, gapChanged := p.rep.toSave(a, p.b.freezer())
	if a <= saved && !gapChanged && !force && !p.streamBoundMoved() {
		return saved, saveSkipped
	}
	a = max(a, saved) // a gap is recorded even when the position did not move
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := offsets.Checkpoint{LSN: a, SnapshotDone: true, Clean: clean}
	if pr.mark != 0 && pr.at >= a {
		c.Mark, c.MarkAt = pr.mark, pr.at
	}
	if at, ok := p.commits.Before(a); ok {
		c.CommitTime = at
	} else if last, ok := p.plan.checkpoints.Held(); ok && last.LSN <= a {
		c.CommitTime = last.CommitTime // older, so still a lower bound
	}
	if gap != nil {
		c.Gap = &offsets.Gap{Since: gap.Since, Xmin: gap.Xmin}
	}
	p.streamedCheckpoint(&c)
	err := p.plan.checkpoints.Save(ctx, c)
	if err == nil || errors.Is(err, offsets.ErrStale) {
		p.rep.wasSaved(gap)
	}
	switch {
	case errors.Is(err, offsets.ErrStale):
		p.log.Debug("checkpoint not saved: another connector on the slot saved a later one", "lsn", a)
		return a, saveStale
	case err != nil:
		if ctx.Err() == nil {
			p.m.CheckpointErrors.Inc()
			p.log.Error("save checkpoint", "lsn", a, "err", err)
		}
		return saved, saveFailed
	}
	return a, saveDone
}

// saveResult is what a save did.
type saveResult int

const (
	saveSkipped saveResult = iota // nothing new to save
	saveFailed                    // the store did not answer, or refused
	saveStale                     // another connector on the slot saved a later checkpoint
	saveDone
)

func (p *Pipeline) progressLoop(ctx context.Context) {
	every(ctx, time.Second, func() { p.plan.progress(p.replayProgress(false)) })
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

func (p *Pipeline) replayProgress(done bool) ReplayProgress {
	return ReplayProgress{From: p.plan.start, To: p.plan.stopAt, At: lsn.LSN(p.replayAt.Load()), Events: p.replayed.Load(), Done: done}
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
	var f *replication.FatalError
	if !errors.As(err, &f) || !slices.Contains([]string{"slot_missing", "slot_invalidated", "slot_or_publication_missing"}, f.Reason) {
		return err
	}
	last, ok := p.held.Held()
	if !ok {
		return err
	}
	return &replication.FatalError{Reason: f.Reason, Err: fmt.Errorf("%w\n%s", err, p.repairCommand(last))}
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
