package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// The topics sinktest.NewCluster seeds.
const (
	topic = sinktest.Topic
	dlq   = sinktest.DLQ
)

// newSink creates a sink on c; it is closed before the cluster (cleanups
// run last-in first-out).
func newSink(t *testing.T, c *kfake.Cluster, log *slog.Logger, opts ...kgo.Opt) *sink.Sink {
	t.Helper()
	s, _ := sinktest.NewSink(t, c, log, nil, opts...)
	return s
}

var commit = time.Date(2024, 5, 6, 7, 8, 9, 123_000_000, time.UTC)

func baseRecord(topic string, value []byte) *router.Record {
	return &router.Record{
		Topic: topic,
		Key:   []byte("agg-1"),
		Value: value,
		Headers: []router.Header{
			{Key: "id", Value: []byte("ev-1")},
			{Key: "event_type", Value: []byte("Created")},
			{Key: "aggregate_type", Value: []byte("order")},
			{Key: "trace", Value: []byte{}},
		},
		Timestamp: commit,
	}
}

func checkOriginal(t *testing.T, got *kgo.Record, want *router.Record) {
	t.Helper()
	if !bytes.Equal(got.Key, want.Key) {
		t.Errorf("key = %q, want %q", got.Key, want.Key)
	}
	if !got.Timestamp.Equal(want.Timestamp) {
		t.Errorf("timestamp = %v, want %v", got.Timestamp, want.Timestamp)
	}
	for _, h := range want.Headers {
		if v, ok := sinktest.Header(got, h.Key); !ok || v != string(h.Value) {
			t.Errorf("header %s = %q (present %v), want %q; headers %v", h.Key, v, ok, h.Value, sinktest.HeaderList(got))
		}
	}
}

func TestDelivered(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	done := sinktest.NewOutcomes()
	rec := baseRecord(topic, []byte(`{"a":1}`))
	want := *rec
	want.Headers = append([]router.Header(nil), rec.Headers...)
	sinktest.Produce(ctx, t, s, rec, done)
	// rec may be reused once Produce returns.
	rec.Topic, rec.Key, rec.Value, rec.Headers = "other", nil, nil, rec.Headers[:0]

	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	// Flush returns only after every outcome was delivered.
	select {
	case o := <-done.C():
		if o != (sink.Outcome{}) {
			t.Fatalf("outcome = %+v, want a plain delivery", o)
		}
	default:
		t.Fatal("Flush returned before the outcome")
	}
	done.None(t, 50*time.Millisecond)

	got := sinktest.Consume(ctx, t, c, topic, 1)[0]
	checkOriginal(t, got, &want)
	if string(got.Value) != `{"a":1}` {
		t.Errorf("value = %q", got.Value)
	}
	if len(got.Headers) != len(want.Headers) {
		t.Errorf("headers = %v, want exactly %d", sinktest.HeaderList(got), len(want.Headers))
	}
	for i, h := range want.Headers {
		if i < len(got.Headers) && got.Headers[i].Key != h.Key {
			t.Errorf("header %d = %q, want %q (order kept)", i, got.Headers[i].Key, h.Key)
		}
	}
}

func TestDeliveredTombstoneAndManyHeaders(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	done := sinktest.NewOutcomes()
	rec := baseRecord(topic, nil)
	for i := 0; i < 12; i++ { // more than the sink's inline header room
		rec.Headers = append(rec.Headers, router.Header{Key: fmt.Sprintf("h%d", i), Value: []byte{byte('a' + i)}})
	}
	sinktest.Produce(ctx, t, s, rec, done)
	if o := done.Wait(ctx, t); o != (sink.Outcome{}) {
		t.Fatalf("outcome = %+v", o)
	}
	got := sinktest.Consume(ctx, t, c, topic, 1)[0]
	if got.Value != nil {
		t.Errorf("value = %q, want a tombstone", got.Value)
	}
	checkOriginal(t, got, rec)
	if len(got.Headers) != len(rec.Headers) {
		t.Errorf("%d headers, want %d", len(got.Headers), len(rec.Headers))
	}
}

