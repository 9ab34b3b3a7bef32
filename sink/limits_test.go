package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestOnlyTheRefusedRecordIsDeadLettered: the broker refuses (here: as if
// over a limit the sink did not know) every batch that holds one record, so
// franz-go fails all records buffered for the partition with it, and records
// keep coming while it does. Only that record is dead-lettered; every other
// one is delivered once, in order.
func TestOnlyTheRefusedRecordIsDeadLettered(t *testing.T) {
	const n, poison = 600, 300
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	names := sinktest.TopicNames(ctx, t, s.Client(), topic, dlq)
	release, refused, most := sinktest.RefusePoison(ctx, c, names)
	res := sinktest.NewResults(n)
	for i := range n {
		v := fmt.Sprintf("%04d", i)
		if i == poison {
			v += "-poison"
		}
		sinktest.Produce(ctx, t, s, baseRecord(topic, []byte(v)), res.Slot(i))
		if i == poison {
			close(release) // and go on producing while the refusal comes back
		}
	}
	for i, o := range res.All(ctx, t, n) {
		switch {
		case i == poison:
			if !o.DeadLettered || !strings.Contains(o.Reason, "MESSAGE_TOO_LARGE") {
				t.Errorf("poison record: outcome %+v, want dead-lettered for MESSAGE_TOO_LARGE", o)
			}
		case o != (sink.Outcome{}):
			t.Errorf("record %d: outcome %+v, want a plain delivery", i, o)
		}
	}
	if most.Load() < 2 {
		t.Fatalf("refused batches held at most %d records: the neighbours were never refused with it", most.Load())
	}
	if refused.Load() < 2 {
		t.Fatalf("%d refusals, want the batch's and the record's alone", refused.Load())
	}
	sinktest.CheckSequence(t, sinktest.Consume(ctx, t, c, topic, n-1), n, poison)
	if got := sinktest.Consume(ctx, t, c, dlq, 1)[0]; !bytes.HasSuffix(got.Value, []byte("-poison")) {
		t.Errorf("dead letter %q is not the poison record", got.Value)
	}
}

// TestRecordsOverTheLimitNeverSent: a record over its topic's
// max.message.bytes, counted as the broker counts it, is dead-lettered
// before it is produced; one exactly at the limit is delivered.
func TestRecordsOverTheLimitNeverSent(t *testing.T) {
	const limit = 2048
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	sinktest.CreateTopic(ctx, t, s.Client(), "sized", map[string]string{"max.message.bytes": fmt.Sprint(limit)})
	names := sinktest.TopicNames(ctx, t, s.Client(), "sized")
	var oversent atomic.Int32
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == "sized" && len(b) > limit {
			oversent.Add(1)
		}
		return 0 // the broker answers
	})
	// sized returns a record whose batch is exactly n bytes.
	sized := func(n int) *router.Record {
		rec := baseRecord("sized", nil)
		rec.Value = []byte{}
		for sink.BatchSize(rec) < n {
			rec.Value = append(rec.Value, 'v')
		}
		if got := sink.BatchSize(rec); got != n {
			t.Fatalf("cannot build a %d-byte record (got %d)", n, got)
		}
		return rec
	}
	bigKey := baseRecord("sized", []byte("small"))
	bigKey.Key = bytes.Repeat([]byte("k"), 3000)
	bigHeaders := baseRecord("sized", []byte("small"))
	bigHeaders.Headers = append(bigHeaders.Headers, router.Header{Key: "blob", Value: bytes.Repeat([]byte("h"), 3000)})
	tests := []struct {
		name string
		rec  *router.Record
		dead bool
	}{
		{"at the limit", sized(limit), false},
		{"one byte over", sized(limit + 1), true},
		{"key alone over", bigKey, true},
		{"headers alone over", bigHeaders, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done := sinktest.NewOutcomes()
			size := sink.BatchSize(tc.rec)
			sinktest.Produce(ctx, t, s, tc.rec, done)
			o := done.Wait(ctx, t)
			if o.Err != nil || o.DeadLettered != tc.dead {
				t.Fatalf("outcome %+v, want dead-lettered %v", o, tc.dead)
			}
			want := fmt.Sprintf("record of %d bytes exceeds max.message.bytes %d of topic sized", size, limit)
			if tc.dead && !strings.Contains(o.Reason, want) {
				t.Errorf("reason %q, want it to say %q", o.Reason, want)
			}
		})
	}
	if n := oversent.Load(); n != 0 {
		t.Fatalf("%d batches over the limit were sent to the broker", n)
	}
	sinktest.Consume(ctx, t, c, "sized", 1)
	sinktest.Consume(ctx, t, c, dlq, 3)
}

