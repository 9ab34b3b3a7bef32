// Package sink produces records to Kafka with franz-go. With its
// subpackages (sink/exactlyonce, sink/quarantine, sink/topicread) and
// kafkaopt, the only connector packages that import franz-go.
//
// Every record is produced asynchronously; its outcome reaches the caller
// exactly once through the Done function passed to Produce. Transient
// failures are retried by the client for ever (idempotent producer, no retry
// or delivery-time limit), so an outcome is either delivery, delivery to the
// dead-letter topic, or a fatal error.
//
// Only a record Kafka refuses on its own is dead-lettered. Records are
// checked against their topic's max.message.bytes before they are produced,
// and batches are capped at it. When the broker refuses a batch anyway,
// franz-go fails every record buffered for that partition with the same
// error (kgo sink.go: finishBatch → failAllRecords), so the topic is held
// back (see topics.go): new records wait, records the client has not sent
// yet are failed too (their kgo.Record.Context, one per topic, is
// cancelled), and once nothing of the topic is left in the client the failed
// records are sent again in their original order, each alone: a record
// refused alone is the guilty one. A topic that does not exist holds its
// records until it appears or Config.UnknownTopicTimeout passes.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Sink wraps one idempotent producer.
type Sink struct {
	cl  *kgo.Client
	dlq string
	log *slog.Logger

	meta           *kafka.Metadata
	unknownTimeout time.Duration
	poll           time.Duration // how often a missing topic is looked for
	maxHeld        int
	maxHeldBytes   int64 // 0: no byte bound

	// ctx ends at Close; topic workers and their requests run under it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // topic workers and the gate's releaser

	mu          sync.Mutex
	topics      map[string]*topicState
	seq         uint64 // Produce order, to resend records in it
	held        int    // records in the topics' held queues
	heldBytes   int64
	space       chan struct{} // closed when held room frees up
	spaceWanted bool
	closed      bool

	// q parks the records of quarantined keys (quarantine.go); nil in
	// dlq.mode skip. restored is its Ready, or closed.
	q        *quarantine.Set
	restored <-chan struct{}

	outstanding atomic.Int64 // records accepted whose Done has not run
	gate        *gate        // how records enter the client (gate.go)
	once        sync.Once
}

// New creates the producer. It does not contact the brokers: use Ping for
// that.
func New(cfg Config, log *slog.Logger) (*Sink, error) {
	codec, err := kafkaopt.CodecFor(cfg.Compression)
	if err != nil {
		return nil, err
	}
	s := &Sink{dlq: cfg.DLQTopic, log: log, maxHeld: cfg.BufferedRecords(), maxHeldBytes: cfg.MaxBufferedBytes,
		topics: make(map[string]*topicState), space: make(chan struct{})}
	s.unknownTimeout, s.poll = cfg.TopicWait()
	base, err := cfg.ConnOpts()
	if err != nil {
		return nil, err
	}
	s.gate = newGate(s.maxHeld, s.maxHeldBytes, cfg.LatencyBudget)
	opts, err := cfg.ProducerOpts(base, log, s.batchMax)
	if err != nil {
		return nil, err
	}
	opts = append(opts, cfg.TestOpts...)
	// Last, so that no option replaces it: the sink's order guarantee after
	// a refusal rests on it.
	opts = append(opts, kgo.WithLogger(clientLog{hold: s.holdBack}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	s.cl, s.meta = cl, kafka.NewMetadata(cl, cfg.creation(), log)
	s.gate.cl = cl
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.openQuarantine(cfg, append(slices.Clip(base), cfg.TestOpts...), codec)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.gate.run(s.ctx)
	}()
	return s, nil
}

// Ping checks that a broker answers.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka ping: %w", err)
	}
	return nil
}

// record is a kafka.Event (the kgo.Record, its size and dead-letter copy) and
// its state in the sink, so one allocation carries a whole event. It has
// one owner at a time: the client, a topic's held queue or retry list, or a
// worker.
type record struct {
	kafka.Event
	done Done
	sink *Sink
	ctx  context.Context // Produce's: it governs the record until it is sent
	t    *topicState     // topic it was last handed to the client for
	seq  uint64          // Produce order

	err    error // the refusal, while the record waits in a repair
	alone  bool  // sent on its own: a refusal now is its own
	resent bool  // sent again by a repair

	parked bool // bound for the parking topic: its key is quarantined

	qm quarantine.Mark // the quarantine's state on the record

	finished atomic.Bool
}

