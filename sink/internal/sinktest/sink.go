package sinktest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// The idempotent producer on a kfake cluster, for the tests of package
// sink and of the packages it calls (sink/quarantine): a sink, what it
// produced, and the outcome of each record.

// NewSink creates a sink on c (DLQ its dead-letter topic, tune's change
// to its configuration, if set) and returns it with its Close: Close may
// be called only once, so tests that close it themselves go through the
// returned func. It is closed before the cluster (cleanups run
// last-in first-out).
func NewSink(t *testing.T, c *kfake.Cluster, log *slog.Logger, tune func(*sink.Config), opts ...kgo.Opt) (*sink.Sink, func()) {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg := sink.Config{
		Brokers:  c.ListenAddrs(),
		ClientID: "sink-test",
		DLQTopic: DLQ,
		// Fast metadata refreshes keep the unknown-topic test short.
		TestOpts: append([]kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond),
			kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}, opts...),
	}
	if tune != nil {
		tune(&cfg)
	}
	s, err := sink.New(cfg, log)
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	closeOnce := sync.OnceFunc(s.Close)
	t.Cleanup(closeOnce)
	return s, closeOnce
}

// Produce hands rec to s, failing the test if Produce refuses it.
func Produce(ctx context.Context, t *testing.T, s *sink.Sink, rec *router.Record, done sink.Done) {
	t.Helper()
	if err := s.Produce(ctx, rec, done); err != nil {
		t.Fatalf("Produce: %v", err)
	}
}

// Consume reads n records of topic from the start, failing the test if
// they do not arrive before ctx ends, and then checks briefly that no more
// arrive.
func Consume(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records from %s: %v", len(recs), n, topic, err)
		}
		fs.EachError(func(tp string, p int32, err error) {
			t.Logf("fetch %s/%d: %v", tp, p, err)
		})
		recs = append(recs, fs.Records()...)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	recs = append(recs, cl.PollFetches(short).Records()...)
	if len(recs) != n {
		t.Fatalf("%s holds %d records, want %d", topic, len(recs), n)
	}
	return recs
}

// HeaderList is r's headers as key=value, in order, for messages.
func HeaderList(r *kgo.Record) []string {
	var out []string
	for _, h := range r.Headers {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

// Results collects the outcome of each of n records by index; Slot(i) is
// record i's Done. Only the test goroutine fails the test.
type Results struct {
	ch chan Result
}

// Result is record I's outcome O (I -1: an outcome past the slots' room).
type Result struct {
	I int
	O sink.Outcome
}

type slot struct {
	i  int
	ch chan Result
}

func (s slot) Delivered(o sink.Outcome) {
	select {
	case s.ch <- Result{s.i, o}:
	default: // more outcomes than records: All reports it
		s.ch <- Result{-1, o}
	}
}

// NewResults has room for the outcomes of n records.
func NewResults(n int) *Results { return &Results{ch: make(chan Result, n+16)} }

// Slot is record i's Done.
func (r *Results) Slot(i int) sink.Done { return slot{i, r.ch} }

// C hands the outcomes over as they come, for tests that watch their
// order or their absence.
func (r *Results) C() <-chan Result { return r.ch }

// All waits for n outcomes, one per record, and checks that no record has
// two.
func (r *Results) All(ctx context.Context, t *testing.T, n int) []sink.Outcome {
	t.Helper()
	out := make([]sink.Outcome, n)
	seen := make([]bool, n)
	for range n {
		select {
		case x := <-r.ch:
			if x.I < 0 || seen[x.I] {
				t.Fatalf("record %d has a second outcome %+v", x.I, x.O)
			}
			seen[x.I], out[x.I] = true, x.O
		case <-ctx.Done():
			t.Fatalf("outcomes: %v", ctx.Err())
		}
	}
	select {
	case x := <-r.ch:
		t.Fatalf("extra outcome for record %d: %+v", x.I, x.O)
	case <-time.After(50 * time.Millisecond): // observation window for an absence: no extra outcome
	}
	return out
}

// RefusePoison refuses, as over a limit the sink did not know, every batch
// of Topic that holds a record with "poison" in it. The first request waits
// until release is closed, so that the poison record, buffered by then, is
// refused in a batch with others.
func RefusePoison(ctx context.Context, c *kfake.Cluster, names map[[16]byte]string) (release chan struct{}, refused, most *atomic.Int32) {
	release = make(chan struct{})
	var waited atomic.Bool
	refused, most = Refuse(c, names, func() {
		if waited.CompareAndSwap(false, true) {
			c.SleepControl(func() {
				select {
				case <-release:
				case <-ctx.Done():
				}
			})
		}
	}, func(tp string, b []byte) int16 {
		if tp == Topic && bytes.Contains(b, []byte("poison")) {
			return kerr.MessageTooLarge.Code
		}
		return 0
	})
	return release, refused, most
}

// CheckSequence checks that recs hold the values %04d from 0 to n-1 except
// skip, in that order.
func CheckSequence(t *testing.T, recs []*kgo.Record, n, skip int) {
	t.Helper()
	i := 0
	for _, r := range recs {
		if i == skip {
			i++
		}
		if want := fmt.Sprintf("%04d", i); string(r.Value) != want {
			t.Fatalf("record at offset %d (partition %d) is %q, want %q: order or completeness broken", r.Offset, r.Partition, r.Value, want)
		}
		i++
	}
	if i != n {
		t.Fatalf("sequence ends at %d, want %d", i, n)
	}
}
