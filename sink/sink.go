// Package sink produces records to Kafka with franz-go. It is the only
// connector package that imports kgo.
//
// Every record is produced asynchronously; its outcome reaches the caller
// exactly once through the Done function passed to Produce. Transient
// failures are retried by the client for ever (idempotent producer, no retry
// or delivery-time limit), so an outcome is either delivery, delivery to the
// dead-letter topic, or a fatal error.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// Config is the producer configuration (the kafka section of the config file).
type Config struct {
	Brokers            []string
	ClientID           string
	DLQTopic           string
	MaxBufferedRecords int
	MaxBufferedBytes   int64
	Linger             time.Duration
	RequestTimeout     time.Duration
	Compression        string // none, gzip, snappy, lz4, zstd
	// Opts are extra client options (TLS, SASL, test hooks).
	Opts []kgo.Opt
}

// Outcome is the final state of one produced record.
type Outcome struct {
	// DeadLettered is true when the record was delivered to the dead-letter
	// topic instead of its own.
	DeadLettered bool
	// Reason says why it was dead-lettered.
	Reason string
	// Err is a fatal error: the record was not delivered anywhere and the
	// pipeline must stop without confirming it.
	Err error
}

// Done receives a record's outcome, on a client goroutine. Delivered must
// not block.
type Done interface{ Delivered(Outcome) }

// Sink wraps one idempotent producer.
type Sink struct {
	cl  *kgo.Client
	dlq string
	log *slog.Logger

	// Dead-lettering a broker-rejected record happens off the promise
	// goroutine: producing from a promise can deadlock on a full buffer.
	mu      sync.Mutex
	queue   []retry
	pending int  // copies queued or not yet handed to the client
	closed  bool // the worker stopped: refusals fail at once
	wake    chan struct{}
	stop    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

type retry struct {
	rec    *kgo.Record
	reason string
	done   Done
}

// New creates the producer and starts its dead-letter worker. It does not
// contact the brokers: use Ping for that.
func New(cfg Config, log *slog.Logger) (*Sink, error) {
	codec, err := codecFor(cfg.Compression)
	if err != nil {
		return nil, err
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		// acks=all is required by, and the default of, the idempotent producer;
		// said explicitly because guarantee 4 rests on it.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Keyed records hash with murmur2 like the Java client, so the same
		// aggregate_id lands in the same partition for every producer.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ProducerBatchCompression(codec),
		kgo.AllowAutoTopicCreation(),
		// Retry quickly after a broker comes back: franz-go's default backoff
		// grows to seconds, which is what recovery after an outage then takes.
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			d := min(100*time.Millisecond<<min(tries, 4), time.Second)
			return d/2 + rand.N(d/2+1)
		}),
	}
	if cfg.MaxBufferedRecords > 0 {
		opts = append(opts, kgo.MaxBufferedRecords(cfg.MaxBufferedRecords))
	}
	if cfg.MaxBufferedBytes > 0 {
		opts = append(opts, kgo.MaxBufferedBytes(int(cfg.MaxBufferedBytes)))
	}
	if cfg.RequestTimeout > 0 {
		opts = append(opts, kgo.ProduceRequestTimeout(cfg.RequestTimeout))
	}
	opts = append(opts, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	s := &Sink{cl: cl, dlq: cfg.DLQTopic, log: log,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	go s.deadLetterLoop()
	return s, nil
}

func codecFor(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "", "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("kafka.compression %q: use none, gzip, snappy, lz4 or zstd", name)
}

// Ping checks that a broker answers.
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka ping: %w", err)
	}
	return nil
}

// record is a kgo.Record with room for the usual headers, so one allocation
// carries a whole event.
type record struct {
	kgo.Record
	hdr  [8]kgo.RecordHeader
	done Done
	sink *Sink
}

// Produce hands rec to the producer; rec may be reused when Produce returns.
// It blocks while the buffer limits are reached (backpressure). ctx also
// governs the record until it is sent: cancelling it fails records still
// buffered (with a shutdown outcome), so pass a context that outlives the
// drain. done is called exactly once, also when Produce returns ctx's error.
func (s *Sink) Produce(ctx context.Context, rec *router.Record, done Done) error {
	r := &record{done: done, sink: s}
	r.Topic = rec.Topic
	r.Key = rec.Key
	r.Value = rec.Value
	r.Timestamp = rec.Timestamp
	h := r.hdr[:0]
	for _, x := range rec.Headers {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: x.Value})
	}
	r.Headers = h
	// The record carries the promise's state, so the method value is the
	// only other allocation.
	s.cl.Produce(ctx, &r.Record, r.promise)
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}

func (r *record) promise(_ *kgo.Record, err error) {
	r.sink.complete(&r.Record, err, r.done, false)
}

