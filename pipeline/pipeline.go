// Package pipeline wires the connector: replication stream → decoder →
// router → sink, with the offsets tracker gating what is confirmed.
//
// Two goroutines run while the connector streams: the stream (owner of the
// PostgreSQL connection) and the processor (owner of the decoder, router and
// the tracker's write side). Broker acknowledgements arrive on franz-go's
// goroutines and only touch the tracker and the metrics. A checkpoint loop
// and a monitor (heartbeat, slot statistics) run beside them.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// CheckpointStore saves the acknowledged position durably.
type CheckpointStore interface {
	Load(ctx context.Context) (offsets.Checkpoint, error)
	// Save stores c unless a later position of the same identity is stored
	// (offsets.ErrStale): another connector on the slot saved it.
	Save(ctx context.Context, c offsets.Checkpoint) error
	// Replace stores c whatever is stored: a new slot or snapshot starts over.
	Replace(ctx context.Context, c offsets.Checkpoint) error
	// Forget tells an operator how to drop the checkpoint (SQL, or a file).
	Forget() string
	Close()
}

// Config is everything the pipeline needs, already validated.
type Config struct {
	Source         replication.Source
	Mapping        decode.Mapping
	Routes         router.Config
	Sink           sink.Config
	StatusInterval time.Duration
	BackoffMax     time.Duration
	// DrainTimeout bounds how long a clean stop waits for in-flight records.
	DrainTimeout time.Duration
	// QueueSize is how many WAL messages may wait between the stream and the
	// processor.
	QueueSize int
	// QueueBytes bounds the WAL data in that queue (0: 64 MiB).
	QueueBytes int64
	// ReceiveTimeout ends a silent replication connection (0: 60s).
	ReceiveTimeout time.Duration

	// Checkpoints is nil when checkpoint.store is none.
	Checkpoints CheckpointStore
	// RetainFor / RetainBytes hold the confirmed position back (replay window).
	RetainFor   time.Duration
	RetainBytes int64
	// Heartbeat is the interval of the non-transactional heartbeat message.
	Heartbeat time.Duration
	// MonitorInterval is how often slot statistics are read (default 10s).
	MonitorInterval time.Duration
	// RetainedWALWarn logs a warning above this many retained bytes.
	RetainedWALWarn int64
	// MessagePrefix enables the table-less outbox.
	MessagePrefix string
	// Snapshot is "pending" to publish existing rows when the slot is created.
	Snapshot       string
	SnapshotFilter string
	// SnapshotOrderBy is a column the snapshot is ordered by before the
	// primary key ("": the primary key alone).
	SnapshotOrderBy string

	// Replay, when set, turns the pipeline into a one-shot replay.
	Replay *Replay

	// GuardInterval is how often the outbox's publication membership and
	// columns are checked (default 1s); confirmation trails by up to two.
	GuardInterval time.Duration
}

// Replay publishes again what was committed in [From, To).
type Replay struct {
	From, To    lsn.LSN // To zero: the server's WAL position at start
	TopicPrefix string
	// Progress, when set, is called about once a second and at the end.
	Progress func(ReplayProgress)
}

// ReplayProgress reports a running replay.
type ReplayProgress struct {
	From, To, At lsn.LSN
	Events       int64
	Done         bool
}

// Pipeline is one running connector.
type Pipeline struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics

	router  *router.Router
	tracker *offsets.Tracker
	sink    *sink.Sink

	skipBelow lsn.LSN // transactions committed before this were delivered already
	snapDone  atomic.Bool
	replayed  atomic.Int64
	replayAt  atomic.Uint64

	streaming atomic.Bool
	guard     *guard                  // nil in replay
	gap       atomic.Pointer[gapInfo] // a gap not yet repaired: recorded in every checkpoint
	gapClear  atomic.Uint64           // set once the backfill ran: the gap is repaired past it
	bf        *backfill               // the processor's repair of a recorded gap
	savedGap  *gapInfo                // the gap in the last checkpoint saved (checkpoint writers only)
	fatalOnce sync.Once
	fatal     chan error
	ready     chan struct{}
}