func TestTooLargeForBatch(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil, kgo.ProducerBatchMaxBytes(2048))
	done := sinktest.NewOutcomes()
	rec := baseRecord(topic, bytes.Repeat([]byte("x"), 10<<10))
	sinktest.Produce(ctx, t, s, rec, done)

	o := done.Wait(ctx, t)
	if o.Err != nil || !o.DeadLettered {
		t.Fatalf("outcome = %+v, want dead-lettered", o)
	}
	if !strings.Contains(o.Reason, "topic "+topic) || !strings.Contains(o.Reason, "MESSAGE_TOO_LARGE") {
		t.Errorf("reason %q does not name the topic and the error", o.Reason)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	done.None(t, 50*time.Millisecond)

	got := sinktest.Consume(ctx, t, c, dlq, 1)[0]
	if v, _ := sinktest.Header(got, "error"); v != o.Reason {
		t.Errorf("error header = %q, want the outcome's reason %q", v, o.Reason)
	}
	if got.Headers[0].Key != "error" {
		t.Errorf("first header is %q, want error", got.Headers[0].Key)
	}
	if v, _ := sinktest.Header(got, "topic"); v != topic {
		t.Errorf("topic header = %q, want %q", v, topic)
	}
	// The dead-letter copy is too large as well: it goes without payload.
	if got.Value != nil {
		t.Errorf("dead-letter value has %d bytes, want nil (payload omitted)", len(got.Value))
	}
	if v, ok := sinktest.Header(got, "payload_omitted"); !ok || !strings.Contains(v, "MESSAGE_TOO_LARGE") {
		t.Errorf("payload_omitted header = %q (present %v)", v, ok)
	}
	checkOriginal(t, got, rec)
	sinktest.Consume(ctx, t, c, topic, 0)
}

func TestBrokerRefusesTooLarge(t *testing.T) {
	// The broker, not the client, refuses the record (topic max.message.bytes):
	// the dead-letter copy fits and keeps the payload.
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	sinktest.CreateTopic(ctx, t, s.Client(), "small", map[string]string{"max.message.bytes": "1024"})
	done := sinktest.NewOutcomes()
	payload := bytes.Repeat([]byte("y"), 4<<10)
	rec := baseRecord("small", payload)
	sinktest.Produce(ctx, t, s, rec, done)

	o := done.Wait(ctx, t)
	if o.Err != nil || !o.DeadLettered || !strings.Contains(o.Reason, "small") {
		t.Fatalf("outcome = %+v, want dead-lettered with a reason naming the topic", o)
	}
	got := sinktest.Consume(ctx, t, c, dlq, 1)[0]
	if !bytes.Equal(got.Value, payload) {
		t.Errorf("dead-letter value has %d bytes, want the %d-byte payload", len(got.Value), len(payload))
	}
	if _, ok := sinktest.Header(got, "payload_omitted"); ok {
		t.Error("payload_omitted set although the payload fits the dead-letter topic")
	}
	if v, _ := sinktest.Header(got, "topic"); v != "small" {
		t.Errorf("topic header = %q", v)
	}
	checkOriginal(t, got, rec)

	// The producer is still usable afterwards.
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("after")), done)
	if o := done.Wait(ctx, t); o != (sink.Outcome{}) {
		t.Fatalf("next record: outcome = %+v", o)
	}
}

func TestAddressedToDLQ(t *testing.T) {
	// The router dead-letters a NULL aggregate_id itself: the record is
	// already addressed to the DLQ with its error header.
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	done := sinktest.NewOutcomes()
	rec := &router.Record{
		Topic: dlq,
		Key:   []byte("ev-7"),
		Value: []byte(`{}`),
		Headers: []router.Header{
			{Key: wire.HeaderError, Value: []byte("aggregate_id is NULL")},
			{Key: wire.HeaderID, Value: []byte("ev-7")},
		},
		Timestamp: commit,
	}
	sinktest.Produce(ctx, t, s, rec, done)
	o := done.Wait(ctx, t)
	if o.Err != nil || !o.DeadLettered || o.Reason != "aggregate_id is NULL" {
		t.Fatalf("outcome = %+v, want dead-lettered with the router's reason", o)
	}
	got := sinktest.Consume(ctx, t, c, dlq, 1)[0]
	checkOriginal(t, got, rec)
	if _, ok := sinktest.Header(got, "topic"); ok {
		t.Error("a record produced to the DLQ directly got a topic header")
	}
	done.None(t, 10*time.Millisecond)
}

// failProduces makes the next n produce requests for topic (named or, from
// produce v13 on, addressed by id) fail with code; other topics' requests
// are untouched. It returns the number of requests it failed so far.
func failProduces(ctx context.Context, t *testing.T, c *kfake.Cluster, s *sink.Sink, topic string, n int32, code int16) *atomic.Int32 {
	id := sinktest.TopicID(ctx, t, s.Client(), topic)
	var failed atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		ours := false
		for _, rt := range req.Topics {
			ours = ours || rt.Topic == topic || rt.TopicID == id
		}
		if !ours || failed.Load() >= n {
			return nil, nil, false
		}
		failed.Add(1)
		return sinktest.ProduceRefused(req, code), nil, true
	})
	return &failed
}

