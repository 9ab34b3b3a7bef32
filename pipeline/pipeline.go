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
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/pgopt"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// Config is everything the pipeline needs, already validated.
type Config struct {
	// ConfigPath is the configuration file, for commands printed in
	// messages ("" leaves a placeholder).
	ConfigPath     string
	Source         replication.Source
	Mapping        decode.Mapping
	Routes         router.Config
	Sink           sink.Config
	StatusInterval time.Duration
	BackoffMax     time.Duration
	// DrainTimeout bounds how long a clean stop waits for in-flight records.
	DrainTimeout time.Duration
	// QueueSize is how many WAL messages may wait between the stream and the
	// processor (they go in batches: replication.Batch).
	QueueSize int
	// QueueBytes bounds the WAL data in that queue (0: 64 MiB).
	QueueBytes int64
	// ReceiveTimeout ends a silent replication connection (0: 60s).
	ReceiveTimeout time.Duration

	// Checkpoints is nil when checkpoint.store is none.
	Checkpoints offsets.Store
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

	// Tracer, when set (otel.endpoint), gives each event a span (trace.go).
	Tracer Tracer

	// More are the outbox tables after the first (outbox.tables, tables.go);
	// Mapping and Routes are the first's, and route table-less events.
	More []Table
	// ExactlyOnce, when set (kafka.delivery exactly_once), publishes through
	// Kafka transactions (exactly_once.go); nil: at least once.
	ExactlyOnce *ExactlyOnce
	// Retention deletes delivered outbox rows (retention.go).
	Retention RetentionConfig
	// MarksTable is the history marks table, "schema.table"
	// (replication/marks.go); "" writes none.
	MarksTable string
	// HoldsTable is the lost slots' repair holds table, "schema.table"
	// (replication.Holds); "" for none.
	HoldsTable string
	// Contracts, when set (contracts.registry.url), checks every event
	// against its schema (contracts.go); nil: off.
	Contracts *Contracts
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

	plan    *plan // set before any goroutine starts, then read-only
	tracker *offsets.Tracker
	out     producer // sink.Sink, or sink.Txn in exactly_once mode

	proc *processor    // the processor's state (process.go)
	prog progress      // snapshot done, events acknowledged, replay position (side.go)
	ckpt *checkpointer // nil when nothing is saved (checkpoint.go)

	conn    connection       // the replication connection's state, as the stream reports it
	rep     *repair          // the gap and its repair (repair.go)
	ret     *retentionLoop   // outbox.retention and the lost slots' repair hold (retention.go)
	b       boundary         // the sink's transactions: eos, or atLeastOnce (eos.go); set by newSink
	history *history         // the proof of the run's positions (history.go); set by resolve
	held    *offsets.Stamped // the checkpoint store (nil: none), for the slot-loss runbook
	fatal   failure
	ready   chan struct{}
}

// New validates the routing rules; Run does the rest.
func New(cfg Config, m *metrics.Metrics, log *slog.Logger) (*Pipeline, error) {
	r, err := newRouters(cfg, badTraceReporter(m, log))
	if err != nil {
		return nil, err
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = pgopt.DefaultQueueMessages
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = kafkaopt.DefaultDrainTimeout
	}
	if cfg.MonitorInterval <= 0 {
		cfg.MonitorInterval = pgopt.DefaultMonitorInterval
	}
	if cfg.GuardInterval <= 0 {
		cfg.GuardInterval = defaultGuardInterval
	}
	// The prerequisite check refuses a server too old for messages.
	cfg.Source.Messages = cfg.MessagePrefix != ""
	p := &Pipeline{cfg: cfg, log: log, m: m, rep: newRepair(log), b: atLeastOnce{}, fatal: failure{first: make(chan error, 1)}, ready: make(chan struct{})}
	p.proc = &processor{p: p, routers: r, tables: tableMetrics(cfg, m), contracts: newContractGate(cfg.Contracts, m, log)}
	p.ret = &retentionLoop{p: p}
	if cfg.HoldsTable != "" {
		p.ret.holds = replication.NewHolds(cfg.Source.Writer(), cfg.HoldsTable, cfg.Source.Slot)
	}
	return p, nil
}