// New validates the routing rules; Run does the rest.
func New(cfg Config, m *metrics.Metrics, log *slog.Logger) (*Pipeline, error) {
	r, err := router.New(cfg.Routes)
	if err != nil {
		return nil, err
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.MonitorInterval <= 0 {
		cfg.MonitorInterval = 10 * time.Second
	}
	if cfg.GuardInterval <= 0 {
		cfg.GuardInterval = defaultGuardInterval
	}
	return &Pipeline{cfg: cfg, log: log, m: m, router: r, fatal: make(chan error, 1), ready: make(chan struct{})}, nil
}

// Ready is closed once the slot is set up and streaming has started.
func (p *Pipeline) Ready() <-chan struct{} { return p.ready }

// Streaming reports whether the replication connection is up.
func (p *Pipeline) Streaming() bool { return p.streaming.Load() }

// errReplayDone ends the processor when a replay reached its end.
var errReplayDone = errors.New("replay reached its end")

// Run sets up the slot and streams until ctx ends, then stops reading,
// drains in-flight records, confirms the watermark and returns nil; or it
// returns the first fatal error. In replay mode it returns once the range is
// published and acknowledged.
func (p *Pipeline) Run(ctx context.Context) error {
	streamCfg := replication.Config{
		Source:         p.cfg.Source,
		StatusInterval: p.cfg.StatusInterval,
		BackoffMax:     p.cfg.BackoffMax,
		Messages:       p.cfg.MessagePrefix != "",
		QueueBytes:     p.cfg.QueueBytes,
		ReceiveTimeout: p.cfg.ReceiveTimeout,
	}
	var (
		start lsn.LSN
		snap  *replication.ExportedSnapshot
		err   error
	)
	if p.cfg.Replay != nil {
		start, err = p.setupReplay(ctx, &streamCfg)
	} else {
		start, snap, err = p.setup(ctx)
		streamCfg.StartLSN = p.skipBelow
	}
	if err != nil {
		return err
	}
	if p.cfg.Replay == nil {
		if p.guard, err = newGuard(ctx, p.cfg.Source, start); err != nil {
			if snap != nil {
				snap.Close(ctx)
			}
			return fmt.Errorf("setup: %w", err)
		}
		defer p.guard.close()
		p.cfg.Mapping.RelationID = p.guard.start.RelID
	}
	p.tracker = offsets.NewTracker(start)
	p.m.ConfirmedLSN.Set(float64(start))
	p.sink, err = sink.New(p.cfg.Sink, p.log)
	if err != nil {
		if snap != nil {
			snap.Close(ctx)
		}
		return err
	}
	defer p.sink.Close()

	var pos replication.Positions = p.tracker
	if p.cfg.RetainFor > 0 || p.cfg.RetainBytes > 0 {
		pos = &windowed{Tracker: p.tracker, w: offsets.NewWindow(p.cfg.RetainFor, p.cfg.RetainBytes)}
	}
	if p.guard != nil {
		pos = gated{Positions: pos, g: p.guard}
	}
	stream := replication.NewStream(streamCfg, pos, p.m, p.log)
	stream.OnConnected = p.streaming.Store

	// The stream and the producer outlive ctx: they drain after a stop.
	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStream()
	produceCtx, stopProduce := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProduce()
	procCtx, stopProc := context.WithCancel(ctx)
	defer stopProc()

	queue := make(chan replication.Message, p.cfg.QueueSize)
	var wg sync.WaitGroup
	var streamErr, procErr error
	wg.Go(func() {
		streamErr = stream.Run(streamCtx, queue)
		if streamErr != nil {
			p.fail(streamErr)
		}
	})
	procDone := make(chan struct{})
	go func() {
		defer close(procDone)
		procErr = p.process(procCtx, produceCtx, queue, snap)
		if procErr != nil && !errors.Is(procErr, context.Canceled) {
			p.fail(procErr)
		}
	}()
	aux, stopAux := context.WithCancel(context.WithoutCancel(ctx))
	var auxWG sync.WaitGroup
	if p.cfg.Replay == nil {
		if p.cfg.Checkpoints != nil {
			auxWG.Go(func() { p.checkpointLoop(aux) })
		}
		auxWG.Go(func() { p.monitor(aux) })
		auxWG.Go(func() { p.guardLoop(aux, p.guard) })
	} else if p.cfg.Replay.Progress != nil {
		auxWG.Go(func() { p.progressLoop(aux) })
	}
	p.log.Info("connector started", "slot", p.cfg.Source.Slot, "from", start)
	close(p.ready)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-p.fatal:
	}
	if errors.Is(runErr, errReplayDone) {
		runErr = nil
	}
	// The drain deadline runs from the moment the stop begins: the processor
	// may be blocked in Produce on a full buffer with the broker down, and
	// cancelling the produce context is what unblocks it.
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.DrainTimeout)
	defer cancel()
	stopAfterDrain := context.AfterFunc(drainCtx, stopProduce)
	defer stopAfterDrain()
	stream.StopReading()
	stopProc()
	<-procDone

	// Drain: everything produced gets an outcome, so the final confirmation
	// covers as much as possible. A fatal error still drains: acks are acks.
	if err := p.sink.Flush(drainCtx); err != nil {
		p.log.Warn("stopping with records in flight; they will be sent again after restart",
			"inflight", p.tracker.InFlight(), "err", err)
	}
	stopProduce()
	stopAux()
	auxWG.Wait()
	// The stream's last status update and the last checkpoint confirm what
	// the guard vouches for: have it vouch for everything decoded so far.
	if err := p.finalCheck(context.WithoutCancel(ctx)); err != nil && runErr == nil {
		runErr = err
	}
	stopStream()
	wg.Wait()
	if p.cfg.Checkpoints != nil && p.cfg.Replay == nil {
		p.saveCheckpoint(context.WithoutCancel(ctx), 0)
		p.cfg.Checkpoints.Close()
	}
	if r := p.cfg.Replay; r != nil && r.Progress != nil {
		r.Progress(p.replayProgress(runErr == nil))
	}
	p.log.Info("connector stopped", "acknowledged", p.tracker.Acked(), "inflight", p.tracker.InFlight())
	if runErr == nil && streamErr != nil {
		runErr = streamErr
	}
	if runErr == nil && procErr != nil && !errors.Is(procErr, context.Canceled) && !errors.Is(procErr, errReplayDone) {
		runErr = procErr
	}
	if runErr != nil {
		p.m.FatalErrors.WithLabelValues(fatalReason(runErr)).Inc()
	}
	return runErr
}