// Produce hands rec to the producer; rec may be reused when Produce returns.
// It blocks while the buffer limits are reached (backpressure). ctx also
// governs the record until it is sent: cancelling it fails records still
// buffered (with a shutdown outcome), so pass a context that outlives the
// drain. done is called exactly once, also when Produce returns ctx's error.
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done Done) error {
	if s.q != nil && !s.q.Started() {
		// Records would wait for a restore that never begins.
		panic("sink: Produce before StartQuarantines")
	}
	r := newRecord(rec, s.dlq)
	r.done, r.sink, r.ctx = done, s, ctx
	s.outstanding.Add(1)
	if err := ctx.Err(); err != nil {
		r.finish(Outcome{Err: err})
		return err
	}
	// The router's dead letter of a row with an aggregate_id (without one
	// its key is the event id): later records of the key must not overtake it.
	if r.DeadLettered() && kafka.Header(&r.Record, wire.HeaderAggregateID) != "" {
		// Its key may be quarantined already, in the set still being read.
		if err := s.awaitRestore(ctx); err != nil {
			r.finish(Outcome{Err: err})
			return err
		}
		if err := s.quarantine(r, r.Reason(), 0); err != nil {
			r.finish(Outcome{Err: err})
			return nil
		}
	}
	if err := s.submit(r, true); err != nil {
		return err
	}
	return ctx.Err()
}

// finish reports r's outcome; the guard keeps a bug from reporting twice.
func (r *record) finish(o Outcome) {
	if !r.finished.CompareAndSwap(false, true) {
		r.sink.log.Error("sink: a record's outcome was reported twice; ignoring the second", "topic", r.Topic, "outcome", fmt.Sprint(o))
		return
	}
	r.qm.Done()
	r.done.Delivered(o)
	r.sink.outstanding.Add(-1) // after Delivered: Flush returns only once outcomes are in
}

// submit hands r to the client, or to its topic's worker while the topic is
// not ready (looked up, missing or being repaired). fromProduce waits for
// room in the held queues and gives up when r's context ends.
func (s *Sink) submit(r *record, fromProduce bool) error {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			r.finish(Outcome{Err: kgo.ErrClientClosed})
			return nil
		}
		if r.seq == 0 {
			s.seq++
			r.seq = s.seq
		}
		t := s.topic(r.Topic)
		if t.ready {
			// Only a ready topic: one being repaired may still hold records
			// of the key ahead of r; handOver diverts r after them.
			switch s.divert(r) {
			case quarantine.Park:
				continue
			case quarantine.Hold:
				s.mu.Unlock()
				return nil
			}
			if t.overLimit(r) {
				s.mu.Unlock()
				s.tooLarge(t, r)
				return nil
			}
			t.admit(r)
			s.mu.Unlock()
			s.gate.produce(r)
			return nil
		}
		if !fromProduce || s.held < s.maxHeld && (s.maxHeldBytes <= 0 || s.heldBytes < s.maxHeldBytes) {
			t.held = append(t.held, r)
			s.held++
			s.heldBytes += int64(r.Size())
			s.startWorker(t)
			s.mu.Unlock()
			return nil
		}
		s.spaceWanted = true
		space := s.space
		s.mu.Unlock()
		select {
		case <-space:
		case <-r.ctx.Done():
			r.finish(Outcome{Err: r.ctx.Err()})
			return r.ctx.Err()
		}
		s.mu.Lock()
	}
}

// How a worker hands a record over.
const (
	fromHeld    = iota // next in the held queue
	resend             // sent again in a repair, with others
	resendAlone        // sent again in a repair, alone: a refusal is its own
)