// Ready is closed once the slot is set up and streaming has started.
func (p *Pipeline) Ready() <-chan struct{} { return p.ready }

// Streaming reports whether the replication connection is up.
func (p *Pipeline) Streaming() bool { return p.conn.up.Load() }

// Run sets up the slot and streams until ctx ends, then stops reading,
// drains in-flight records, confirms the watermark and returns nil; or it
// returns the first fatal error. In replay mode it returns once the range is
// published and acknowledged.
func (p *Pipeline) Run(ctx context.Context) error {
	return p.runbook(p.run(ctx))
}

func (p *Pipeline) run(ctx context.Context) error {
	// Before the slot is set up: a refusal leaves nothing behind.
	su := &starter{p: p}
	if err := su.ownTopics(ctx); err != nil {
		return err
	}
	pl, err := su.resolve(ctx)
	if err != nil {
		return err
	}
	s, err := su.newSink(ctx, pl)
	if err != nil {
		pl.close(ctx)
		return err
	}
	if err := su.begin(ctx, pl); err != nil {
		s.Close()
		pl.close(ctx)
		return err
	}
	if pl.guard != nil {
		defer pl.guard.Close()
	}
	defer s.Close()
	p.plan, p.out = pl, s
	if pl.checkpoints != nil {
		p.ckpt = &checkpointer{p: p, store: pl.checkpoints}
	}
	p.tracker = offsets.NewTracker(pl.start)
	if f, ok := p.cfg.Checkpoints.(interface{ SetFloor(func() lsn.LSN) }); ok {
		// A server whose WAL ends below what was acknowledged from it was
		// rewound: the checkpoint table refuses to save there.
		f.SetFloor(p.tracker.Acked)
	}
	if p.ckpt != nil {
		if err := p.ckpt.beforeStream(ctx, pl); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil // stopped before the stream started: nothing to drain
	}

	var pos replication.Positions = p.tracker
	if p.cfg.RetainFor > 0 || p.cfg.RetainBytes > 0 {
		pos = &windowed{Tracker: p.tracker, w: offsets.NewWindow(p.cfg.RetainFor, p.cfg.RetainBytes)}
	}
	if pl.guard != nil {
		pos = gated{Positions: pos, g: pl.guard}
	}
	if _, ok := p.b.(*eos); ok {
		pos = held{Positions: pos, b: p.b}
	}
	pos = proven{Positions: pos, h: p.history}
	stream := replication.NewStream(pl.stream, pos, p.m, p.log)
	stream.OnConnected = func(up bool) {
		if up {
			p.conn.sessions.Add(1)
		}
		p.conn.up.Store(up)
	}
	stream.OnTimeline = onTimeline(pl, s)
	p.conn.drop = stream.Drop
	r := p.start(ctx, stream)
	pr := p.history.proven()
	p.log.Info("connector started", "slot", p.cfg.Source.Slot, "from", pl.start, "history_mark", pr.mark)
	close(p.ready)

	var cause error
	select {
	case <-ctx.Done():
	case cause = <-p.fatal.first:
	}
	return p.shutdown(ctx, r, cause)
}

// streamer is the replication stream as a run uses it.
type streamer interface {
	Run(ctx context.Context, out chan<- *replication.Batch) error
	StopReading()
}

// running is what a run started and its shutdown stops, in order.
type running struct {
	stream      streamer
	stopStream  context.CancelFunc // ends the stream after its final status update
	streamDone  chan struct{}
	streamErr   error
	stopProc    context.CancelFunc
	procDone    chan struct{}
	procErr     error // nil after a stop or the end of a replay
	stopProduce context.CancelFunc
	stopSides   context.CancelFunc
	sides       sync.WaitGroup
}