// fatalReason labels a fatal error for outbox_cdc_fatal_errors_total.
func fatalReason(err error) string {
	var f *replication.FatalError
	var d *deliveryError
	switch {
	case errors.As(err, &f) && f.Reason != "":
		return f.Reason
	case errors.Is(err, decode.ErrTableRenamed):
		return "table_renamed"
	case errors.As(err, &d):
		return "delivery"
	}
	return "other"
}

// deliveryError is a record that could be delivered neither to its topic nor
// to the dead-letter topic.
type deliveryError struct{ err error }

func (e *deliveryError) Error() string { return "deliver event: " + e.err.Error() }
func (e *deliveryError) Unwrap() error { return e.err }

// setup loads the checkpoint and checks it belongs to this server and slot,
// prepares the slot (and, on its creation in snapshot mode, its exported
// snapshot) and returns the start position.
func (p *Pipeline) setup(ctx context.Context) (lsn.LSN, *replication.ExportedSnapshot, error) {
	src := p.cfg.Source
	if err := replication.Check(ctx, src); err != nil {
		return 0, nil, fmt.Errorf("setup: %w", err)
	}
	if err := replication.EnsurePublication(ctx, src); err != nil {
		return 0, nil, fmt.Errorf("setup: %w", err)
	}
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
			return 0, nil, fmt.Errorf("load checkpoint: %w", err)
		}
		if srv, err = replication.Identify(ctx, src.DSN); err != nil {
			return 0, nil, fmt.Errorf("setup: %w", err)
		}
		forget = store.Forget()
		if haveCkpt {
			// Before the slot is touched: a refused start changes nothing.
			if err := foreignCheckpoint(ckpt, srv, src.Slot, forget); err != nil {
				return 0, nil, err
			}
		}
		p.cfg.Checkpoints = identified{store, offsets.Identity{SystemID: srv.SystemID, Timeline: srv.Timeline,
			Database: srv.Database, Slot: src.Slot}}
	}
	pending := p.cfg.Snapshot == "pending"
	hadSnapshot := haveCkpt && ckpt.SnapshotDone
	if pending {
		_, err := replication.Slot(ctx, src.DSN, src.Slot)
		missing := errors.Is(err, replication.ErrNoSlot)
		if err != nil && !missing {
			return 0, nil, fmt.Errorf("setup: %w", err)
		}
		if !missing && haveCkpt && !ckpt.SnapshotDone {
			// The last run died inside the initial snapshot, whose exported
			// snapshot is gone: start over with a new slot and a new snapshot.
			p.log.Warn("initial snapshot did not finish; recreating the slot to take it again", "slot", src.Slot)
			if err := replication.DropSlot(ctx, src.DSN, src.Slot); err != nil {
				return 0, nil, fmt.Errorf("redo snapshot: %w", err)
			}
			missing = true
		}
		if missing {
			if err := p.checkSnapshotOrder(ctx); err != nil {
				return 0, nil, err
			}
			if haveCkpt {
				p.log.Warn("ignoring the checkpoint: the slot is missing, so this run creates it and takes the snapshot",
					"checkpoint", ckpt.LSN, "snapshot_done", ckpt.SnapshotDone, "slot", src.Slot)
				haveCkpt = false
			}
			if p.cfg.Checkpoints != nil {
				// The "snapshot started" marker is durable before the slot
				// exists, so a crash at any later point takes it again.
				if err := p.cfg.Checkpoints.Replace(ctx, offsets.Checkpoint{LSN: srv.WALEnd}); err != nil {
					return 0, nil, fmt.Errorf("save snapshot marker: %w", err)
				}
			}
		}
	} else if haveCkpt && !ckpt.SnapshotDone {
		p.log.Warn("the checkpoint records an unfinished initial snapshot, which snapshot.mode none does not take again", "slot", src.Slot)
	}
	res, err := replication.Setup(ctx, src, pending)
	if err != nil {
		return 0, nil, fmt.Errorf("setup: %w", err)
	}
	closeSnap := func() {
		if res.Snapshot != nil {
			res.Snapshot.Close(ctx)
		}
	}
	if res.Created && haveCkpt {
		// A new slot is a new stream: a position saved for another one must
		// not skip any of it.
		p.log.Warn("ignoring the checkpoint: the slot was created by this run; overwriting it", "checkpoint", ckpt.LSN,
			"slot", src.Slot, "slot_start", res.Confirmed)
		if err := p.cfg.Checkpoints.Replace(ctx, offsets.Checkpoint{LSN: res.Confirmed, SnapshotDone: res.Snapshot == nil}); err != nil {
			closeSnap()
			return 0, nil, fmt.Errorf("save checkpoint: %w", err)
		}
		haveCkpt = false
	}
	if haveCkpt {
		if err := checkPosition(ckpt, srv, forget); err != nil {
			closeSnap()
			return 0, nil, err
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
			p.savedGap = gi
			p.bf = &backfill{gapInfo: *gi}
		}
	}
	if pending && res.Snapshot == nil && !hadSnapshot {
		p.log.Info("snapshot.mode pending applies when the slot is created; the slot exists, streaming from it", "slot", src.Slot)
	}
	// Only a snapshot taken now decides it: never an older checkpoint's flag.
	p.snapDone.Store(res.Snapshot == nil)
	start := res.Confirmed
	if haveCkpt && ckpt.LSN > start {
		// The slot went back (PostgreSQL crash, or the replay window): what
		// lies between was acknowledged already.
		p.log.Info("resuming after the checkpoint", "checkpoint", ckpt.LSN, "slot_confirmed", res.Confirmed)
		start = ckpt.LSN
	}
	p.skipBelow = start
	if haveCkpt {
		p.m.CheckpointLSN.Set(float64(ckpt.LSN))
	}
	return start, res.Snapshot, nil
}

