package exactlyonce_test

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReview4TimeoutWholeTransactionsLivelock (review4, HANG).
//
// Path: a steady stream of small PostgreSQL transactions under a producer
// quota (here: 150 ms per KiB produced, 1 KiB events, a 1 s
// kafka.transaction_timeout, kafka.max_buffered_records 10). EndTxn commits
// when MaxRecords (10) events wait: one Kafka transaction of 10 whole
// PostgreSQL transactions, which takes 1.5 s, longer than the timeout. The
// coordinator aborts it; timedOut takes it for the timeout it is and
// afterTimeout halves the part limit, but the limit applies to parts of a
// split transaction only: commit() passes shrink == nil, so the same 10
// events are produced again in one Kafka transaction, which times out again,
// for ever ("kafka transaction timed out" every ~1.5 s; nothing is ever
// committed, nothing acknowledged, the slot never moves).
//
// Expected: the waiting whole transactions are committed in smaller Kafka
// transactions (a prefix of whole transactions with its own end position),
// and all 10 outcomes arrive.
// Observed at 49ca756: no outcome within 20 s; the log repeats the timeout.
func TestReview4TimeoutWholeTransactionsLivelock(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	cfg, _ := slowConfig(c, time.Hour) // commits when MaxRecords wait
	failed := make(chan error, 4)
	cfg.Fail = func(err error) { failed <- err }
	var logs strings.Builder
	var mu sync.Mutex
	tx, err := exactlyonce.New(cfg, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sync.OnceFunc(tx.Close))
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tx.SetFloor(50)
	done := sinktest.OutcomesFor(64)
	value := strings.Repeat("x", 1000)
	go func() {
		for i := range 10 {
			tx.BeginTxn(exactlyonce.TxnID{Final: lsn.LSN(100 + 10*i), Xid: uint32(100 + i)}, true)
			rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("e%d %s", i, value)), Timestamp: time.Now()}
			if err := tx.Produce(ctx, rec, done); err != nil {
				return
			}
			tx.EndTxn(lsn.LSN(105 + 10*i)) // the tenth blocks: it commits
		}
	}()
	deadline := time.After(20 * time.Second)
	for i := range 10 {
		select {
		case err := <-failed:
			t.Fatalf("fatal error after %d outcomes: %v", i, err)
		case o := <-done.C():
			if o.Err != nil {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		case <-deadline:
			mu.Lock()
			n := strings.Count(logs.String(), "kafka transaction timed out")
			mu.Unlock()
			t.Fatalf("HANG: %d of 10 outcomes after 20 s; the batch of 10 whole transactions timed out %d times and is retried whole", i, n)
		}
	}
	var got []string
	for _, v := range events(readCommitted(ctx, t, c, topic, true, false)) {
		got = append(got, strings.Fields(v)[0])
	}
	if len(got) != 10 {
		t.Fatalf("read_committed sees %v, want e0..e9 once each", got)
	}
}