// start runs the stream, the processor and the side loops the plan asks for.
func (p *Pipeline) start(ctx context.Context, stream streamer) *running {
	r := &running{stream: stream, streamDone: make(chan struct{}), procDone: make(chan struct{})}
	// The stream, the producer and the side loops outlive ctx: a stop
	// drains, confirms and saves before they end.
	base := context.WithoutCancel(ctx)
	streamCtx, stopStream := context.WithCancel(base)
	produceCtx, stopProduce := context.WithCancel(base)
	// The processor too: a clean stop decodes its last history mark first.
	procCtx, stopProc := context.WithCancel(base)
	sides, stopSides := context.WithCancel(base)
	r.stopStream, r.stopProduce, r.stopProc, r.stopSides = stopStream, stopProduce, stopProc, stopSides

	queue := make(chan *replication.Batch, p.cfg.QueueSize)
	go func() {
		defer close(r.streamDone)
		if r.streamErr = stream.Run(streamCtx, queue); r.streamErr != nil {
			p.fail(r.streamErr)
		}
	}()
	go func() {
		defer close(r.procDone)
		switch err := p.process(procCtx, produceCtx, queue); {
		case err == nil, errors.Is(err, context.Canceled): // a stop
		case errors.Is(err, errReplayDone):
			p.fail(err) // the range is published: the run ends, cleanly
		default:
			r.procErr = err
			p.fail(err)
		}
	}()
	pl := p.plan
	if p.ckpt != nil {
		r.sides.Go(func() { p.ckpt.loop(sides) })
	}
	if pl.guard != nil {
		r.sides.Go(func() {
			p.history.markLoop(sides, p.tracker.Acked, p.prog.events.Load, func(err error) {
				p.log.Error("history mark not written: positions wait for one before they are confirmed or saved", "err", err)
			})
		})
		mon := &replication.Monitor{Source: p.cfg.Source, Standby: pl.standby, Heartbeat: p.cfg.Heartbeat,
			Interval: p.cfg.MonitorInterval, RetainedWALWarn: p.cfg.RetainedWALWarn, Metrics: p.m, Log: p.log, Fail: p.fail}
		r.sides.Go(func() { mon.Run(sides) })
		r.sides.Go(func() { p.guardLoop(sides, pl.guard) })
		r.sides.Go(func() { unackedLoop(sides, p.m.Retention.OldestUnacked, &p.proc.commits, p.tracker.Acked) })
		if p.cfg.Retention.After > 0 {
			r.sides.Go(func() { p.ret.run(sides) })
		}
	}
	if pl.progress != nil {
		r.sides.Go(func() { p.progressLoop(sides) })
	}
	return r
}