// setupReplay checks the range against what the slot retains and points
// the stream at a temporary copy of the slot.
func (p *Pipeline) setupReplay(ctx context.Context, sc *replication.Config) (lsn.LSN, error) {
	r := p.cfg.Replay
	info, err := replication.Slot(ctx, p.cfg.Source.DSN, p.cfg.Source.Slot)
	if err != nil {
		return 0, fmt.Errorf("replay: slot %s: %w", p.cfg.Source.Slot, err)
	}
	if r.From < info.Confirmed {
		return 0, &replication.PrerequisiteError{
			Problem: fmt.Sprintf("LSN %v is older than what slot %s retains", r.From, p.cfg.Source.Slot),
			Fix:     fmt.Sprintf("the oldest replayable LSN is %v; keep a longer window with postgres.retain", info.Confirmed),
		}
	}
	if r.To == 0 {
		r.To = info.CurrentWAL
	}
	if r.To <= r.From {
		return 0, fmt.Errorf("replay: --to-lsn %v is not after --from-lsn %v", r.To, r.From)
	}
	sc.CopyOf = p.cfg.Source.Slot
	sc.Slot = fmt.Sprintf("%s_replay_%d", p.cfg.Source.Slot, time.Now().UnixNano()%1_000_000)
	sc.StartLSN = r.From
	p.skipBelow = r.From
	p.snapDone.Store(true)
	return r.From, nil
}

