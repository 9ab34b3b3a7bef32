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

// TestReadBackBelowThePositionSplits: a restart after a kill reads back
// from its history proof, below the committed position (the mark lags), and
// holds back the whole transactions it decodes again there; those end below
// the position a part carries, so the large transaction after them is still
// split (the chaos suite saw the rest of one go out as a single part of 5,642
// events after every kill, when any held-back transaction kept it whole).
func TestReadBackBelowThePositionSplits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	scfg := sink.Config{Brokers: c.ListenAddrs(), ClientID: "splitrb", TestOpts: []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond)}}
	rec := func(id string) *router.Record {
		return &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v-" + id), Timestamp: time.Now(),
			Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(id)}}}
	}
	newTxn := func() *exactlyonce.Txn {
		tx, err := exactlyonce.New(exactlyonce.Config{Sink: scfg, Positions: "positions", Source: "sys/db/splitrb",
			Interval: time.Millisecond, MaxRecords: 3, FenceCheck: time.Hour}, discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	done := &review3Done{}
	hand := func(e *eos, tx *exactlyonce.Txn, ids ...string) {
		t.Helper()
		for _, id := range ids {
			r := rec(id)
			held, err := e.inKafka(ctx, r, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !held {
				if err := tx.Produce(ctx, r, done); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// Run 1: W commits whole, position 350.
	tx1 := newTxn()
	e1 := &eos{txn: tx1}
	tx1.SetFloor(100)
	e1.begin(66, 300, true)
	hand(e1, tx1, "w0")
	e1.end(350)
	if err := tx1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	tx1.Close()

	// Run 2: from the proof (100), reading back: W again (held whole), then T.
	tx2 := newTxn()
	defer tx2.Close()
	e2 := &eos{txn: tx2}
	tx2.SetFloor(100)
	e2.readBack = newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadRange(ctx, scfg, topics, since, fn)
	}, time.Time{}, discard)
	e2.begin(66, 300, true)
	hand(e2, tx2, "w0")
	e2.end(350)
	e2.begin(77, lsn.LSN(500), true)
	var ids []string
	for i := range 10 {
		ids = append(ids, fmt.Sprintf("e%d", i))
	}
	hand(e2, tx2, ids...) // parts of 3 once the read-back ends at e0
	if p := tx2.PartFloor(); p < 350 {
		t.Fatalf("part floor %v below W's end", p)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && seen < 1+9; {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		seen += len(cl.PollFetches(pctx).Records())
		pcancel()
	}
	// w0 and the parts before the end of T (e0..e8: three parts of 3; e9 waits).
	if seen != 1+9 {
		t.Fatalf("read_committed sees %d records before T ends, want w0 and three parts of T (10): T was kept whole", seen)
	}
}