func TestTransientErrorsAreRetried(t *testing.T) {
	for _, e := range []*kerr.Error{kerr.NotLeaderForPartition, kerr.NotEnoughReplicas, kerr.RequestTimedOut} {
		t.Run(e.Message, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			s := newSink(t, c, nil)
			failed := failProduces(ctx, t, c, s, topic, 3, e.Code)
			done := sinktest.NewOutcomes()
			rec := baseRecord(topic, []byte("transient"))
			sinktest.Produce(ctx, t, s, rec, done)
			if o := done.Wait(ctx, t); o != (sink.Outcome{}) {
				t.Fatalf("outcome = %+v, want a plain delivery", o)
			}
			if n := failed.Load(); n != 3 {
				t.Fatalf("%d produce requests failed, want 3: the fault was not exercised", n)
			}
			got := sinktest.Consume(ctx, t, c, topic, 1)
			checkOriginal(t, got[0], rec)
			sinktest.Consume(ctx, t, c, dlq, 0)
			done.None(t, 10*time.Millisecond)
		})
	}
}

func TestFatalError(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	failProduces(ctx, t, c, s, topic, 1, kerr.TopicAuthorizationFailed.Code)
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("v")), done)
	o := done.Wait(ctx, t)
	if o.Err == nil || o.DeadLettered || !errors.Is(o.Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("outcome = %+v, want a fatal TOPIC_AUTHORIZATION_FAILED", o)
	}
	if sink.Classify(o.Err) != sink.ClassFatal {
		t.Fatalf("Classify(%v) = %v", o.Err, sink.Classify(o.Err))
	}
	sinktest.Consume(ctx, t, c, dlq, 0)
	done.None(t, 10*time.Millisecond)
}

func TestCloseFailsBuffered(t *testing.T) {
	// A record still buffered at Close gets a shutdown outcome, exactly once.
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, closeSink := sinktest.NewSink(t, c, nil, nil)
	// Park every produce request until the cluster closes.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-ctx.Done() })
		return nil, nil, false
	})
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("v")), done)
	closeFailsAll(ctx, t, closeSink, done, 1)
}