func (p *Pipeline) fail(err error) {
	p.fatalOnce.Do(func() { p.fatal <- err })
}

// windowed holds the confirmed position back by the replay window.
type windowed struct {
	*offsets.Tracker
	mu sync.Mutex
	w  *offsets.Window
}

func (w *windowed) Acked() lsn.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Confirmable(time.Now(), w.Tracker.Acked())
}

// process is the processor goroutine: it decodes, routes and produces, in WAL
// order, and tells the tracker where each transaction ends. produceCtx
// governs records handed to the sink; it outlives ctx so a stop drains them.
func (p *Pipeline) process(ctx, produceCtx context.Context, queue <-chan replication.Message, snap *replication.ExportedSnapshot) error {
	if snap != nil {
		if err := p.snapshot(ctx, produceCtx, snap); err != nil {
			return err
		}
	}
	dec := decode.NewDecoder(p.cfg.Mapping)
	var (
		txn        *offsets.Txn
		skip       bool // transaction delivered before (below the checkpoint)
		commitTime time.Time
		txnFinal   lsn.LSN       // commit LSN of the open transaction
		dispatched = p.skipBelow // end of the last transaction fully handed to the sink
		rec        router.Record
	)
	stopAt := lsn.LSN(0)
	if p.cfg.Replay != nil {
		stopAt = p.cfg.Replay.To
	}
	var m replication.Message
	for {
		m.Release() // the previous message is handled: its bytes may be queued again
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m = <-queue:
		}
		switch m.Kind {
		case replication.Reset:
			if txn != nil {
				p.tracker.Abort(txn)
				txn = nil
			}
			m.Resume(dispatched)
			continue
		case replication.Keepalive:
			if txn == nil && p.bf.due(m.WALEnd) {
				if err := p.runBackfill(ctx, produceCtx, p.bf, dispatched); err != nil {
					return err
				}
			}
			if txn == nil {
				if stopAt != 0 && m.WALEnd >= stopAt {
					return errReplayDone
				}
				p.tracker.Idle(m.WALEnd)
			}
			continue
		}
		res, err := dec.Decode(m.Data)
		if errors.Is(err, decode.ErrTableRenamed) { // replay: no known OID
			return fmt.Errorf("%w: set outbox.table to the new name (and update the publication), or rename it back; "+
				"rows inserted under the new name were not published", err)
		}
		if err != nil {
			return fmt.Errorf("decode message at %v: %w", m.WALStart, err)
		}
		switch res.Kind {
		case decode.KindBegin:
			if stopAt != 0 && res.Begin.FinalLSN >= stopAt {
				return errReplayDone
			}
			if p.bf.due(res.Begin.FinalLSN) {
				if err := p.runBackfill(ctx, produceCtx, p.bf, dispatched); err != nil {
					return err
				}
			}
			txn = p.tracker.Begin()
			txnFinal = res.Begin.FinalLSN
			// PostgreSQL skips these when streaming starts at the checkpoint;
			// this also covers a reconnect that resumed lower.
			skip = res.Begin.FinalLSN < p.skipBelow || p.bf.delivered(res.Begin.Xid)
			commitTime = res.Begin.CommitTime
			p.m.Transactions.Inc()
		case decode.KindCommit:
			if txn == nil {
				return fmt.Errorf("commit at %v without begin", m.WALStart)
			}
			p.tracker.Commit(txn, res.Commit.EndLSN)
			dispatched = max(dispatched, res.Commit.EndLSN)
			p.replayAt.Store(uint64(res.Commit.EndLSN))
			txn = nil
		case decode.KindRelation:
			if res.Relation.Outbox && res.Relation.Invalid != "" {
				// A table that lacks a mapped column now is a schema problem
				// and blocks; one that lacked it only when this transaction was
				// written (fixed since, as the start-up check found) leaves
				// rows that can never be mapped: those are dead-lettered.
				if p.guard == nil || txnFinal >= p.guard.first {
					return schemaError(res.Relation.Invalid)
				}
				p.log.Error("rows written while the outbox table lacked a mapped column go to the dead-letter topic",
					"table", res.Relation.Namespace+"."+res.Relation.Name, "problem", res.Relation.Invalid)
			}
		case decode.KindEvent:
			if txn == nil {
				return fmt.Errorf("insert at %v outside a transaction", m.WALStart)
			}
			if skip {
				continue
			}
			if err := p.publish(produceCtx, txn, commitTime, &res.Event, m.Data, &rec); err != nil {
				return err
			}
		case decode.KindMessage:
			msg := &res.Message
			if p.cfg.MessagePrefix == "" || !msg.Transactional || msg.Prefix != p.cfg.MessagePrefix {
				continue // heartbeats and other applications' messages
			}
			if txn == nil {
				return fmt.Errorf("transactional message at %v outside a transaction", m.WALStart)
			}
			if skip {
				continue
			}
			ev := parseMessage(msg.Content)
			if err := p.publish(produceCtx, txn, commitTime, &ev, msg.Content, &rec); err != nil {
				return err
			}
		}
	}
}