// TestBatchSizeMatchesTheBroker: BatchSize is the size of the record batch
// the broker receives for one record, for every shape of record.
func TestBatchSizeMatchesTheBroker(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	names := sinktest.TopicNames(ctx, t, s.Client(), topic)
	var last atomic.Int32
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == topic {
			last.Store(int32(len(b)))
		}
		return 0
	})
	shape := func(f func(r *router.Record)) *router.Record {
		r := baseRecord(topic, []byte("value"))
		f(r)
		return r
	}
	tests := []struct {
		name string
		rec  *router.Record
	}{
		{"usual", shape(func(*router.Record) {})},
		{"nil key", shape(func(r *router.Record) { r.Key = nil })},
		{"long key", shape(func(r *router.Record) { r.Key = bytes.Repeat([]byte("k"), 200) })},
		{"tombstone", shape(func(r *router.Record) { r.Value = nil })},
		{"empty value", shape(func(r *router.Record) { r.Value = []byte{} })},
		{"value needing a 3-byte length", shape(func(r *router.Record) { r.Value = bytes.Repeat([]byte("v"), 20000) })},
		{"no headers", shape(func(r *router.Record) { r.Headers = nil })},
		{"nil header value", shape(func(r *router.Record) { r.Headers = append(r.Headers, router.Header{Key: "n"}) })},
		{"long header key", shape(func(r *router.Record) {
			r.Headers = append(r.Headers, router.Header{Key: strings.Repeat("h", 200), Value: []byte("x")})
		})},
		{"many headers", shape(func(r *router.Record) {
			for i := range 70 {
				r.Headers = append(r.Headers, router.Header{Key: fmt.Sprint("h", i), Value: []byte("x")})
			}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done := sinktest.NewOutcomes()
			sinktest.Produce(ctx, t, s, tc.rec, done) // alone: the previous one is acknowledged
			if o := done.Wait(ctx, t); o != (sink.Outcome{}) {
				t.Fatalf("outcome %+v", o)
			}
			if got, want := sink.BatchSize(tc.rec), int(last.Load()); got != want {
				t.Fatalf("BatchSize = %d, the broker received %d bytes", got, want)
			}
		})
	}
}