func TestNewRejectsCompression(t *testing.T) {
	if _, err := sink.New(sink.Config{Brokers: []string{"127.0.0.1:1"}, Compression: "brotli"},
		slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "kafka.compression") {
		t.Fatalf("New with compression brotli: %v, want an error naming kafka.compression", err)
	}
	for _, name := range []string{"", "none", "gzip", "snappy", "lz4", "zstd"} {
		s, err := sink.New(sink.Config{Brokers: []string{"127.0.0.1:1"}, Compression: name},
			slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("New with compression %q: %v", name, err)
		}
		s.Close()
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want sink.Class
	}{
		{"message too large", kerr.MessageTooLarge, sink.ClassUnpublishable},
		{"wrapped message too large", fmt.Errorf("%w (uncompressed_bytes=1)", kerr.MessageTooLarge), sink.ClassUnpublishable},
		{"wrapped invalid topic", fmt.Errorf("%w", kerr.InvalidTopicException), sink.ClassUnpublishable},
		{"record list too large", kerr.RecordListTooLarge, sink.ClassUnpublishable},
		{"unknown topic", kerr.UnknownTopicOrPartition, sink.ClassUnpublishable},
		{"unknown topic id", kerr.UnknownTopicID, sink.ClassUnpublishable},
		{"invalid record", kerr.InvalidRecord, sink.ClassUnpublishable},
		{"corrupt message", kerr.CorruptMessage, sink.ClassUnpublishable},
		{"policy violation", kerr.PolicyViolation, sink.ClassUnpublishable},
		{"invalid timestamp", kerr.InvalidTimestamp, sink.ClassUnpublishable},
		{"wrapped invalid timestamp", fmt.Errorf("x: %w", kerr.InvalidTimestamp), sink.ClassUnpublishable},
		{"client closed", kgo.ErrClientClosed, sink.ClassShutdown},
		{"wrapped client closed", fmt.Errorf("x: %w", kgo.ErrClientClosed), sink.ClassShutdown},
		{"aborting", kgo.ErrAborting, sink.ClassShutdown},
		{"context canceled", context.Canceled, sink.ClassShutdown},
		{"deadline exceeded", context.DeadlineExceeded, sink.ClassShutdown},
		{"topic authorization", kerr.TopicAuthorizationFailed, sink.ClassFatal},
		{"cluster authorization", kerr.ClusterAuthorizationFailed, sink.ClassFatal},
		{"plain error", errors.New("x"), sink.ClassFatal},
		{"record timeout", kgo.ErrRecordTimeout, sink.ClassFatal},
		{"out of order sequence", kerr.OutOfOrderSequenceNumber, sink.ClassFatal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sink.Classify(tc.err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// gateHandler blocks the dead-letter worker inside its log call until
// release is closed.
type gateHandler struct {
	entered chan struct{}
	release chan struct{}
}

func (h *gateHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *gateHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *gateHandler) WithGroup(string) slog.Handler            { return h }
func (h *gateHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "dead-lettering record" {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return nil
}

// TestFlushWaitsForDeadLetterCopies: Flush waits for every outcome, also
// while a topic worker holds a refused record outside the client (once a
// bug: Flush looked only at the client and the dead-letter queue). The gate
// holds the worker in its log call before it produces the copy.
func TestFlushWaitsForDeadLetterCopies(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	gate := &gateHandler{entered: make(chan struct{}, 1), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(gate.release)
		}
	}
	t.Cleanup(release) // registered after sinktest.NewCluster: runs before the sink closes
	s := newSink(t, c, slog.New(gate), kgo.ProducerBatchMaxBytes(2048))
	t.Cleanup(release) // and before Close, which waits for the worker
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, bytes.Repeat([]byte("x"), 10<<10)), done)
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("the dead-letter worker never started")
	}
	flushErr := make(chan error, 1)
	go func() { flushErr <- s.Flush(ctx) }()
	select {
	case err := <-flushErr:
		release()
		t.Errorf("Flush returned %v while a dead-letter copy was still unproduced (no outcome yet)", err)
	case <-time.After(500 * time.Millisecond): // observation window: Flush must not return while the copy is held
		release()
		if err := <-flushErr; err != nil {
			t.Fatalf("Flush: %v", err)
		}
	}
	if o := done.Wait(ctx, t); !o.DeadLettered {
		t.Fatalf("outcome = %+v", o)
	}
}

// TestProduceCanceledContext: Produce with a context already done returns
// its error and still reports the record once, with a shutdown outcome.
func TestProduceCanceledContext(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	done := sinktest.NewOutcomes()
	err := s.Produce(canceled, baseRecord(topic, []byte("v")), done)
	if err == nil {
		t.Fatal("Produce with a canceled context returned nil")
	}
	o := done.Wait(ctx, t)
	if o.Err == nil || sink.Classify(o.Err) != sink.ClassShutdown {
		t.Fatalf("outcome %+v, want one shutdown outcome", o)
	}
}

// TestCancelAfterProduceFailsBufferedRecord: the ctx given to Produce keeps
// governing the record after Produce returned nil (franz-go fails a batch
// not yet sent when its Produce context ends), as documented. That is why
// the pipeline produces under a context that outlives the drain.
func TestCancelAfterProduceFailsBufferedRecord(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// Park the first produce request so the second record stays buffered.
	release := make(chan struct{})
	parked := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case parked <- struct{}{}:
			c.SleepControl(func() {
				select {
				case <-release:
				case <-ctx.Done():
				}
			})
		default:
		}
		return nil, nil, false
	})
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := sinktest.NewOutcomes()
	sinktest.Produce(pctx, t, s, baseRecord(topic, []byte("1")), done)
	select {
	case <-parked:
	case <-ctx.Done():
		t.Fatal("no produce request")
	}
	sinktest.Produce(pctx, t, s, baseRecord(topic, []byte("2")), done) // returns nil: accepted
	// E.g. SIGTERM: stop reading, then drain. cancel has closed pctx's Done
	// when it returns, and the second record cannot be sent before the
	// parked request is answered, so it is still buffered now.
	cancel()
	close(release)
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	// The first record was in flight and is delivered; the second, still
	// buffered when its context ended, fails with a shutdown outcome (not
	// acknowledged, so it is sent again after a restart: never lost).
	var delivered, shutdown int
	for i := 1; i <= 2; i++ {
		o := done.Wait(ctx, t)
		switch {
		case o == (sink.Outcome{}):
			delivered++
		case o.Err != nil && sink.Classify(o.Err) == sink.ClassShutdown:
			shutdown++
		default:
			t.Errorf("record %d: unexpected outcome %+v", i, o)
		}
	}
	if delivered != 1 || shutdown != 1 {
		t.Fatalf("delivered %d, shutdown %d; want 1 and 1", delivered, shutdown)
	}
}
