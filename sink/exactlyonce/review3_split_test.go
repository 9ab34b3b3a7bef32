package exactlyonce_test

import (
	"encoding/json"
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
	tx.BeginTxn(exactlyonce.TxnID{Final: 190, Xid: 6}, true)
	produceTxn(ctx, t, tx, done, 200, topic, "t1a", "t1b", "t1c")
	done.None(t, 50*time.Millisecond) // T1 waits

	tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
	if err := handOver(ctx, t, tx, done, 0, 11); err != nil {
		t.Fatal(err)
	}
	for range 3 + 10 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
	}
	// The invariant, on the committed position records in order: one with
	// a part has the LSN of the one before it (it committed no whole
	// transaction; T1's commit has a record of its own).
	var prev exactlyonce.Position
	for _, r := range readCommitted(ctx, t, c, positions, true, false) {
		var pos exactlyonce.Position
		if string(r.Key) != splitSource || json.Unmarshal(r.Value, &pos) != nil {
			continue
		}
		if pos.Part != nil && pos.LSN > max(prev.LSN, 100) {
			t.Fatalf("position %+v (part %+v) after %v: a Kafka transaction committed T1 (ending at 200, acknowledged to PostgreSQL) together "+
				"with a part of 77@500; acked() takes such a position for unacknowledged (ackNo), so a hang of it is aborted and T1 lost",
				pos, pos.Part, prev.LSN)
		}
		prev = pos
	}
	if prev.Part == nil || prev.LSN != 200 {
		t.Fatalf("last position %+v (part %+v), want T1's 200 with a part of 77@500", prev, prev.Part)
	}
}

// TestReview3ResumingAfterReconnect (review3, ORDER and, after a kill,
// DUPLICATE; reasoned path, the guard asserted here).
//
// Path: run 2 starts with a position {LSN L, Part T} and a gap repair
// pending (the outbox left the publication and came back while stopped;
// Since = the start). process.go keeps the repair out of every keepalive
// and begin until T is decoded again (Resuming(): started). T begins:
// BeginTxn passes over its committed events and sets started=false; more
// parts commit. The replication stream reconnects in the middle of T:
// AbortTxn keeps a resume of T, but with started=false, so Resuming() is
// false while T is yet to be decoded again. The stream resumes at the
// proof, and a keepalive between transactions past Since (the walsender's
// sentPtr while it reads T's WAL again) runs the repair alone
// (keepalive: bf.idle(end) && !resuming()): it reads T's rows that are not
// in seen (those after the reconnect point) and publishes them, with the
// gap's rows, before T's middle; its Kafka transaction commits a position
// E in (L, T's commit). T then comes: the rows the repair published are
// skipped (bf.delivered), the middle ones published after them (per key
// out of order). A kill then leaves {E, Part T}; run 3 takes the repair as
// committed (E > Since), resumes T and publishes the repaired rows of T
// again (no bf to skip them): duplicates.
//
// Expected: after a reconnect inside a resumed transaction, Resuming()
// stays true until it is decoded again. Observed at 898faad: false.
func TestReview3ResumingAfterReconnect(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	first, _, stop := splitTxn(ctx, t, c, 10, nil)
	done := sinktest.OutcomesFor(64)
	warm(ctx, t, first, done)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	first.BeginTxn(id, true)
	if err := handOver(ctx, t, first, done, 0, 11); err != nil {
		t.Fatal(err)
	}
	stop()

	second, _, _ := splitTxn(ctx, t, c, 10, nil)
	if !second.Resuming() {
		t.Fatal("premise: Resuming() at start")
	}
	again := sinktest.OutcomesFor(64)
	second.BeginTxn(id, true)
	if err := handOver(ctx, t, second, again, 0, 25); err != nil { // e10..e19: a part of this run
		t.Fatal(err)
	}
	second.AbortTxn() // the stream reconnects in the middle of T
	if !second.Resuming() {
		t.Fatal("Resuming() = false after a reconnect inside 77@500, committed in part and yet to be decoded again: " +
			"a keepalive past the gap's Since now runs the repair before it, which reads its rows")
	}
}
