package exactlyonce

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestReview3AckedPartAfterWholeTransactions (review3, LOSS).
//
// Path: a Kafka transaction may carry whole PostgreSQL transactions AND the
// first part of the next one: EndTxn(200) leaves T1's events in t.batch
// (fewer than MaxRecords, waiting for kafka.transaction_interval), then the
// large T2 begins and cut() appends its part to the same batch and commits
// it. Its position record is {LSN: 200 (T1's end), Part: T2}
// (TestReview3PartCommitsWholeTransactionsWithIt shows it on kfake). Once
// that commit is answered, T1's events are delivered, the tracker passes
// T1 and the slot may be confirmed at 200 (Acknowledged = 200 at the next
// start). If that transaction then hangs on a partition (Kafka 4.x ends a
// transaction without the marker of a partition whose leader was missing),
// the next start's hang check asks acked(): the new case
// "n.Part != nil && told <= n.Part.Final" answers ackNo although
// told (200) >= n.LSN (200), i.e. PostgreSQL WAS told T1 is delivered.
// decideHang then turns "committed/hanging/hanging" (or "not known/hanging/
// hanging") into hangAbort with CheckSlot=false: the runbook aborts T1's
// events, and the slot is past T1, so they are never published again.
//
// Expected: acked is ackYes (only the part is unacknowledged; the whole
// transactions before it in the same Kafka transaction were told) and the
// decision is never an abort. Observed at 898faad: ackNo, hangAbort.
func TestReview3AckedPartAfterWholeTransactions(t *testing.T) {
	part := &Part{Final: 500, Xid: 7, Events: 10, Parts: 1}
	tx := &Txn{cfg: Config{Acknowledged: lsn.LSN(200)}}
	s := &positionsRead{before: Position{LSN: 100}, last: lastTxn{pos: Position{LSN: 200, Part: part}}}
	got := tx.acked(s)
	hanging := partReading{Topic: "positions", State: partHanging}
	ev := partReading{Topic: "orders", State: partHanging}
	for _, outcome := range []txnOutcome{outcomeCommitted, outcomeUnknown} {
		d := decideHang(txnReading{Outcome: outcome, Acked: got, Positions: hanging, Events: []partReading{ev}})
		if d.Action == hangAbort {
			t.Errorf("outcome %v: acked = %v, decision = abort (CheckSlot %v): the Kafka transaction holds T1 (ending at 200), "+
				"which the slot was told is delivered; aborting it loses T1's events", outcome, got, d.CheckSlot)
		}
	}
	if got != ackYes {
		t.Errorf("acked = %v, want ackYes (%v): told 200 reaches the position's LSN 200", got, ackYes)
	}
}