// handOver gives r to the client for the worker that owns t. A repair
// noticed since the worker picked r sends r (back) to the repair instead:
// records refused ahead of it may not have come back yet.
func (s *Sink) handOver(t *topicState, r *record, how int) {
	if err := r.ctx.Err(); err != nil {
		r.finish(Outcome{Err: err})
		return
	}
	s.mu.Lock()
	if how == fromHeld && t.repairing || how != fromHeld && t.synced != t.notices {
		t.retry = append(t.retry, r)
		t.isolating = false
		s.mu.Unlock()
		return
	}
	switch s.divert(r) { // nothing of its key is left ahead of it in t
	case quarantine.Park:
		s.mu.Unlock()
		_ = s.submit(r, false)
		return
	case quarantine.Hold:
		s.mu.Unlock()
		return
	}
	if t.overLimit(r) {
		s.mu.Unlock()
		s.tooLarge(t, r)
		return
	}
	if how != fromHeld {
		r.resent = true
		r.alone, r.err = how == resendAlone, nil
	}
	t.admit(r)
	s.mu.Unlock()
	s.gate.produce(r)
}

// settle decides what a client outcome means. It runs on franz-go's promise
// goroutine, so it never blocks: refused records go to their topic's worker.
func (s *Sink) settle(r *record, err error) {
	// Read for the logs now: once in t.retry, r belongs to t's worker.
	t, tp, part, offset := r.t, r.Topic, r.Partition, r.Offset
	var (
		o        *Outcome
		overtook bool
		started  bool
	)
	s.mu.Lock()
	t.inClient--
	switch {
	case err == nil:
		first, ok := t.refused[r.Partition]
		overtook = ok && !r.resent && r.seq > first
		o = &Outcome{DeadLettered: r.DeadLettered(), Reason: r.Reason(), Parked: r.parked}
	case s.closed:
		o = &Outcome{Err: kafka.ShutdownError(err)}
	case r.ctx.Err() != nil: // the caller stopped: resent after a restart
		o = &Outcome{Err: kafka.ShutdownError(err)}
	case errors.Is(err, context.Canceled) && r.Context.Err() != nil:
		// Failed unsent because a refusal holds the topic back: it goes
		// again, in order, with the refused records.
		t.retry = append(t.retry, r)
	case kafka.Classify(err) == kafka.ClassUnpublishable:
		r.err = err
		t.retry = append(t.retry, r)
		started = s.startRepair(t, r)
	default:
		o = &Outcome{Err: fmt.Errorf("produce to %s: %w", r.Topic, err)}
	}
	running := t.running
	s.mu.Unlock()
	if running {
		t.signal()
	}
	if started {
		s.log.Warn("kafka refused a record; holding the topic back to send the records failed with it again, in order",
			"topic", tp, "partition", part, "err", err)
	}
	if overtook {
		s.log.Error("kafka: a record was written before records refused ahead of it were sent again: their order in this partition is broken",
			"topic", tp, "partition", part, "offset", offset)
	}
	switch {
	case o != nil && o.Err == nil && r.qm.Saving():
		s.q.Save(r, func() { r.finish(*o) }) // the outcome waits until the quarantine is saved
	case o != nil:
		r.finish(*o)
	}
}

// Flush waits until everything produced has an outcome or ctx ends.
func (s *Sink) Flush(ctx context.Context) error {
	for {
		if err := s.cl.Flush(ctx); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
		// Records held back or being resent are outside the client.
		if s.outstanding.Load() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Close stops the topic workers and closes the client; records without an
// outcome yet fail with a shutdown outcome.
func (s *Sink) Close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		if s.spaceWanted { // Produce waiting for held room: it fails the record
			close(s.space)
			s.spaceWanted = false
		}
		s.mu.Unlock()
		s.cancel()
		// Closing the client first fails what it buffers and unblocks a
		// worker waiting in Produce for buffer room.
		s.cl.Close()
		s.wg.Wait()
		if s.q != nil {
			s.q.Close() // fails the records its quarantines hold
		}
		s.mu.Lock()
		var left []*record
		for _, t := range s.topics {
			left = append(append(left, t.held...), t.retry...)
			t.held, t.retry = nil, nil
		}
		s.mu.Unlock()
		left = append(left, s.gate.drop()...)
		for _, r := range left {
			r.finish(Outcome{Err: kgo.ErrClientClosed})
		}
	})
}
