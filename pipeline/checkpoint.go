package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// checkpointer saves the checkpoint: before the stream starts
// (beforeStream), every checkpointInterval (loop), at a clean stop
// (quiesce) and last at the shutdown, one at a time (the loop ends before
// the shutdown saves). What a save records is read from the run: the
// positions, the guard's stream state, the repair's gap (repair.toSave).
type checkpointer struct {
	p     *Pipeline // read-only: the positions, the guard, the repair, the metrics
	store *offsets.Stamped
}

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

func (k *checkpointer) loop(ctx context.Context) {
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	saved := k.p.plan.stream.StartLSN
	acks := k.p.prog.events.Load() // events acknowledged so far, in every mode
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
			n := k.p.prog.events.Load()
			events := n != acks
			if !events && !trailing && now.Sub(last) < idleCheckpointInterval {
				continue
			}
			// A save that only records a later bound (boundMoved)
			// counts too: its own transaction moves the bound again.
			if s, r := k.saveAs(ctx, saved, false, false); r == saveDone || r == saveStale {
				saved, acks, last, trailing = s, n, now, events && s != saved
			}
		}
	}
}

// save saves the watermark if it moved past saved and past where
// this process started, and returns the position now saved. A failure is
// counted and logged; it costs duplicates after a PostgreSQL crash, never
// events, so streaming goes on.
func (k *checkpointer) save(ctx context.Context, saved lsn.LSN) lsn.LSN {
	s, _ := k.saveAs(ctx, saved, false, false)
	return s
}

// saveAs saves, also when the position did not move if force;
// clean marks the save of a clean stop (quiesce).
func (k *checkpointer) saveAs(ctx context.Context, saved lsn.LSN, force, clean bool) (lsn.LSN, saveResult) {
	if !k.p.prog.snapDone.Load() {
		return saved, saveSkipped // the snapshot's start marker stays until it is done
	}
	// Up to the start position nothing was streamed by this process: a
	// standby still waiting for the slot would save a position older than
	// the active connector's.
	// (In exactly_once the stream starts there too, below the position
	// committed to Kafka: the hold keeps the checkpoint back, hold.go.)
	saved = max(saved, k.p.plan.stream.StartLSN)
	// Never a position the guard has not vouched for: a restart skips what
	// lies below the checkpoint.
	pr := k.p.history.proven()
	a := min(k.p.confirmable(), k.p.b.holdAt(), pr.at)
	gap, gapChanged := k.p.rep.toSave(a, k.p.b.freezer())
	if a <= saved && !gapChanged && !force && !k.boundMoved() {
		return saved, saveSkipped
	}
	a = max(a, saved) // a gap is recorded even when the position did not move
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := offsets.Checkpoint{LSN: a, SnapshotDone: true, Clean: clean}
	if pr.mark != 0 && pr.at >= a {
		c.Mark, c.MarkAt = pr.mark, pr.at
	}
	if at, ok := k.p.proc.commits.Before(a); ok {
		c.CommitTime = at
	} else if last, ok := k.store.Held(); ok && last.LSN <= a {
		c.CommitTime = last.CommitTime // older, so still a lower bound
	}
	if gap != nil {
		c.Gap = new(*gap)
	}
	k.streamed(&c)
	err := k.store.Save(ctx, c)
	if err == nil || errors.Is(err, offsets.ErrStale) {
		k.p.rep.wasSaved(gap)
	}
	switch {
	case errors.Is(err, offsets.ErrStale):
		k.p.log.Debug("checkpoint not saved: another connector on the slot saved a later one", "lsn", a)
		return a, saveStale
	case err != nil:
		if ctx.Err() == nil {
			k.p.m.CheckpointErrors.Inc()
			k.p.log.Error("save checkpoint", "lsn", a, "err", err)
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

// beforeStream saves the checkpoint with the stream state this run
// streams with, before the stream starts, when the trusted checkpoint has
// none, or the start found a change while stopped and placed a gap.
// Without it a kill before the first periodic save would let the next start
// miss a change (no state to compare), or find the same change again and
// repair it a second time. In exactly_once that second repair publishes
// its rows again (the repair's own rows are never decoded), so the stream
// waits until the save succeeds; in at_least_once it costs copies only.
// A later checkpoint another connector saved meanwhile (it streamed after
// this one loaded) is refused as stale: in exactly_once with a change the
// start was decided from an old one, and the run stops so that a restart
// decides again. It returns on a stop (ctx) too.
func (k *checkpointer) beforeStream(ctx context.Context, pl *plan) error {
	if pl.checkpoints == nil || pl.guard == nil || (pl.trusted != nil && len(pl.trusted.Stream) > 0 && !pl.changed) {
		return nil
	}
	for n := 0; ; n++ {
		_, r := k.saveAs(ctx, 0, true, false)
		if k.p.cfg.ExactlyOnce == nil || !pl.changed || r == saveDone || r == saveSkipped {
			return nil
		}
		if r == saveStale {
			return fmt.Errorf("exactly_once: another connector saved a later checkpoint while this one started; restart to start from it")
		}
		wait := backoff.Nth(100*time.Millisecond, 5*time.Second, n)
		k.p.log.Warn("the gap found at start is not saved yet; the stream waits for it (exactly_once)", "in", wait)
		if backoff.Sleep(ctx, wait); ctx.Err() != nil {
			return nil
		}
	}
}

// streamed adds to c what the stream's completeness at c.LSN
// depends on.
func (k *checkpointer) streamed(c *offsets.Checkpoint) {
	if g := k.p.plan.guard; g != nil {
		c.Floor, c.Stream = g.floor(c.LSN), g.streamState()
	}
}

// boundMoved reports whether a guard's bound, or the position it belongs
// to (TableStream.Verified), passed the one the checkpoint the store holds
// recorded: the next save records it even when the position did not move.
// In exactly_once the slot is held back for the saved bound (hold.go
// savedStreamXmin), and the position held there moves only once a save
// records a later bound: without this the two wait for each other for
// good. A stalled position with the bound held by a long transaction still
// records where the guard has vouched (stoppedSince); at most one such save
// per idleCheckpointInterval (loop).
func (k *checkpointer) boundMoved() bool {
	g := k.p.plan.guard
	held, ok := k.store.Held()
	if g == nil || !ok {
		return false
	}
	for _, n := range g.streamState() {
		for _, s := range held.Stream {
			if s.Table == n.Table && (n.Xmin > s.Xmin || n.Verified > s.Verified) {
				return true
			}
		}
	}
	return false
}
