package exactlyonce

import (
	"testing"
	"time"

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

// TestPartLimit: a timeout halves the part limit (not below one event); a
// quick commit of a full part doubles it back, up to MaxRecords; a slow or
// small commit leaves it.
func TestPartLimit(t *testing.T) {
	tx := &Txn{cfg: Config{MaxRecords: 100, TransactionTimeout: 8 * time.Second}}
	steps := []struct {
		op     string
		events int
		took   time.Duration
		want   int
	}{
		{"grow", 100, 0, 100}, // at MaxRecords already
		{"shrink", 0, 0, 50},
		{"shrink", 0, 0, 25},
		{"grow", 10, 0, 25},               // a small commit says nothing
		{"grow", 25, 2 * time.Second, 25}, // slow: a quarter of the timeout
		{"grow", 25, 500 * time.Millisecond, 50},
		{"grow", 50, 0, 100},
		{"grow", 100, 0, 100},
	}
	for i := 0; i < 10; i++ {
		tx.shrinkParts()
	}
	if got := tx.partLimit(); got != 1 {
		t.Fatalf("after ten timeouts the limit is %d, want 1", got)
	}
	tx.partMax.Store(0)
	for i, s := range steps {
		if s.op == "shrink" {
			tx.shrinkParts()
		} else {
			tx.growParts(s.events, s.took)
		}
		if got := tx.partLimit(); got != s.want {
			t.Fatalf("step %d (%s %d events in %v): limit %d, want %d", i, s.op, s.events, s.took, got, s.want)
		}
	}
}
