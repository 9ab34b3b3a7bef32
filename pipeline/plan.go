package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
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
	// snapshotRedo: an interrupted snapshot is taken again; in
	// exactly_once its rows are first looked up in Kafka (readback.go).
	snapshotRedo bool
	// snapshotAt is the time the snapshot's records carry (and a
	// CloudEvent's time): the first attempt's, kept in the snapshot marker
	// (its commit_time), so that a snapshot taken again makes the same
	// records and the read-back finds them.
	snapshotAt time.Time
	// changed: the start found the publication changed since the trusted
	// checkpoint (repair.decide); the gap it placed is saved
	// before the stream starts.
	changed bool
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
	// readings are what the start is decided from (start.go).
	readings startReadings
	// marks are the history marks (replication/marks.go); nil when the
	// server decodes none (PostgreSQL 13).
	marks *replication.Marks
	// positionKey is exactly_once's position record key, for a refusal.
	positionKey string
	// trusted is the checkpoint the run continues from; nil when none (a
	// first run, a slot this run created).
	trusted *offsets.Checkpoint
}

// starter decides the run's plan: it checks the server, sets up the slot,
// loads and judges the checkpoint, opens the sink and decides the start,
// once, before any of the run's goroutines starts. It writes what the run
// then reads: the plan, the history, the checkpoint store, the boundary,
// the repair's decision (repair.go).
type starter struct {
	p   *Pipeline
	srv *replication.Server // the server as identify read it, once per start
}

// identify reads the server's identity once per start: the checkpoint is
// judged by it (loadCheckpoint), and the source key (sourceKey) and
// exactly_once's first timeline are taken from it. exactly_once's trust in
// its committed position reads the server again after the fence (newSink):
// an instance still alive may commit positions past this reading until
// then.
func (su *starter) identify(ctx context.Context) (replication.Server, error) {
	if su.srv == nil {
		srv, err := su.p.cfg.Source.DB.Identify(ctx)
		if err != nil {
			return replication.Server{}, err
		}
		su.srv = &srv
	}
	return *su.srv, nil
}

// sourceKey names a source (cluster, database, slot) on the connector's
// own topics: exactly_once's positions and the quarantine state.
func sourceKey(srv replication.Server, slot string) string {
	return exactlyonce.PositionKey(srv.SystemID, srv.Database, slot)
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

// resolve sets up the slot for the mode and returns the plan; the start
// position is decided later, once (decideStart), when exactly_once has
// read its committed position.
func (su *starter) resolve(ctx context.Context) (*plan, error) {
	p := su.p
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
		p.history = newHistory(nil)
		return pl, su.setupReplay(ctx, pl)
	}
	if p.cfg.ExactlyOnce != nil {
		// A standby instance waits before it reads anything: a checkpoint
		// loaded while another instance streams is stale by the time this
		// one takes over, and the start is decided from it.
		if err := su.waitSlotFree(ctx); err != nil {
			return nil, fmt.Errorf("exactly_once: %w", err)
		}
	}
	if err := su.setup(ctx, pl); err != nil {
		return nil, err
	}
	pl.stream.Standby = pl.standby
	if pl.marks != nil {
		pl.stream.MarksTable = pl.marks.Table()
	}
	return pl, nil
}

// begin decides where the run starts, from the readings setup and (in
// exactly_once) the sink took, logs it once, and opens the guard at the
// stream's start.
func (su *starter) begin(ctx context.Context, pl *plan) error {
	p := su.p
	if p.cfg.Replay != nil {
		return nil // the range is the start (setupReplay)
	}
	st, err := decideStart(pl.readings)
	if err != nil {
		return su.refuseStart(pl, err)
	}
	pl.start, pl.stream.StartLSN = st.skip, st.stream
	fr := pl.readings.fresh
	p.history.start(st.proof, proof{mark: fr.id, at: fr.at}, pl.readings.ckptMark.id, pl.readings.committedMark.id)
	// The first session checks the run's own mark: what it decodes up to
	// there is proven by it (history.fresh).
	pl.stream.FirstMark = fr.id
	e, _ := p.b.(*eos) // nil: at_least_once
	if st.readBack {
		e.startReadBack(ctx, st.proof.commit)
	}
	su.logStart(pl.readings, st)
	g, err := newGuards(ctx, p.cfg.Source, st.stream)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	pl.guard, pl.schemaFrom, pl.relIDs = g, g.schemaFrom(), g.relIDs()
	p.rep.floor = g.Xmin
	var ch *stoppedChange
	if c := pl.trusted; c != nil {
		g.seedFloor(c.LSN, c.Floor)
		ch = changeWhileStopped(pl, c, e != nil)
	}
	placed, lookUp := p.rep.decide(pl.readings.committed, ch)
	pl.changed = placed
	if e != nil {
		if lookUp {
			e.startReadBack(ctx, time.Time{})
		}
		e.started(st.stream, st.skip)
	}
	return nil
}

// loaded is the checkpoint as setup found it.
type loaded struct {
	ckpt   offsets.Checkpoint
	have   bool // a checkpoint this run trusts so far
	srv    replication.Server
	forget string // how to forget it (the store's runbook)
	// moved: the checkpoint is of another cluster that held this very
	// database (pg_upgrade, movedDatabase): its positions mean nothing here.
	moved bool
}

