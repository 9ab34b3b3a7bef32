package exactlyonce_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReview3PartCommitsWholeTransactionsWithIt (review3, reachability of
// the LOSS in TestReview3AckedPartAfterWholeTransactions).
//
// Path: T1 (3 events, below MaxRecords) is handed over and waits for the
// transaction interval; T2, larger than MaxRecords, begins and its first
// part is cut while T1 still waits. cut() appends the part to the batch
// and commits T1 and the part in ONE Kafka transaction whose position is
// {LSN: T1's end, Part: T2}; T1's outcomes are delivered (the slot may be
// confirmed past T1). The hang check's acked() then reads that position as
// "a part: PostgreSQL was not told" (ackNo), and an abort of that hanging
// transaction loses T1.
//
// This test asserts the invariant acked() relies on: a position that
// carries a Part commits no whole transaction (its LSN is the one before).
// Observed at 898faad: the position is {LSN 200, Part 77@500} and T1's
// events are in the same Kafka transaction and acknowledged.
func TestReview3PartCommitsWholeTransactionsWithIt(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	cfg := txnConfig(c, splitSource, time.Hour) // T1 waits for the interval (kafka.transaction_interval)
	cfg.MaxRecords = 10
	tx, err := exactlyonce.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sync.OnceFunc(tx.Close))
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tx.SetFloor(100) // the run's start: a position exists
	done := sinktest.OutcomesFor(64)
	tx.BeginTxn(exactlyonce.TxnID{Final: 190, Xid: 6}, true, true)
	produceTxn(ctx, t, tx, done, 200, topic, "t1a", "t1b", "t1c")
	done.None(t, 50*time.Millisecond) // T1 waits

	tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true, true)
	if err := handOver(ctx, t, tx, done, 0, 11); err != nil {
		t.Fatal(err)
	}
	for range 3 + 10 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
	}
	pos := positionOf(ctx, t, c)
	if pos.Part != nil && pos.LSN > 100 {
		t.Fatalf("position %+v (part %+v): a Kafka transaction committed T1 (ending at 200, acknowledged to PostgreSQL) together "+
			"with a part of 77@500; acked() takes such a position for unacknowledged (ackNo), so a hang of it is aborted and T1 lost",
			pos, pos.Part)
	}
}
