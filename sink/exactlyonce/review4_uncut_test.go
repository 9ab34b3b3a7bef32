package exactlyonce_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReview4UncutThenReconnectRepublishes (review4, DUPLICATE).
//
// Path: a transaction larger than MaxRecords (10) under a producer quota
// (150 ms per KiB, 1 KiB events, a 1 s transaction timeout). Its 11th event
// cuts part 1 (e0..e9, mark m with events 10); the part takes 1.5 s, the
// coordinator aborts it, afterTimeout halves the limit and uncut commits
// e0..e4 alone (a new mark, events 5) and gives e5..e9 back to the open
// transaction. The position says Part{Events: 5}. But cut() then updates
// the split state only when `p.Events >= m.events` with m the mark it made
// before uncut (10): 5 < 10, so s.committed stays 0. The stream reconnects
// before the next part commits (AbortTxn): abortSplit keeps a resume only
// when s.committed > 0, so none is kept, the transaction is decoded again
// from its first event and e0..e4 are published a second time.
//
// Expected: read_committed sees e0..e24 once each.
// Observed at 49ca756: e0..e4 twice.
func TestReview4UncutThenReconnectRepublishes(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	cfg, _ := slowConfig(c, time.Millisecond)
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
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	value := strings.Repeat("x", 1000)
	hand := func(done *sinktest.Outcomes, from, to int) {
		for i := from; i < to; i++ {
			rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("e%d %s", i, value)), Timestamp: time.Now()}
			if err := tx.Produce(ctx, rec, done); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
		}
	}
	done := sinktest.OutcomesFor(64)
	tx.BeginTxn(id, true)
	hand(done, 0, 11) // the 11th cuts part 1, which times out and is cut in half
	for i := range 5 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %d: %+v", i, o)
		}
	}
	mu.Lock()
	timedOut := strings.Contains(logs.String(), "kafka transaction timed out")
	mu.Unlock()
	if !timedOut {
		t.Fatal("part 1 did not time out: the test tested nothing")
	}
	if p := positionOf(ctx, t, c).Part; p == nil || p.Events != 5 {
		t.Fatalf("position part %+v, want 5 events committed (e0..e4)", p)
	}

	// The stream reconnects: the open events are forgotten, the
	// transaction comes again whole.
	tx.AbortTxn()
	for range 6 {
		if o := done.Wait(ctx, t); !errors.Is(o.Err, kgo.ErrAborting) {
			t.Fatalf("aborted event's outcome %+v", o)
		}
	}
	again := sinktest.OutcomesFor(64)
	tx.BeginTxn(id, true)
	hand(again, 0, 25)
	tx.EndTxn(600)
	for i := range 25 {
		select {
		case err := <-failed:
			t.Fatalf("fatal error after %d outcomes: %v", i, err)
		case o := <-again.C():
			if o.Err != nil {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		case <-ctx.Done():
			t.Fatalf("%d of 25 outcomes", i)
		}
	}
	var got []string
	for _, v := range events(readCommitted(ctx, t, c, topic, true, false)) {
		got = append(got, strings.Fields(v)[0])
	}
	want := make([]string, 25)
	for i := range want {
		want[i] = fmt.Sprintf("e%d", i)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("DUPLICATE: read_committed sees %v\nwant e0..e24 once each, in order", got)
	}
}
