package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	saved := p.plan.start
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
			if s := p.saveCheckpoint(ctx, saved); s != saved {
				saved, acks, last, trailing = s, n, now, events
			}
		}
	}
}

// saveCheckpoint saves the watermark if it moved past saved and past where
// this process started, and returns the position now saved. A failure is
// counted and logged; it costs duplicates after a PostgreSQL crash, never
// events, so streaming goes on.
func (p *Pipeline) saveCheckpoint(ctx context.Context, saved lsn.LSN) lsn.LSN {
	if !p.snapDone.Load() {
		return saved // the snapshot's start marker stays until it is done
	}
	// Up to the start position nothing was streamed by this process: a
	// standby still waiting for the slot would save a position older than
	// the active connector's.
	saved = max(saved, p.plan.start)
	// Never a position the guard has not vouched for: a restart skips what
	// lies below the checkpoint.
	a := p.confirmable()
	gap := p.recordedGap(a)
	if a <= saved && gap == p.savedGap {
		return saved
	}
	a = max(a, saved) // a gap is recorded even when the position did not move
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := offsets.Checkpoint{LSN: a, SnapshotDone: true}
	if at, ok := p.commits.before(a); ok {
		c.CommitTime = at
	} else if last, ok := p.lastCkpt.get(); ok && last.LSN <= a {
		c.CommitTime = last.CommitTime // older, so still a lower bound
	}
	if gap != nil {
		c.Gap = &offsets.Gap{Since: gap.Since, Xmin: gap.Xmin}
	}
	err := p.plan.checkpoints.Save(ctx, c)
	if err == nil || errors.Is(err, offsets.ErrStale) {
		p.savedGap = gap
	}
	switch {
	case errors.Is(err, offsets.ErrStale):
		p.log.Debug("checkpoint not saved: another connector on the slot saved a later one", "lsn", a)
		return a
	case err != nil:
		if ctx.Err() == nil {
			p.m.CheckpointErrors.Inc()
			p.log.Error("save checkpoint", "lsn", a, "err", err)
		}
		return saved
	}
	return a
}

// monitor writes heartbeats and reads the slot's statistics.
func (p *Pipeline) monitor(ctx context.Context) {
	var hb <-chan time.Time
	src := p.cfg.Source
	heartbeat := p.cfg.Heartbeat > 0
	if heartbeat && p.plan.standby && src.Primary == nil {
		// A standby writes no WAL: pg_logical_emit_message fails there.
		heartbeat = false
		p.log.Warn("heartbeat disabled: the server is a standby and postgres.primary_dsn is not set; while the outbox is quiet "+
			"the slot does not advance, so the standby keeps WAL and the primary (hot_standby_feedback) keeps catalog rows "+
			"until the next outbox write", "fix", "set postgres.primary_dsn to the primary, where the heartbeat is written")
	}
	if heartbeat {
		t := time.NewTicker(p.cfg.Heartbeat)
		defer t.Stop()
		hb = t.C
	}
	stats := time.NewTicker(p.cfg.MonitorInterval)
	defer stats.Stop()
	beat := replication.NewHeartbeat(src.Writer()) // the primary of a standby
	defer beat.Close()
	warned, hbDenied := false, false
	var fo failoverReport
	p.slotStats(ctx, &warned, &fo)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stats.C:
			p.slotStats(ctx, &warned, &fo)
		case <-hb:
			if hbDenied {
				continue
			}
			// Other failures are transient: the stream reports connection trouble.
			if errors.Is(beat.Beat(ctx), replication.ErrHeartbeatDenied) {
				hbDenied = true
				p.log.Error("heartbeat disabled: the role may not call pg_logical_emit_message; a database without other writes "+
					"will hold WAL until the outbox is written", "fix", "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <role>")
			}
		}
	}
}

// slotStats updates the slot metrics, warns about retained WAL, reports
// whether a standby can take the slot over and stops the connector when
// the slot was invalidated or dropped.
func (p *Pipeline) slotStats(ctx context.Context, warned *bool, fo *failoverReport) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := p.cfg.Source.DB.Slot(ctx, p.cfg.Source.Slot)
	switch {
	case errors.Is(err, replication.ErrNoSlot):
		p.fail(&replication.FatalError{Reason: "slot_missing", Err: fmt.Errorf("replication slot %s was dropped while the connector ran; "+
			"events committed since are not in any stream: restart to recreate it, then reconcile from the last checkpoint", p.cfg.Source.Slot)})
		return
	case err != nil:
		return // transient; the stream reports connection trouble
	}
	p.m.RetainedWAL.Set(float64(info.RetainedBytes()))
	p.m.LagBytes.Set(float64(info.LagBytes())) // its only writer, with status's definition
	p.m.SetWALStatus(info.WALStatus)
	if info.WALStatus == "lost" {
		p.fail(replication.ErrSlotLost(p.cfg.Source.Slot))
		return
	}
	p.failoverStats(ctx, fo)
	if w := p.cfg.RetainedWALWarn; w > 0 {
		if r := info.RetainedBytes(); r > w && !*warned {
			*warned = true
			p.log.Warn("replication slot retains a lot of WAL", "slot", info.Name, "retained_bytes", r, "threshold", w,
				"restart_lsn", info.Restart, "confirmed", info.Confirmed,
				"fix", "check that the connector is streaming and Kafka acknowledges; see docs/operations.md")
		} else if r <= w {
			*warned = false
		}
	}
}

// failoverReport is what the log last said about the slot's failover
// readiness, so a state is logged once, when it is first seen.
type failoverReport struct {
	logged  bool
	ready   bool
	problem string
}

// failoverStats sets the failover-ready gauge (its only writer) and logs
// each change of readiness: a standby that stopped streaming, a slot that
// lost its failover property, or a server too old for failover slots
// (postgres.failover_slot auto), said once.
func (p *Pipeline) failoverStats(ctx context.Context, fo *failoverReport) {
	src := p.cfg.Source
	// A standby's own slot is never a failover slot: synchronization is
	// the primary's (docs/operations.md, "Decoding on a standby").
	if src.Failover == "" || src.Failover == replication.FailoverOff || p.plan.standby {
		p.m.SlotFailoverReady.Set(0)
		return
	}
	f, err := src.DB.Failover(ctx, src.Slot)
	if err != nil {
		return // transient; the stream reports connection trouble
	}
	ready := f.Ready()
	if ready {
		p.m.SlotFailoverReady.Set(1)
	} else {
		p.m.SlotFailoverReady.Set(0)
	}
	problem, fix := f.Problem(src.Slot)
	if fo.logged && fo.ready == ready && fo.problem == problem {
		return
	}
	*fo = failoverReport{logged: true, ready: ready, problem: problem}
	switch {
	case ready:
		p.log.Info("failover slot ready: a standby synchronizes it and receives its changes first", "slot", src.Slot,
			"standby_slots", strings.Join(f.Active, ","))
	case !f.Supported():
		// auto on an older server: on was refused at start.
		p.log.Info("failover slots need PostgreSQL 17; running without one", "slot", src.Slot, "server", f.Version,
			"detail", problem)
	default:
		p.log.Warn("no standby can take the slot over after a failover", "slot", src.Slot, "problem", problem, "fix", fix)
	}
}

func (p *Pipeline) progressLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.plan.progress(p.replayProgress(false))
		}
	}
}

func (p *Pipeline) replayProgress(done bool) ReplayProgress {
	return ReplayProgress{From: p.plan.start, To: p.plan.stopAt, At: lsn.LSN(p.replayAt.Load()), Events: p.replayed.Load(), Done: done}
}