// TestBrokerRefusals: a record refused once with its batch is sent again
// alone and delivered; one refused again alone is dead-lettered with the
// refusal; a refusal of the whole topic dead-letters at once.
func TestBrokerRefusals(t *testing.T) {
	tests := []struct {
		err    *kerr.Error
		times  int32 // how many requests the topic refuses
		dead   bool
		tries  int32 // refusals expected
		reason string
	}{
		{kerr.MessageTooLarge, 1, false, 1, ""},
		{kerr.PolicyViolation, 1, false, 1, ""},
		{kerr.InvalidRecord, 1, false, 1, ""},
		{kerr.InvalidTimestamp, 1, false, 1, ""},
		{kerr.RecordListTooLarge, 1, false, 1, ""},
		{kerr.MessageTooLarge, 99, true, 2, "MESSAGE_TOO_LARGE"},
		{kerr.PolicyViolation, 99, true, 2, "POLICY_VIOLATION"},
		{kerr.InvalidTopicException, 99, true, 1, "INVALID_TOPIC_EXCEPTION"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s x%d", tc.err.Message, tc.times), func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			s := newSink(t, c, nil)
			failed := failProduces(ctx, t, c, s, topic, tc.times, tc.err.Code)
			done := sinktest.NewOutcomes()
			rec := baseRecord(topic, []byte("refused"))
			sinktest.Produce(ctx, t, s, rec, done)
			o := done.Wait(ctx, t)
			if o.Err != nil || o.DeadLettered != tc.dead || !strings.Contains(o.Reason, tc.reason) {
				t.Fatalf("outcome %+v, want dead-lettered %v with %q", o, tc.dead, tc.reason)
			}
			if n := failed.Load(); n != tc.tries {
				t.Errorf("%d refusals, want %d", n, tc.tries)
			}
			where, other := topic, dlq
			if tc.dead {
				where, other = dlq, topic
			}
			got := sinktest.Consume(ctx, t, c, where, 1)[0]
			if string(got.Value) != "refused" {
				t.Errorf("value %q", got.Value)
			}
			checkOriginal(t, got, rec)
			sinktest.Consume(ctx, t, c, other, 0)
			done.None(t, 10*time.Millisecond)
		})
	}
}

// TestInvalidTimestampDeadLettered: a record whose timestamp the broker
// refuses is dead-lettered whole, under the current time, which the
// dead-letter topic (with the same rule) accepts.
func TestInvalidTimestampDeadLettered(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s := newSink(t, c, nil)
	names := sinktest.TopicNames(ctx, t, s.Client(), topic, dlq)
	tooOld := func(b []byte) bool {
		var rb kmsg.RecordBatch
		return rb.ReadFrom(b) == nil && rb.FirstTimestamp < time.Now().Add(-time.Hour).UnixMilli()
	}
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tooOld(b) {
			return kerr.InvalidTimestamp.Code
		}
		return 0
	})
	done := sinktest.NewOutcomes()
	rec := baseRecord(topic, []byte("stale"))
	rec.Timestamp = time.Now().Add(-48 * time.Hour)
	before := time.Now().Truncate(time.Millisecond)
	sinktest.Produce(ctx, t, s, rec, done)
	o := done.Wait(ctx, t)
	if !o.DeadLettered || !strings.Contains(o.Reason, "INVALID_TIMESTAMP") {
		t.Fatalf("outcome %+v, want dead-lettered for INVALID_TIMESTAMP", o)
	}
	got := sinktest.Consume(ctx, t, c, dlq, 1)[0]
	if string(got.Value) != "stale" {
		t.Errorf("dead letter value %q, want the payload", got.Value)
	}
	if got.Timestamp.Before(before) {
		t.Errorf("dead letter timestamp %v, want the time it was dead-lettered (after %v)", got.Timestamp, before)
	}
	sinktest.Consume(ctx, t, c, topic, 0)
}