// setup loads the checkpoint and checks it belongs to this server and slot,
// prepares the slot (and, on its creation in snapshot mode, its exported
// snapshot) and records the readings the start is decided from.
func (su *starter) setup(ctx context.Context, pl *plan) error {
	p := su.p
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
	l, err := su.loadCheckpoint(ctx, pl)
	if err != nil {
		return err
	}
	if err := su.prepareMarks(ctx, pl); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	pending := p.cfg.Snapshot == "pending"
	hadSnapshot := l.have && l.ckpt.SnapshotDone
	if pending {
		if err := su.prepareSnapshot(ctx, pl, &l); err != nil {
			return err
		}
	} else if l.have && !l.ckpt.SnapshotDone {
		p.log.Warn("the checkpoint records an unfinished initial snapshot, which snapshot.mode none does not take again", "slot", src.Slot)
	}
	if standby {
		su.logStandbySlot(ctx)
	}
	res, err := replication.Setup(ctx, src, pending)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	pl.snapshot = res.Snapshot
	if res.Created && pl.readings.fresh.id != 0 {
		// The slot starts past the mark written before it: one more, so
		// that the run's first positions are proven from the start.
		if err := su.freshMark(ctx, pl); err != nil {
			pl.close(ctx)
			return fmt.Errorf("setup: %w", err)
		}
	}
	if err := su.useCheckpoint(ctx, pl, res, &l); err != nil {
		pl.close(ctx)
		return err
	}
	if pending && res.Snapshot == nil && !hadSnapshot {
		p.log.Info("snapshot.mode pending applies when the slot is created; the slot exists, streaming from it", "slot", src.Slot)
	}
	// Only a snapshot taken now decides it: never an older checkpoint's flag.
	p.prog.snapDone.Store(res.Snapshot == nil)
	pl.readings.slot, pl.readings.created = res.Confirmed, res.Created
	if l.have {
		pl.readings.ckpt = l.ckpt.LSN
		if pl.readings.ckptMark, err = readMark(ctx, pl, l.ckpt.Mark, l.ckpt.MarkAt, time.Time{}); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	return nil
}

// loadCheckpoint loads the checkpoint, refuses one of another server or
// slot before the slot is touched (a refused start changes nothing), and
// sets up the plan's store.
func (su *starter) loadCheckpoint(ctx context.Context, pl *plan) (loaded, error) {
	p := su.p
	var l loaded
	store, src := p.cfg.Checkpoints, p.cfg.Source
	if store == nil {
		return l, nil
	}
	c, err := store.Load(ctx)
	switch {
	case err == nil:
		l.ckpt, l.have = c, true
	case !errors.Is(err, offsets.ErrNoCheckpoint):
		return l, fmt.Errorf("load checkpoint: %w", err)
	}
	if l.srv, err = su.identify(ctx); err != nil {
		return l, fmt.Errorf("setup: %w", err)
	}
	l.forget = store.Forget()
	if l.have {
		if err := replication.ForeignCheckpoint(l.ckpt, l.srv, src.Slot, l.forget); err != nil {
			if l.moved, _ = su.movedDatabase(ctx, l); !l.moved {
				return l, err
			}
		}
	}
	// The one writer of checkpoint_lsn: the position the store holds.
	pl.checkpoints = offsets.NewStamped(store, offsets.Identity{SystemID: l.srv.SystemID, Timeline: l.srv.Timeline,
		Database: l.srv.Database, Slot: src.Slot}, func(c offsets.Checkpoint) { p.m.CheckpointLSN.Set(float64(c.LSN)) })
	p.held = pl.checkpoints
	if l.have {
		pl.checkpoints.Holds(l.ckpt)
	}
	return l, nil
}

// prepareSnapshot, in snapshot.mode pending: a slot left by a run that died
// inside the initial snapshot is dropped, and when the slot is to be
// created the snapshot's order is checked and its marker saved first.
func (su *starter) prepareSnapshot(ctx context.Context, pl *plan, l *loaded) error {
	p := su.p
	src := p.cfg.Source
	_, err := src.DB.Slot(ctx, src.Slot)
	missing := errors.Is(err, replication.ErrNoSlot)
	if err != nil && !missing {
		return fmt.Errorf("setup: %w", err)
	}
	// Millisecond precision: the marker's store and a record's timestamp
	// keep it whole.
	pl.snapshotAt = time.Now().UTC().Truncate(time.Millisecond)
	if l.have && !l.ckpt.SnapshotDone {
		// Its rows may be in Kafka in part, slot or no slot.
		pl.snapshotRedo = true
		if !l.ckpt.CommitTime.IsZero() {
			pl.snapshotAt = l.ckpt.CommitTime.UTC()
		}
	}
	if !missing && l.have && !l.ckpt.SnapshotDone {
		// The last run died inside the initial snapshot, whose exported
		// snapshot is gone: start over with a new slot and a new snapshot.
		p.log.Warn("initial snapshot did not finish; recreating the slot to take it again", "slot", src.Slot)
		if err := src.DB.DropSlot(ctx, src.Slot); err != nil {
			return fmt.Errorf("redo snapshot: %w", err)
		}
		missing = true
	}
	if !missing {
		return nil
	}
	for _, t := range src.Tables() {
		if err := t.CheckSnapshotOrder(ctx, p.cfg.SnapshotOrderBy); err != nil {
			return err
		}
	}
	if l.have {
		p.log.Warn("ignoring the checkpoint: the slot is missing, so this run creates it and takes the snapshot",
			"checkpoint", l.ckpt.LSN, "snapshot_done", l.ckpt.SnapshotDone, "slot", src.Slot)
		l.have = false
	}
	if pl.checkpoints != nil {
		// The "snapshot started" marker is durable before the slot exists,
		// so a crash at any later point takes it again.
		if err := pl.checkpoints.Replace(ctx, offsets.Checkpoint{LSN: l.srv.WALEnd, CommitTime: pl.snapshotAt}); err != nil {
			return fmt.Errorf("save snapshot marker: %w", err)
		}
	}
	return nil
}

// logStandbySlot says what creating the slot on a standby waits for.
func (su *starter) logStandbySlot(ctx context.Context) {
	p := su.p
	src := p.cfg.Source
	if _, err := src.DB.Slot(ctx, src.Slot); !errors.Is(err, replication.ErrNoSlot) {
		return
	}
	if src.Primary != nil {
		p.log.Info("creating the slot on the standby; it waits for a snapshot of running transactions from the primary, "+
			"which pg_log_standby_snapshot() on the primary writes now", "slot", src.Slot)
		return
	}
	p.log.Warn("creating the slot on the standby waits for a snapshot of running transactions from the primary, "+
		"written at the primary's next checkpoint or snapshot (seconds, or minutes on an idle primary); "+
		"set postgres.primary_dsn to have the connector request one", "slot", src.Slot)
}

// useCheckpoint decides whether the checkpoint counts once the slot is set
// up: not for a slot this run created (overwritten), and only when the
// server can have reached it (replication.CheckPosition). A gap it
// records is repaired by this run.
func (su *starter) useCheckpoint(ctx context.Context, pl *plan, res replication.SetupResult, l *loaded) error {
	p := su.p
	src := p.cfg.Source
	if l.have && l.moved {
		return su.useMovedCheckpoint(ctx, pl, res, l)
	}
	if res.Created && l.have {
		// A new slot is a new stream: a position saved for another one must
		// not skip any of it. The rows it did not stream are in the table
		// only: retention keeps them until verify --repair has run.
		hold, stored, err := p.ret.lostSlotHold(ctx, l.ckpt)
		if err != nil {
			return err
		}
		p.log.Warn("ignoring the checkpoint: the slot was created by this run; overwriting it. If the slot was lost, "+
			"events committed after the checkpoint and before now were not streamed: see repair", "checkpoint", l.ckpt.LSN,
			"slot", src.Slot, "slot_start", res.Confirmed, "repair", p.repairCommand(l.ckpt),
			"retention_keeps_xids_from", hold.From, "retention_keeps_xids_below", hold.Below)
		c := offsets.Checkpoint{LSN: res.Confirmed, SnapshotDone: res.Snapshot == nil}
		if !stored {
			c.RepairSince = offsets.EarliestHold(l.ckpt.RepairSince, repairHold(l.ckpt))
		}
		if err := pl.checkpoints.Replace(ctx, c); err != nil {
			return fmt.Errorf("save checkpoint: %w", err)
		}
		l.have = false
	}
	if l.have && !l.ckpt.RepairSince.IsZero() {
		// A hold by time (an earlier version's, or one its table could not
		// take): every row that exists now is held instead, in the table
		// every instance reads.
		if _, stored, err := p.ret.lostSlotHold(ctx, offsets.Checkpoint{CommitTime: l.ckpt.RepairSince.Add(repairMargin)}); err != nil {
			return err
		} else if stored {
			if _, err := pl.checkpoints.ClearRepair(ctx, l.ckpt.RepairSince); err != nil {
				return fmt.Errorf("move the repair hold: %w", err)
			}
		}
	}
	if !l.have {
		return nil
	}
	ckpt, srv := l.ckpt, l.srv
	if err := replication.CheckPosition(ckpt, srv, l.forget); err != nil {
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
	pl.trusted = &ckpt
	if g := ckpt.Gap; g != nil {
		p.rep.load(*g) // begin decides whether this run repairs it
	}
	return nil
}

// setupReplay checks the range against what the slot retains and points
// the stream at a temporary copy of the slot.
func (su *starter) setupReplay(ctx context.Context, pl *plan) error {
	p := su.p
	r, src := p.cfg.Replay, p.cfg.Source
	info, err := src.DB.Slot(ctx, src.Slot)
	if err != nil {
		return fmt.Errorf("replay: slot %s: %w", src.Slot, err)
	}
	if r.From < info.Confirmed {
		return &fault.PrerequisiteError{
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
	p.prog.snapDone.Store(true)
	return nil
}
