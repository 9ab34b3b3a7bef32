package sink_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestGateGathersWhileInFlight: records produced while a produce request is
// outstanding wait for it and then leave together, in order, instead of
// each starting a request of its own.
func TestGateGathersWhileInFlight(t *testing.T) {
	const n = 100
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	// Requests are counted as the client writes them: kfake reads a
	// connection's requests one at a time, so it would not see the ones
	// queued behind a held request.
	var reqs atomic.Int32
	counted := atomic.Bool{}
	s := newSink(t, c, nil, kgo.WithHooks(producesWritten{&reqs, &counted}))
	done := sinktest.OutcomesFor(n + 2)

	// The topic is looked up and ready before requests are counted.
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("warm-up")), done)
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("warm-up: %v", o.Err)
	}

	counted.Store(true)
	var first atomic.Bool
	release := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if first.CompareAndSwap(false, true) {
			c.SleepControl(func() {
				select {
				case <-release:
				case <-ctx.Done():
				}
			})
		}
		return nil, nil, false
	})

	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("0")), done)
	for reqs.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the first record was not sent")
		case <-time.After(time.Millisecond):
		}
	}
	for i := 1; i <= n; i++ {
		sinktest.Produce(ctx, t, s, baseRecord(topic, []byte(fmt.Sprint(i))), done)
	}
	// An observation window for an absence: nothing is sent while the first
	// request is outstanding.
	time.Sleep(100 * time.Millisecond)
	if got := reqs.Load(); got != 1 {
		t.Errorf("%d produce requests while the first was outstanding, want 1", got)
	}
	close(release)
	for range n + 1 {
		if o := done.Wait(ctx, t); o.Err != nil || o.DeadLettered {
			t.Fatalf("outcome %+v", o)
		}
	}
	// How many requests the waiting records then take depends on how soon
	// franz-go's drain starts while they are handed over: not asserted.
	got := sinktest.Consume(ctx, t, c, topic, n+2)
	for i, r := range got[1:] {
		if string(r.Value) != fmt.Sprint(i) {
			t.Fatalf("record %d is %q, want %q (order)", i, r.Value, fmt.Sprint(i))
		}
	}
}

// producesWritten counts produce requests written, once on is set.
type producesWritten struct {
	n  *atomic.Int32
	on *atomic.Bool
}

func (h producesWritten) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Produce) && err == nil && h.on.Load() {
		h.n.Add(1)
	}
}

// TestCloseFailsWaiting: a record waiting in the gate at Close gets a
// shutdown outcome, exactly once, like one buffered in the client.
func TestCloseFailsWaiting(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, closeSink := sinktest.NewSink(t, c, nil, nil)
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("warm-up")), done)
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("warm-up: %v", o.Err)
	}
	// Park every produce request until the test ends.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-ctx.Done() })
		return nil, nil, false
	})
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("in the client")), done)
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("waiting")), done)
	closeFailsAll(ctx, t, closeSink, done, 2)
}

// closeFailsAll closes the sink and checks that the n records without an
// outcome get a shutdown outcome each, exactly once, and that Close returns.
func closeFailsAll(ctx context.Context, t *testing.T, closeSink func(), done *sinktest.Outcomes, n int) {
	t.Helper()
	closed := make(chan struct{})
	go func() { closeSink(); close(closed) }()
	for range n {
		if o := done.Wait(ctx, t); o.Err == nil || sink.Classify(o.Err) != sink.ClassShutdown {
			t.Fatalf("outcome = %+v, want a shutdown error", o)
		}
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
	done.None(t, 50*time.Millisecond)
}

// TestGateLatencyBudgetGathers: with kafka.latency_budget, records that
// arrive steadily with the client empty wait for the ones behind them, so
// requests carry several; every record still gets its outcome, in order.
func TestGateLatencyBudgetGathers(t *testing.T) {
	const n = 64
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	var reqs atomic.Int32
	counted := atomic.Bool{}
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) { cfg.LatencyBudget = 100 * time.Millisecond },
		kgo.WithHooks(producesWritten{&reqs, &counted}))
	done := sinktest.OutcomesFor(n + 2)
	sinktest.Produce(ctx, t, s, baseRecord(topic, []byte("warm-up")), done)
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("warm-up: %v", o.Err)
	}
	counted.Store(true)
	for i := range n {
		sinktest.Produce(ctx, t, s, baseRecord(topic, []byte(fmt.Sprint(i))), done)
		time.Sleep(time.Millisecond) // a steady 1,000 records/s or less
	}
	for range n {
		if o := done.Wait(ctx, t); o.Err != nil || o.DeadLettered {
			t.Fatalf("outcome %+v", o)
		}
	}
	// At most 15 gaps of about 1ms per request (gatherTarget), and never
	// one request per record.
	if got := reqs.Load(); got > n/4 {
		t.Errorf("%d produce requests for %d records arriving 1ms apart under a 100ms budget, want at most %d", got, n, n/4)
	}
	got := sinktest.Consume(ctx, t, c, topic, n+1)
	for i, r := range got[1:] {
		if string(r.Value) != fmt.Sprint(i) {
			t.Fatalf("record %d is %q, want %q (order)", i, r.Value, fmt.Sprint(i))
		}
	}
}