// TestDeadLetterCopies: a dead letter the dead-letter topic refuses is sent
// again alone, then without its payload, then as a minimal record; refused
// even so, the outcome is fatal and names the dead-letter topic.
func TestDeadLetterCopies(t *testing.T) {
	bigKey := bytes.Repeat([]byte("k"), 3000)
	tests := []struct {
		name      string
		refuse    func(b []byte) bool // the dead-letter topic's rule
		payload   bool                // the copy keeps the payload
		minimal   bool                // the copy is the minimal one
		fatal     bool
		refusals  int32
		errorCode *kerr.Error
	}{
		{"refused once: sent again whole", nil, true, false, false, 1, kerr.MessageTooLarge},
		{"refuses payloads: sent without", func(b []byte) bool { return len(b) > 1500 }, false, false, false, 2, kerr.MessageTooLarge},
		{"refuses big keys: minimal copy", func(b []byte) bool { return len(b) > 1000 }, false, true, false, 3, kerr.MessageTooLarge},
		{"refuses everything: fatal", func([]byte) bool { return true }, false, false, true, 4, kerr.PolicyViolation},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			s := newSink(t, c, nil)
			names := sinktest.TopicNames(ctx, t, s.Client(), topic, dlq)
			var once atomic.Bool
			refusals, _ := sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
				switch {
				case tp == topic:
					return kerr.InvalidTopicException.Code
				case tp != dlq:
				case tc.refuse == nil && once.CompareAndSwap(false, true), tc.refuse != nil && tc.refuse(b):
					return tc.errorCode.Code
				}
				return 0
			})
			done := sinktest.NewOutcomes()
			rec := baseRecord(topic, bytes.Repeat([]byte("p"), 2000))
			if tc.minimal || tc.fatal {
				rec.Key = bigKey
			}
			before := time.Now().Truncate(time.Millisecond)
			sinktest.Produce(ctx, t, s, rec, done)
			o := done.Wait(ctx, t)
			if n := refusals.Load(); n != 1+tc.refusals {
				t.Errorf("%d refusals, want 1 by the topic and %d by the dead-letter topic", n, tc.refusals)
			}
			if tc.fatal {
				if o.Err == nil || !errors.Is(o.Err, tc.errorCode) || !strings.Contains(o.Err.Error(), dlq) {
					t.Fatalf("outcome %+v, want a fatal %s naming %s", o, tc.errorCode.Message, dlq)
				}
				sinktest.Consume(ctx, t, c, dlq, 0)
				return
			}
			if o.Err != nil || !o.DeadLettered || !strings.Contains(o.Reason, "INVALID_TOPIC_EXCEPTION") {
				t.Fatalf("outcome %+v, want dead-lettered with the topic's refusal", o)
			}
			got := sinktest.Consume(ctx, t, c, dlq, 1)[0]
			if v, _ := sinktest.Header(got, "error"); v != o.Reason {
				t.Errorf("error header %q, want %q", v, o.Reason)
			}
			if v, _ := sinktest.Header(got, "topic"); v != topic {
				t.Errorf("topic header %q", v)
			}
			if v, _ := sinktest.Header(got, "id"); v != "ev-1" {
				t.Errorf("id header %q", v)
			}
			_, omitted := sinktest.Header(got, "payload_omitted")
			if tc.payload != (got.Value != nil) || tc.payload == omitted {
				t.Errorf("value of %d bytes, payload_omitted %v; want the payload kept: %v", len(got.Value), omitted, tc.payload)
			}
			_, cut := sinktest.Header(got, "truncated")
			switch {
			case tc.minimal != cut:
				t.Errorf("truncated header present %v, want %v (headers %v)", cut, tc.minimal, sinktest.HeaderList(got))
			case tc.minimal:
				if len(got.Key) != 64 || got.Timestamp.Before(before) {
					t.Errorf("minimal copy: key %d bytes, timestamp %v; want 64 bytes and the current time", len(got.Key), got.Timestamp)
				}
				if _, ok := sinktest.Header(got, "event_type"); ok {
					t.Errorf("minimal copy keeps other headers: %v", sinktest.HeaderList(got))
				}
			default:
				checkOriginal(t, got, rec)
			}
			done.None(t, 20*time.Millisecond)
		})
	}
}

