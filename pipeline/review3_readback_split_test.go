package pipeline

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
)

type review3Done struct {
	mu   sync.Mutex
	errs []error
	n    int
}

func (d *review3Done) Delivered(o sink.Outcome) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	if o.Err != nil {
		d.errs = append(d.errs, o.Err)
	}
}

// TestReview3ReadBackReconnectRepublishesParts (review3, DUPLICATE).
//
// Path: the first exactly_once run on a slot that existed (no position:
// read-back). An earlier at_least_once run put e0, e1 of a transaction T in
// Kafka. T comes: the read-back loads the topic ONCE (b.loaded), holds e0,
// e1 back (HeldBack), e2 is not found (cut): Allow, and T is split; a part
// (e2..e4) commits to Kafka. The replication stream reconnects in the
// middle of T (Reset: eos.abort → AbortTxn keeps a resume of 5 events,
// readBack.abort clears cut, the read-back is not done). T comes again:
// begin sees the read-back still running, so BeginTxn (then with passOver=false)
// drops the resume and the read-back decides T's events again, from the
// held set loaded before the part committed: e2..e4 (committed by this run)
// are not in it, the read-back cuts at e2 and they are published again.
//
// Expected: read_committed sees e0..e9 once each. Observed at 898faad:
// e2, e3, e4 twice.
func TestReview3ReadBackReconnectRepublishesParts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	scfg := sink.Config{Brokers: c.ListenAddrs(), ClientID: "review3",
		TestOpts: []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond)}}
	rec := func(i int) *router.Record {
		return &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte(fmt.Sprintf("v%d", i)), Timestamp: time.Now(),
			Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(fmt.Sprintf("e%d", i))}}}
	}
	// The at_least_once run before: e0, e1 in Kafka.
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		r := rec(i)
		kr := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: []kgo.RecordHeader{{Key: wire.HeaderID, Value: []byte(fmt.Sprintf("e%d", i))}}}
		if err := plain.ProduceSync(ctx, kr).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	plain.Close()

	tx, err := exactlyonce.New(exactlyonce.Config{Sink: scfg, Positions: "positions", Source: "sys/db/r3", Interval: time.Millisecond,
		MaxRecords: 3, FenceCheck: time.Hour}, discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e := &eos{txn: tx}
	e.txn.SetFloor(100) // the run's start (the slot existed)
	e.readBack = newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadRange(ctx, scfg, topics, since, fn)
	}, time.Time{}, discard)
	done := &review3Done{}
	hand := func(n int) {
		t.Helper()
		for i := range n {
			r := rec(i)
			held, err := e.inKafka(ctx, r, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if held {
				continue
			}
			if err := tx.Produce(ctx, r, done); err != nil {
				t.Fatal(err)
			}
		}
	}
	const xid, final = 77, lsn.LSN(500)
	e.begin(xid, final, true)
	hand(6)   // e0, e1 held; e2..e5 handed over: e2..e4 a part, committed
	e.abort() // the stream reconnects in the middle of T
	e.begin(xid, final, true)
	hand(10)
	e.end(600)
	if err := tx.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		pcancel()
		if len(got) >= 13 {
			break
		}
	}
	counts := map[string]int{}
	for _, v := range got {
		counts[v]++
	}
	var dup []string
	for i := range 10 {
		if v := fmt.Sprintf("v%d", i); counts[v] != 1 {
			dup = append(dup, fmt.Sprintf("%s×%d", v, counts[v]))
		}
	}
	if len(dup) > 0 {
		t.Fatalf("read_committed sees %v; not once: %v (the read-back decided T again after the reconnect from a held "+
			"set loaded before this run committed T's first part, and BeginTxn dropped the resume)", got, dup)
	}
}
