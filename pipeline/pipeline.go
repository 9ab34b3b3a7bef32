// Package pipeline wires the connector: replication stream → decoder →
// router → sink, with the offsets tracker gating what is confirmed.
//
// Two goroutines run while the connector streams: the stream (owner of the
// PostgreSQL connection) and the processor (owner of the decoder, router and
// the tracker's write side). Broker acknowledgements arrive on franz-go's
// goroutines and only touch the tracker and the metrics.
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
}

// Pipeline is one running connector.
type Pipeline struct {
	cfg Config
	log *slog.Logger
	m   *metrics.Metrics

	router  *router.Router
	tracker *offsets.Tracker
	sink    *sink.Sink

	streaming atomic.Bool
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
	return &Pipeline{cfg: cfg, log: log, m: m, router: r, fatal: make(chan error, 1), ready: make(chan struct{})}, nil
}

// Ready is closed once the slot is set up and streaming has started.
func (p *Pipeline) Ready() <-chan struct{} { return p.ready }

// Streaming reports whether the replication connection is up.
func (p *Pipeline) Streaming() bool { return p.streaming.Load() }

// Run sets up the slot and streams until ctx ends, then stops reading,
// drains in-flight records, confirms the watermark and returns nil; or it
// returns the first fatal error.
func (p *Pipeline) Run(ctx context.Context) error {
	confirmed, err := replication.Setup(ctx, p.cfg.Source)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	p.tracker = offsets.NewTracker(confirmed)
	p.m.ConfirmedLSN.Set(float64(confirmed))
	p.sink, err = sink.New(p.cfg.Sink, p.log)
	if err != nil {
		return err
	}
	defer p.sink.Close()

	stream := replication.NewStream(replication.Config{
		Source:         p.cfg.Source,
		StatusInterval: p.cfg.StatusInterval,
		BackoffMax:     p.cfg.BackoffMax,
	}, p.tracker, p.m, p.log)
	stream.OnConnected = p.streaming.Store

	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStream()
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
		procErr = p.process(procCtx, queue)
	}()
	p.log.Info("connector started", "slot", p.cfg.Source.Slot, "confirmed", confirmed)
	close(p.ready)

	// Wait for a stop request or a fatal error.
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-p.fatal:
	}
	stream.StopReading()
	stopProc()
	<-procDone
	if runErr == nil && procErr != nil && !errors.Is(procErr, context.Canceled) {
		runErr = procErr
	}

	// Drain: everything produced gets an outcome, so the final confirmation
	// covers as much as possible. A fatal error still drains: acks are acks.
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.DrainTimeout)
	if err := p.sink.Flush(drainCtx); err != nil {
		p.log.Warn("stopping with records in flight; they will be sent again after restart",
			"inflight", p.tracker.InFlight(), "err", err)
	}
	cancel()
	stopStream()
	wg.Wait()
	p.log.Info("connector stopped", "confirmed", p.tracker.Acked(), "inflight", p.tracker.InFlight())
	if runErr == nil {
		runErr = streamErr
	}
	return runErr
}

func (p *Pipeline) fail(err error) {
	p.fatalOnce.Do(func() { p.fatal <- err })
}

// process is the processor goroutine: it decodes, routes and produces, in WAL
// order, and tells the tracker where each transaction ends.
func (p *Pipeline) process(ctx context.Context, queue <-chan replication.Message) error {
	dec := decode.NewDecoder(p.cfg.Mapping)
	var (
		txn        *offsets.Txn
		commitTime time.Time
		dispatched lsn.LSN // end of the last transaction fully handed to the sink
		rec        router.Record
	)
	for {
		var m replication.Message
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
			if txn == nil {
				p.tracker.Idle(m.WALEnd)
			}
			continue
		}
		res, err := dec.Decode(m.Data)
		if err != nil {
			return fmt.Errorf("decode message at %v: %w", m.WALStart, err)
		}
		switch res.Kind {
		case decode.KindBegin:
			txn = p.tracker.Begin()
			commitTime = res.Begin.CommitTime
			p.m.Transactions.Inc()
		case decode.KindCommit:
			if txn == nil {
				return fmt.Errorf("commit at %v without begin", m.WALStart)
			}
			p.tracker.Commit(txn, res.Commit.EndLSN)
			dispatched = res.Commit.EndLSN
			txn = nil
		case decode.KindRelation:
			if res.Relation.Outbox && res.Relation.Invalid != "" {
				p.log.Error("outbox table does not match outbox.columns; its rows go to the dead-letter topic",
					"table", res.Relation.Namespace+"."+res.Relation.Name, "problem", res.Relation.Invalid)
			}
		case decode.KindEvent:
			if txn == nil {
				return fmt.Errorf("insert at %v outside a transaction", m.WALStart)
			}
			if err := p.publish(ctx, txn, commitTime, &res.Event, m.Data, &rec); err != nil {
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
	// The record must outlive this message's decoding: slices outside msg
	// (bytea values decoded into the decoder's buffer) are copied.
	rec.Key = own(rec.Key, msg)
	rec.Value = own(rec.Value, msg)
	for i := range rec.Headers {
		rec.Headers[i].Value = own(rec.Headers[i].Value, msg)
	}
	p.tracker.Add(txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
	if err := p.sink.Produce(ctx, rec, d); err != nil {
		return err
	}
	return nil
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
			p.fail(fmt.Errorf("deliver event: %w", o.Err))
		}
		// Not acknowledged: the watermark stays before this transaction.
		return
	}
	if o.DeadLettered {
		p.m.DeadLettered.Inc()
		if d.reason != "" {
			p.log.Warn("event dead-lettered", "id", d.id, "reason", d.reason, "topic", p.cfg.Routes.DLQTopic)
		}
	} else {
		p.m.Published.Inc()
		p.m.CommitToAck.Observe(time.Since(d.commit).Seconds())
	}
	p.tracker.Ack(d.txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
}