// TestUnknownTopicTimesOut: records for a topic that does not appear wait
// for kafka.unknown_topic_timeout, then go to the dead-letter topic saying
// so; other topics are not held up meanwhile.
func TestUnknownTopicTimesOut(t *testing.T) {
	const timeout = 500 * time.Millisecond
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) { cfg.UnknownTopicTimeout = timeout })
	res := sinktest.NewResults(4)
	for i := range 3 {
		sinktest.Produce(ctx, t, s, baseRecord("no-such-topic", []byte(fmt.Sprintf("%04d", i))), res.Slot(i))
	}
	start := time.Now()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("other")), res.Slot(3))
	out := res.All(ctx, t, 4)
	if waited := time.Since(start); waited < timeout {
		t.Errorf("dead-lettered after %v, before the %v timeout", waited, timeout)
	}
	if out[3] != (sink.Outcome{}) {
		t.Errorf("record for an existing topic: %+v", out[3])
	}
	for i, o := range out[:3] {
		if !o.DeadLettered || !strings.Contains(o.Reason, "topic no-such-topic did not exist for 500ms") ||
			!strings.Contains(o.Reason, "UNKNOWN_TOPIC_OR_PARTITION") {
			t.Errorf("record %d: outcome %+v, want dead-lettered for the missing topic", i, o)
		}
	}
	recs := sinktest.Consume(ctx, t, c, dlq, 3)
	sinktest.CheckSequence(t, recs, 3, -1)
	if v, _ := sinktest.Header(recs[0], "topic"); v != "no-such-topic" {
		t.Errorf("topic header %q", v)
	}
	// Still missing: the next record goes to the dead-letter topic at once.
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord("no-such-topic", []byte("later")), done)
	if o := done.Wait(ctx, t); !o.DeadLettered {
		t.Fatalf("record after the timeout: outcome %+v", o)
	}
}

// TestUnknownTopicCreatedLate: records for a topic created some time after
// they were produced wait for it and are all delivered, in order; nothing
// goes to the dead-letter topic.
func TestUnknownTopicCreatedLate(t *testing.T) {
	const n = 200
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	// Count the sink's lookups of the topic (metadata requests naming it).
	var lookups atomic.Int64
	c.ControlKey(int16(kmsg.Metadata), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range kr.(*kmsg.MetadataRequest).Topics {
			if tp.Topic != nil && *tp.Topic == "late" {
				lookups.Add(1)
			}
		}
		return nil, nil, false
	})
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) { cfg.UnknownTopicTimeout = 20 * time.Second })
	res := sinktest.NewResults(n)
	for i := range n / 2 {
		sinktest.Produce(ctx, t, s, baseRecord("late", []byte(fmt.Sprintf("%04d", i))), res.Slot(i))
	}
	// Lookups find it missing: the first, and at least one more by the
	// worker that keeps looking for it.
	for lookups.Load() < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d lookups of the missing topic: %v", lookups.Load(), ctx.Err())
		case <-time.After(10 * time.Millisecond): // poll interval of the lookup count
		}
	}
	select {
	case x := <-res.C():
		t.Fatalf("record %d has an outcome before its topic exists: %+v", x.I, x.O)
	default:
	}
	adm := kadm.NewClient(s.Client())
	if _, err := adm.CreateTopic(ctx, 2, 1, nil, "late"); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	for i := n / 2; i < n; i++ {
		sinktest.Produce(ctx, t, s, baseRecord("late", []byte(fmt.Sprintf("%04d", i))), res.Slot(i))
	}
	for i, o := range res.All(ctx, t, n) {
		if o != (sink.Outcome{}) {
			t.Fatalf("record %d: outcome %+v, want a plain delivery", i, o)
		}
	}
	sinktest.CheckSequence(t, sinktest.Consume(ctx, t, c, "late", n), n, -1)
	sinktest.Consume(ctx, t, c, dlq, 0)
}