// complete decides a record's outcome. dead is true for a record already
// bound for the dead-letter topic.
func (s *Sink) complete(rec *kgo.Record, err error, done Done, dead bool) {
	dead = dead || rec.Topic == s.dlq
	if err == nil {
		o := Outcome{DeadLettered: dead}
		if dead {
			o.Reason = reasonOf(rec)
		}
		done.Delivered(o)
		return
	}
	switch Classify(err) {
	case ClassUnpublishable:
		if dead {
			// The dead-letter copy itself was refused: drop its payload, keep the
			// reason, and try once more; a second refusal is fatal.
			if rec.Value != nil && !headerIs(rec, "payload_omitted") {
				s.enqueue(retry{rec: withoutPayload(rec, err), reason: reasonOf(rec), done: done})
				return
			}
			done.Delivered(Outcome{Err: fmt.Errorf("dead-letter topic %s refused the record: %w", s.dlq, err)})
			return
		}
		reason := fmt.Sprintf("Kafka refused the record for topic %s: %v", rec.Topic, err)
		s.enqueue(retry{rec: toDeadLetter(rec, s.dlq, reason), reason: reason, done: done})
	case ClassShutdown:
		done.Delivered(Outcome{Err: err})
	default:
		done.Delivered(Outcome{Err: fmt.Errorf("produce to %s: %w", rec.Topic, err)})
	}
}

func (s *Sink) enqueue(r retry) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		r.done.Delivered(Outcome{Err: kgo.ErrClientClosed})
		return
	}
	s.queue = append(s.queue, r)
	s.pending++
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Sink) deadLetterLoop() {
	defer close(s.stopped)
	for {
		select {
		case <-s.stop:
			s.failQueued(kgo.ErrClientClosed)
			return
		case <-s.wake:
		}
		s.mu.Lock()
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, r := range batch {
			r := r
			s.log.Warn("dead-lettering record", "topic", headerValue(r.rec, "topic"), "reason", r.reason)
			// Background context: Close stops this loop only after Flush, and
			// closing the client fails anything still buffered.
			s.cl.Produce(context.Background(), r.rec, func(rec *kgo.Record, err error) {
				s.complete(rec, err, r.done, true)
			})
			// Now buffered in the client, which Flush waits for.
			s.mu.Lock()
			s.pending--
			s.mu.Unlock()
		}
	}
}

func (s *Sink) failQueued(err error) {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	s.pending -= len(batch)
	s.closed = true
	s.mu.Unlock()
	for _, r := range batch {
		r.done.Delivered(Outcome{Err: err})
	}
}

// Flush waits until everything buffered has an outcome or ctx ends.
func (s *Sink) Flush(ctx context.Context) error {
	for {
		if err := s.cl.Flush(ctx); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
		// A flush can complete records that enqueue dead-letter copies.
		s.mu.Lock()
		n := s.pending
		s.mu.Unlock()
		if n == 0 && s.cl.BufferedProduceRecords() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Close stops the dead-letter worker and closes the client; records still
// buffered fail with a shutdown outcome.
func (s *Sink) Close() {
	s.once.Do(func() {
		close(s.stop)
		<-s.stopped
		s.cl.Close()
	})
}

// Client exposes the underlying client to tests and tools in this module
// that need admin or consume access to the same cluster.
func (s *Sink) Client() *kgo.Client { return s.cl }

// Class is what to do about a produce error.
type Class int

const (
	// ClassFatal: stop the pipeline; the record is re-delivered after restart.
	ClassFatal Class = iota
	// ClassUnpublishable: the record can never be accepted; dead-letter it.
	ClassUnpublishable
	// ClassShutdown: the client is closing; not an error of the record.
	ClassShutdown
)

// Classify decides, once, what a produce error means. Retriable broker
// errors never reach it: the client retries those without limit.
func Classify(err error) Class {
	switch {
	case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrAborting),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassShutdown
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidTopicException), errors.Is(err, kerr.UnknownTopicOrPartition),
		errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.PolicyViolation):
		return ClassUnpublishable
	}
	return ClassFatal
}

// toDeadLetter copies rec to the dead-letter topic with the reason and the
// topic it was meant for.
func toDeadLetter(rec *kgo.Record, dlq, reason string) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+2)
	h = append(h, kgo.RecordHeader{Key: router.HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: "topic", Value: []byte(rec.Topic)})
	h = append(h, rec.Headers...)
	return &kgo.Record{Topic: dlq, Key: rec.Key, Value: rec.Value, Headers: h, Timestamp: rec.Timestamp}
}

func withoutPayload(rec *kgo.Record, err error) *kgo.Record {
	h := append(append([]kgo.RecordHeader(nil), rec.Headers...),
		kgo.RecordHeader{Key: "payload_omitted", Value: []byte(err.Error())})
	return &kgo.Record{Topic: rec.Topic, Key: rec.Key, Headers: h, Timestamp: rec.Timestamp}
}

func reasonOf(rec *kgo.Record) string { return headerValue(rec, router.HeaderError) }

func headerIs(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}

func headerValue(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