// publish routes one event and hands it to the sink.
func (p *Pipeline) publish(ctx context.Context, txn *offsets.Txn, commit time.Time, ev *decode.Event, msg []byte, rec *router.Record) error {
	d := &delivery{p: p, txn: txn, commit: commit}
	if reason := p.router.Route(ev, commit, rec); reason != "" {
		p.router.DeadLetter(ev, commit, reason, rec)
		d.reason, d.id = reason, string(ev.ID.Bytes)
	}
	if r := p.cfg.Replay; r != nil && r.TopicPrefix != "" {
		rec.Topic = r.TopicPrefix + rec.Topic
	}
	// The record must outlive this message's decoding: slices outside msg
	// (bytea values decoded into the decoder's buffer) are copied.
	rec.Key = own(rec.Key, msg)
	rec.Value = own(rec.Value, msg)
	for i := range rec.Headers {
		rec.Headers[i].Value = own(rec.Headers[i].Value, msg)
	}
	p.tracker.Add(txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
	return p.sink.Produce(ctx, rec, d)
}

// own returns b if it lies inside buf, else a copy of it.
func own(b, buf []byte) []byte {
	if len(b) == 0 || len(buf) == 0 {
		return b
	}
	p, s := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if p >= s && p+uintptr(len(b)) <= s+uintptr(len(buf)) {
		return b
	}
	return append([]byte(nil), b...)
}

// delivery is one event's state while it is in flight.
type delivery struct {
	p      *Pipeline
	txn    *offsets.Txn
	commit time.Time
	reason string // set when the router dead-lettered it
	id     string
}

// Delivered runs on a franz-go goroutine.
func (d *delivery) Delivered(o sink.Outcome) {
	p := d.p
	if o.Err != nil {
		if sink.Classify(o.Err) != sink.ClassShutdown {
			p.fail(&deliveryError{o.Err})
		}
		// Not acknowledged: the watermark stays before this transaction.
		return
	}
	now := time.Now()
	if o.DeadLettered {
		p.m.DeadLettered.Inc()
		if d.reason != "" {
			p.log.Warn("event dead-lettered", "id", d.id, "reason", d.reason, "topic", p.cfg.Routes.DLQTopic)
		}
	} else {
		p.m.Published.Inc()
		p.m.CommitToAck.Observe(now.Sub(d.commit).Seconds())
	}
	p.m.EventAcked(now)
	p.replayed.Add(1)
	p.tracker.Ack(d.txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
}