// logRecorder keeps log messages with their attributes.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	h.mu.Lock()
	h.lines = append(h.lines, line)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) find(s string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.lines {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// TestAutoCreateTopics: with auto-creation on, a missing topic is created
// with the stated partitions and replication factor, and the creation is
// logged; with it off, nothing is created.
func TestAutoCreateTopics(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("auto_create_topics=", on), func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			logs := &logRecorder{}
			s, _ := sinktest.NewSink(t, c, slog.New(logs), func(cfg *sink.Config) {
				cfg.AutoCreateTopics, cfg.TopicPartitions, cfg.TopicReplicationFactor = on, 2, 1
				cfg.UnknownTopicTimeout = 300 * time.Millisecond
			})
			done := sinktest.NewOutcomes()
			sinktest.Produce(ctx, t, s, baseRecord("fresh", []byte("v")), done)
			o := done.Wait(ctx, t)
			td, err := kadm.NewClient(s.Client()).ListTopics(ctx, "fresh")
			if err != nil {
				t.Fatalf("list topics: %v", err)
			}
			if !on {
				if !o.DeadLettered || td.Has("fresh") && td["fresh"].Err == nil {
					t.Fatalf("outcome %+v, topic %+v: want dead-lettered and no topic", o, td["fresh"])
				}
				return
			}
			if o != (sink.Outcome{}) {
				t.Fatalf("outcome %+v, want a plain delivery", o)
			}
			if got := len(td["fresh"].Partitions); got != 2 {
				t.Errorf("created with %d partitions, want 2", got)
			}
			if l := logs.find("created topic"); !strings.Contains(l, "topic=fresh") || !strings.Contains(l, "partitions=2") ||
				!strings.Contains(l, "replication_factor=1") {
				t.Errorf("creation log %q lacks the topic or its settings", l)
			}
		})
	}
}

// TestCloseFailsHeldRecords: records held back for a missing topic get one
// shutdown outcome each at Close; Flush does not return nil while they wait.
func TestCloseFailsHeldRecords(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, closeSink := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) { cfg.UnknownTopicTimeout = time.Minute })
	res := sinktest.NewResults(3)
	for i := range 3 {
		sinktest.Produce(ctx, t, s, baseRecord("missing", []byte("v")), res.Slot(i))
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.Flush(short); err == nil {
		t.Fatal("Flush returned nil while records wait for their topic")
	}
	closeSink()
	for i, o := range res.All(ctx, t, 3) {
		if o.Err == nil || sink.Classify(o.Err) != sink.ClassShutdown {
			t.Errorf("record %d: outcome %+v, want a shutdown error", i, o)
		}
	}
}

// TestDataLossIsLogged: a broker that answers a produce with
// OUT_OF_ORDER_SEQUENCE_NUMBER after it acknowledged earlier records of the
// partition has lost them (unclean leader election, truncation). franz-go
// resets its sequence numbers and carries on; the sink says so at error
// level, naming the partition, and the record is still delivered.
func TestDataLossIsLogged(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	logs := &logRecorder{}
	s := newSink(t, c, slog.New(logs))
	first := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("0000")), first)
	if o := first.Wait(ctx, t); o != (sink.Outcome{}) {
		t.Fatalf("first record: %+v, want a plain delivery", o)
	}
	var lost atomic.Bool
	refused, _ := sinktest.Refuse(c, sinktest.TopicNames(ctx, t, s.Client(), topic), nil, func(string, []byte) int16 {
		if lost.CompareAndSwap(false, true) {
			return kerr.OutOfOrderSequenceNumber.Code // once
		}
		return 0
	})
	second := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("0001")), second)
	if o := second.Wait(ctx, t); o != (sink.Outcome{}) {
		t.Fatalf("record after the loss: %+v, want a plain delivery", o)
	}
	if refused.Load() != 1 {
		t.Fatalf("the broker answered %d produce requests with the loss, want 1", refused.Load())
	}
	sinktest.CheckSequence(t, sinktest.Consume(ctx, t, c, topic, 2), 2, -1)
	// franz-go calls the hook on a goroutine of its own.
	for logs.find("data loss detected") == "" {
		select {
		case <-ctx.Done():
			t.Fatal("no error-level log of the data loss")
		case <-time.After(10 * time.Millisecond): // polls the log recorder, which has no signal
		}
	}
	if l := logs.find("data loss detected"); !strings.Contains(l, "topic="+topic) || !strings.Contains(l, "partition=") {
		t.Errorf("data-loss log %q lacks the topic or partition", l)
	}
}
