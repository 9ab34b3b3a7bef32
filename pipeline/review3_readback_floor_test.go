package pipeline

import (
	"context"
	"fmt"
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

// TestReview3ReadBackPartPositionBehindHeldTransactions (review3, DUPLICATE).
//
// Path: the first exactly_once run on a slot that existed (no position,
// read-back from the slot's position S=100; an at_least_once run before it
// was killed after publishing W's event w0 and the first events e0, e1 of
// the large transaction T). Run 1: W (ends at 350) is found whole in Kafka
// and held back: EndTxn with nothing moves neither t.end nor a position.
// T follows: e0, e1 held, e2 not found (the read-back ends inside T, Allow),
// a part of T commits with the position max(t.end=0, committed=0,
// floor=S) = 100 and Part T. The connector is killed before the slot's
// confirmation passes W (status_interval; or the exactly_once hold keeps it
// back). Run 2: a position exists, so there is no read-back
// (exactly_once.go starts one only without a position), and decideStart
// starts at max(slot 100, committed 100): W (final 300) is not below the
// start, is not skipped, and is published again.
//
// Before the split, nothing was committed before T's end, so run 2 read
// back again and held W. Expected: the part's position covers every
// transaction this run decoded and delivered (>= 350), so W is skipped;
// read_committed sees w0 once. Observed at 898faad: position LSN 100, w0
// twice.
func TestReview3ReadBackPartPositionBehindHeldTransactions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	scfg := sink.Config{Brokers: c.ListenAddrs(), ClientID: "review3",
		TestOpts: []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond)}}
	rec := func(id string) *router.Record {
		return &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v-" + id), Timestamp: time.Now(),
			Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(id)}}}
	}
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w0", "e0", "e1"} { // the at_least_once run's
		r := rec(id)
		if err := plain.ProduceSync(ctx, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value,
			Headers: []kgo.RecordHeader{{Key: wire.HeaderID, Value: []byte(id)}}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	plain.Close()
	newTxn := func() (*exactlyonce.Txn, exactlyonce.Position) {
		tx, err := exactlyonce.New(exactlyonce.Config{Sink: scfg, Positions: "positions", Source: "sys/db/r3f", Interval: time.Millisecond,
			MaxRecords: 3, FenceCheck: time.Hour}, discard)
		if err != nil {
			t.Fatal(err)
		}
		pos, err := tx.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx, pos
	}
	const slot = lsn.LSN(100) // the slot's confirmed position, both runs
	w := struct {
		xid   uint32
		final lsn.LSN
		end   lsn.LSN
	}{66, 300, 350}
	const txid, tfinal = 77, lsn.LSN(500)
	done := &review3Done{}
	hand := func(e *eos, tx *exactlyonce.Txn, ids ...string) {
		t.Helper()
		for _, id := range ids {
			r := rec(id)
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

	// Run 1: read-back.
	tx1, _ := newTxn()
	e1 := &eos{txn: tx1}
	tx1.SetFloor(slot)
	e1.readBack = newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadRange(ctx, scfg, topics, since, fn)
	}, time.Time{}, discard)
	e1.begin(w.xid, w.final, true)
	hand(e1, tx1, "w0")
	e1.end(w.end)
	e1.begin(txid, tfinal, true)
	hand(e1, tx1, "e0", "e1", "e2", "e3", "e4", "e5") // e2..e4: a part
	tx1.Close()                                       // killed

	// Run 2: a position, no read-back; the processor skips what ends
	// below the start (process.go begin: w.skip).
	tx2, pos := newTxn()
	defer tx2.Close()
	start := max(slot, pos.LSN)
	e2 := &eos{txn: tx2}
	tx2.SetFloor(start)
	if pos.LSN == 0 {
		// No position (nothing of T was committed in parts): run 2 reads
		// back, as exactly_once.go starts one without a position.
		e2.readBack = newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
			return sink.ReadRange(ctx, scfg, topics, since, fn)
		}, time.Time{}, discard)
	}
	t.Logf("run 2 starts at %v (position %v, part %+v)", start, pos.LSN, pos.Part)
	e2.begin(w.xid, w.final, true)
	if w.final >= start {
		hand(e2, tx2, "w0")
	}
	e2.end(w.end)
	e2.begin(txid, tfinal, true)
	hand(e2, tx2, "e0", "e1", "e2", "e3", "e4", "e5", "e6")
	e2.end(600)
	if err := tx2.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		pcancel()
	}
	counts := map[string]int{}
	for _, v := range got {
		counts[v]++
	}
	var bad []string
	for _, id := range []string{"w0", "e0", "e1", "e2", "e3", "e4", "e5", "e6"} {
		if counts["v-"+id] != 1 {
			bad = append(bad, fmt.Sprintf("%s×%d", id, counts["v-"+id]))
		}
	}
	if len(bad) > 0 || pos.Part != nil && pos.LSN < w.end {
		t.Fatalf("read_committed sees %v; not once: %v. The part's position is %v (part %+v): below W's end %v, which run 1 "+
			"read back and held (delivered), so run 2, without a read-back, publishes W again", got, bad, pos.LSN, pos.Part, w.end)
	}
}