// shutdown stops a run; the order is the one place it is written:
//  1. arm the drain deadline: it runs from the moment the stop begins, and
//     cancelling the produce context is what frees a processor blocked in
//     Produce on a full buffer with the broker down;
//  2. stop the side loops (checkpoint, marks, monitor, guard, retention,
//     progress): none writes to the server after this;
//  3. a clean stop saves the checkpoint and writes a last mark, and waits
//     until the processor decoded it (quiesce), so the slot's last
//     confirmation follows the connector's own last write;
//  4. stop reading WAL, then stop the processor;
//  5. drain: everything produced gets an outcome, so the final confirmation
//     covers as much as possible (a fatal error still drains: acks are acks);
//  6. the guard's final check, so the stream's last status update and the
//     last checkpoint confirm everything decoded, not only what the last
//     periodic reading vouched for;
//  7. the stream's final status update (it ends the connection);
//  8. the last checkpoint unless step 3 saved it, then the store closes.
//
// Which error wins: the first fatal error reported (cause), else an outbox
// the final check found outside the stream, else the stream's, else the
// processor's. A stop and the end of a replay are no errors.
func (p *Pipeline) shutdown(ctx context.Context, r *running, cause error) error {
	if errors.Is(cause, errReplayDone) {
		cause = nil
	}
	base := context.WithoutCancel(ctx)
	drainCtx, cancel := context.WithTimeout(base, p.cfg.DrainTimeout)
	defer cancel()
	defer context.AfterFunc(drainCtx, r.stopProduce)()

	r.stopSides()
	r.sides.Wait()
	saved := cause == nil && p.quiesce(base)

	r.stream.StopReading()
	r.stopProc()
	<-r.procDone

	if err := p.out.Flush(drainCtx); err != nil {
		p.log.Warn("stopping with records in flight; they will be sent again after restart",
			"inflight", p.tracker.InFlight(), "err", err)
	}
	r.stopProduce()

	finalErr := p.finalCheck(base)

	r.stopStream()
	<-r.streamDone

	if p.ckpt != nil {
		if !saved || finalErr != nil {
			// The final check may have found a gap after quiesce saved: the
			// restart's repair needs it recorded.
			p.ckpt.save(base, 0)
		}
		p.ckpt.store.Close()
	}
	if pr := p.plan.progress; pr != nil {
		pr(p.prog.report(p.plan, cause == nil && finalErr == nil))
	}
	p.log.Info("connector stopped", "acknowledged", p.tracker.Acked(), "inflight", p.tracker.InFlight())
	err := cmp.Or(cause, finalErr, r.streamErr, r.procErr)
	if err != nil {
		p.m.FatalErrors.WithLabelValues(fatalReason(err)).Inc()
	}
	return err
}

// fatalReason labels a fatal error for outbox_cdc_fatal_errors_total.
func fatalReason(err error) string {
	var f *fault.FatalError
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

// fail hands the first fatal error to Run.
func (p *Pipeline) fail(err error) {
	p.fatal.once.Do(func() { p.fatal.first <- err })
}

// failure is the first fatal error of a run, whoever reports it.
type failure struct {
	once  sync.Once
	first chan error
}

// connection is the replication connection's state, written by the
// stream's OnConnected callback only.
type connection struct {
	up       atomic.Bool
	sessions atomic.Uint64 // the stream's sessions so far (retention.Epoch)
	// drop ends the stream's session (replication.Stream.Drop); set
	// before the run's goroutines start.
	drop func()
}

// markFlushTimeout bounds the wait of a clean stop for its last mark.
const markFlushTimeout = 2 * time.Second

// quiesce is a clean stop's last write to the server: it saves the
// checkpoint, then writes a mark after it and waits until the processor
// decoded the mark. The stream's last status update then confirms past
// every transaction the connector committed, and the slot has consumed the
// WAL: pg_upgrade keeps a logical slot only when nothing decodable follows
// its confirmed position (PG docs, pg_upgrade, "Prepare for publisher
// upgrades"). It reports whether the checkpoint is saved for good; without
// marks (PostgreSQL 13) it flushes as before and the last save follows.
func (p *Pipeline) quiesce(ctx context.Context) bool {
	if p.history == nil || p.history.marks == nil {
		return false
	}
	saved := false
	if p.ckpt != nil {
		p.ckpt.saveAs(ctx, 0, true, true)
		held, ok := p.ckpt.store.Held()
		saved = ok && held.Clean
	}
	if !p.history.finalMark(ctx, markFlushTimeout) {
		p.log.Warn("no history mark decoded before the stop: the last checkpoint may be older than what was delivered")
		return false
	}
	return saved
}

// proven confirms, after a reconnect, no position the history does not
// prove until the processor decoded past it again (history.confirmable).
// The slot is otherwise the server's own: a restore brings back its older
// state, so the acknowledged watermark is confirmed as before.
type proven struct {
	replication.Positions
	h *history
}

func (x proven) Acked() lsn.LSN { return x.h.confirmable(x.Positions.Acked()) }

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
