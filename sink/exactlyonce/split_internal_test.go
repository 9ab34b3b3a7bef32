package exactlyonce

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestAckedPart: a hanging Kafka transaction that committed a part of a
// PostgreSQL transaction (split.go) carries the position of the whole one
// before, which the slot may have confirmed; PostgreSQL was not told of the
// part until the slot passes the transaction's commit, so aborting it loses
// nothing (before, it read as not known, and the runbook asked the operator
// to check the slot).
func TestAckedPart(t *testing.T) {
	part := &Part{Final: 500, Xid: 7, Events: 20, Parts: 2}
	for _, tc := range []struct {
		name   string
		told   lsn.LSN
		pos    Position
		before Position
		want   ackState
	}{
		{"a part, the slot at its position", 100, Position{LSN: 100, Part: part}, Position{LSN: 100}, ackNo},
		{"a part, nothing told", 0, Position{LSN: 100, Part: part}, Position{LSN: 100}, ackUnknown},
		{"a whole transaction, told past it", 200, Position{LSN: 200}, Position{LSN: 100}, ackYes},
		{"a whole transaction, told before it", 100, Position{LSN: 200}, Position{LSN: 100}, ackNo},
		{"no position moved", 100, Position{LSN: 100}, Position{LSN: 100}, ackUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &Txn{cfg: Config{Acknowledged: tc.told}}
			s := &positionsRead{before: tc.before, last: lastTxn{pos: tc.pos}}
			if got := tx.acked(s); got != tc.want {
				t.Fatalf("acked = %v, want %v", got, tc.want)
			}
		})
	}
}
