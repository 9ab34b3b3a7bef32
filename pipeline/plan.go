package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// plan is what setup decided, resolved once: the processor, the side loops
// and the shutdown read it and never look at the mode (normal, snapshot,
// replay) again.
type plan struct {
	// start is where this run begins: the tracker's first watermark, where
	// streaming starts, and the position below which transactions were
	// delivered already and are skipped.
	start lsn.LSN
	// stopAt ends a replay at the first transaction committing at or after
	// it (zero: never).
	stopAt      lsn.LSN
	topicPrefix string
	stream      replication.Config
	// snapshot is the new slot's exported snapshot, published before the
	// stream; nil when no snapshot is taken.
	snapshot *replication.ExportedSnapshot
	// backfill repairs a gap recorded in the checkpoint; nil when none.
	backfill *backfill
	// checkpoints stamps this server's identity on what it saves; nil when
	// nothing is saved (checkpoint.store none, replay).
	checkpoints *offsets.Stamped
	// guard keeps the outbox in the stream; nil in replay, where no side
	// loop but the progress report runs.
	guard *guards
	// schemaFrom, per table: a Relation message lacking a mapped column in
	// a transaction committing at or after it is a schema problem (fatal);
	// before it, the table was checked at start and has the column now, so
	// such rows are dead-lettered. Nil in replay.
	schemaFrom []lsn.LSN
	// standby: the server is a hot standby (pg_is_in_recovery() at start);
	// writes (heartbeats) go to Source.Primary, or nowhere without it.
	standby bool
	// relIDs are the outbox tables' OIDs at start (none in replay: matched
	// by name).
	relIDs   []uint32
	progress func(ReplayProgress)
}

// close releases what the plan holds when the run does not start.
func (pl *plan) close(ctx context.Context) {
	if pl.snapshot != nil {
		pl.snapshot.Close(ctx)
	}
	if pl.guard != nil {
		pl.guard.Close()
	}
}

// resolve sets up the slot (and the guard) for the mode and returns the plan.
func (p *Pipeline) resolve(ctx context.Context) (*plan, error) {
	pl := &plan{stream: replication.Config{
		Source:         p.cfg.Source,
		StatusInterval: p.cfg.StatusInterval,
		BackoffMax:     p.cfg.BackoffMax,
		Messages:       p.cfg.MessagePrefix != "",
		QueueBytes:     p.cfg.QueueBytes,
		QueueMessages:  p.cfg.QueueSize,
		ReceiveTimeout: p.cfg.ReceiveTimeout,
	}}
	if p.cfg.Replay != nil {
		return pl, p.setupReplay(ctx, pl)
	}
	if err := p.setup(ctx, pl); err != nil {
		return nil, err
	}
	pl.stream.StartLSN, pl.stream.Standby = pl.start, pl.standby
	g, err := newGuards(ctx, p.cfg.Source, pl.start)
	if err != nil {
		pl.close(ctx)
		return nil, fmt.Errorf("setup: %w", err)
	}
	pl.guard, pl.schemaFrom, pl.relIDs = g, g.schemaFrom(), g.relIDs()
	return pl, nil
}

// setup loads the checkpoint and checks it belongs to this server and slot,
// prepares the slot (and, on its creation in snapshot mode, its exported
// snapshot) and sets the start position.
func (p *Pipeline) setup(ctx context.Context, pl *plan) error {
	src := p.cfg.Source
	if err := replication.Check(ctx, src); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if err := replication.EnsurePublication(ctx, src); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	standby, err := src.DB.InRecovery(ctx)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	pl.standby = standby
	var (
		ckpt     offsets.Checkpoint
		haveCkpt bool
		srv      replication.Server
		forget   string
	)
	if store := p.cfg.Checkpoints; store != nil {
		c, err := store.Load(ctx)
		switch {
		case err == nil:
			ckpt, haveCkpt = c, true
		case !errors.Is(err, offsets.ErrNoCheckpoint):
			return fmt.Errorf("load checkpoint: %w", err)
		}
		if srv, err = src.DB.Identify(ctx); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		forget = store.Forget()
		if haveCkpt {
			// Before the slot is touched: a refused start changes nothing.
			if err := replication.ForeignCheckpoint(ckpt, srv, src.Slot, forget); err != nil {
				return err
			}
		}
		// The one writer of checkpoint_lsn: the position the store holds.
		pl.checkpoints = offsets.NewStamped(store, offsets.Identity{SystemID: srv.SystemID, Timeline: srv.Timeline,
			Database: srv.Database, Slot: src.Slot}, func(c offsets.Checkpoint) { p.m.CheckpointLSN.Set(float64(c.LSN)) })
		p.held = pl.checkpoints
		if haveCkpt {
			pl.checkpoints.Holds(ckpt)
		}
	}
	pending := p.cfg.Snapshot == "pending"
	hadSnapshot := haveCkpt && ckpt.SnapshotDone
	if pending {
		_, err := src.DB.Slot(ctx, src.Slot)
		missing := errors.Is(err, replication.ErrNoSlot)
		if err != nil && !missing {
			return fmt.Errorf("setup: %w", err)
		}
		if !missing && haveCkpt && !ckpt.SnapshotDone {
			// The last run died inside the initial snapshot, whose exported
			// snapshot is gone: start over with a new slot and a new snapshot.
			p.log.Warn("initial snapshot did not finish; recreating the slot to take it again", "slot", src.Slot)
			if err := src.DB.DropSlot(ctx, src.Slot); err != nil {
				return fmt.Errorf("redo snapshot: %w", err)
			}
			missing = true
		}
		if missing {
			for _, t := range src.Tables() {
				if err := t.CheckSnapshotOrder(ctx, p.cfg.SnapshotOrderBy); err != nil {
					return err
				}
			}
			if haveCkpt {
				p.log.Warn("ignoring the checkpoint: the slot is missing, so this run creates it and takes the snapshot",
					"checkpoint", ckpt.LSN, "snapshot_done", ckpt.SnapshotDone, "slot", src.Slot)
				haveCkpt = false
			}
			if pl.checkpoints != nil {
				// The "snapshot started" marker is durable before the slot
				// exists, so a crash at any later point takes it again.
				if err := pl.checkpoints.Replace(ctx, offsets.Checkpoint{LSN: srv.WALEnd}); err != nil {
					return fmt.Errorf("save snapshot marker: %w", err)
				}
			}
		}
	} else if haveCkpt && !ckpt.SnapshotDone {
		p.log.Warn("the checkpoint records an unfinished initial snapshot, which snapshot.mode none does not take again", "slot", src.Slot)
	}
	if standby {
		if _, err := src.DB.Slot(ctx, src.Slot); errors.Is(err, replication.ErrNoSlot) {
			if src.Primary != nil {
				p.log.Info("creating the slot on the standby; it waits for a snapshot of running transactions from the primary, "+
					"which pg_log_standby_snapshot() on the primary writes now", "slot", src.Slot)
			} else {
				p.log.Warn("creating the slot on the standby waits for a snapshot of running transactions from the primary, "+
					"written at the primary's next checkpoint or snapshot (seconds, or minutes on an idle primary); "+
					"set postgres.primary_dsn to have the connector request one", "slot", src.Slot)
			}
		}
	}
	res, err := replication.Setup(ctx, src, pending)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	pl.snapshot = res.Snapshot
	if res.Created && haveCkpt {
		// A new slot is a new stream: a position saved for another one must
		// not skip any of it.
		p.log.Warn("ignoring the checkpoint: the slot was created by this run; overwriting it. If the slot was lost, "+
			"events committed after the checkpoint and before now were not streamed: see repair", "checkpoint", ckpt.LSN,
			"slot", src.Slot, "slot_start", res.Confirmed, "repair", p.repairCommand(ckpt))
		if err := pl.checkpoints.Replace(ctx, offsets.Checkpoint{LSN: res.Confirmed, SnapshotDone: res.Snapshot == nil}); err != nil {
			pl.close(ctx)
			return fmt.Errorf("save checkpoint: %w", err)
		}
		haveCkpt = false
	}
	if haveCkpt {
		if err := replication.CheckPosition(ckpt, srv, forget); err != nil {
			pl.close(ctx)
			return err
		}
		switch {
		case ckpt.IsZero():
			p.log.Warn("the checkpoint has no server identity (written by an older version); trusting it as it lies within this server's WAL; "+
				"the next save records the identity", "checkpoint", ckpt.LSN, "wal_end", srv.WALEnd)
		case ckpt.Timeline != srv.Timeline:
			p.log.Info("the checkpoint is from an earlier timeline, before this server's history left it", "checkpoint", ckpt.LSN,
				"checkpoint_timeline", ckpt.Timeline, "timeline", srv.Timeline)
		}
		if g := ckpt.Gap; g != nil {
			p.log.Warn("the outbox table was outside the stream when the connector stopped: its rows written since are read "+
				"from the table when the stream reaches the gap", "since", g.Since, "xmin", g.Xmin)
			gi := &gapInfo{Since: g.Since, Xmin: g.Xmin}
			p.gap.Store(gi)
			p.savedGap, p.loadedGap = gi, gi
			pl.backfill = newBackfill(*gi)
			p.repairPending.Store(true)
		}
	}
	if pending && res.Snapshot == nil && !hadSnapshot {
		p.log.Info("snapshot.mode pending applies when the slot is created; the slot exists, streaming from it", "slot", src.Slot)
	}
	// Only a snapshot taken now decides it: never an older checkpoint's flag.
	p.snapDone.Store(res.Snapshot == nil)
	pl.start = res.Confirmed
	if haveCkpt && ckpt.LSN > pl.start {
		// The slot went back (PostgreSQL crash, or the replay window): what
		// lies between was acknowledged already.
		p.log.Info("resuming after the checkpoint", "checkpoint", ckpt.LSN, "slot_confirmed", res.Confirmed)
		pl.start = ckpt.LSN
	}
	return nil
}

// setupReplay checks the range against what the slot retains and points
// the stream at a temporary copy of the slot.
func (p *Pipeline) setupReplay(ctx context.Context, pl *plan) error {
	r, src := p.cfg.Replay, p.cfg.Source
	info, err := src.DB.Slot(ctx, src.Slot)
	if err != nil {
		return fmt.Errorf("replay: slot %s: %w", src.Slot, err)
	}
	if r.From < info.Confirmed {
		return &replication.PrerequisiteError{
			Problem: fmt.Sprintf("LSN %v is older than what slot %s retains", r.From, src.Slot),
			Fix:     fmt.Sprintf("the oldest replayable LSN is %v; keep a longer window with postgres.retain", info.Confirmed),
		}
	}
	if r.To == 0 {
		r.To = info.CurrentWAL
	}
	if r.To <= r.From {
		return fmt.Errorf("replay: --to-lsn %v is not after --from-lsn %v", r.To, r.From)
	}
	pl.stream.CopyOf = src.Slot
	pl.stream.Slot = fmt.Sprintf("%s_replay_%d", src.Slot, time.Now().UnixNano()%1_000_000)
	pl.start, pl.stream.StartLSN, pl.stopAt = r.From, r.From, r.To
	pl.topicPrefix, pl.progress = r.TopicPrefix, r.Progress
	p.snapDone.Store(true)
	return nil
}
