package pipeline

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestHistory: a decoded mark becomes the proof at its commit's end; a
// reconnect resumes at the proof with its mark; what is decoded again is
// told apart by its identity, not its position.
func TestHistory(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	id := func(final lsn.LSN, xid uint32, us int) txnID {
		return txnID{final: final, xid: xid, commit: at.Add(time.Duration(us) * time.Microsecond)}
	}
	h := newHistory(&replication.Marks{})
	h.start(proof{mark: 7, at: 0x100}, proof{})
	if got := h.resume(0x100); got != (replication.ResumeAt{Pos: 0x100, Mark: 7}) {
		t.Fatalf("resume with nothing decoded past the start = %+v, want 0/100 with mark 7", got)
	}
	h.committed(id(0x108, 10, 1), 0x110, true)  // published
	h.committed(id(0x118, 11, 2), 0x120, false) // no rows
	h.mark(42)
	h.committed(id(0x128, 12, 3), 0x130, false) // the mark's transaction
	if p := h.proven(); p.mark != 42 || p.at != 0x130 {
		t.Fatalf("proof %+v, want mark 42 at 0/130", p)
	}
	h.committed(id(0x138, 13, 4), 0x140, true)
	h.committed(id(0x148, 14, 5), 0x150, true)
	h.mark(43)
	// The mark's transaction is cut short by the reconnect below.
	if got := h.resume(0x150); got != (replication.ResumeAt{Pos: 0x130, Mark: 42}) {
		t.Fatalf("resume = %+v, want the proof 0/130 with mark 42", got)
	}
	for _, tc := range []struct {
		name string
		id   txnID
		want again
	}{
		{"the same transaction", id(0x138, 13, 4), published},
		{"the same position and xid, another commit time: a new history", id(0x138, 13, 9), unknown},
		{"another xid", id(0x148, 99, 5), unknown},
		{"a position not decoded before", id(0x144, 13, 4), unknown},
		{"past where the stream was", id(0x158, 15, 6), fresh},
		{"behind the proof: the resume does not send it", id(0x108, 10, 1), unknown},
	} {
		if got := h.redecoded(tc.id); got != tc.want {
			t.Errorf("%s: redecoded = %v, want %v", tc.name, got, tc.want)
		}
	}
	if p := h.proven(); p.mark != 42 {
		t.Fatalf("an aborted mark became the proof: %+v", p)
	}
}

// TestHistoryWithoutMarks: without marks (PostgreSQL 13) nothing is capped
// and a reconnect resumes where the stream was, checked by the WAL end.
func TestHistoryWithoutMarks(t *testing.T) {
	h := newHistory(nil)
	h.start(proof{at: 0x100}, proof{})
	h.mark(5)
	h.committed(txnID{final: 0x108}, 0x110, true)
	if p := h.proven(); p.at != lsn.LSN(^uint64(0)) || p.mark != 0 {
		t.Fatalf("proof %+v, want nothing capped", p)
	}
	if got := h.resume(0x110); got != (replication.ResumeAt{Pos: 0x110}) {
		t.Fatalf("resume = %+v, want 0/110 without a mark", got)
	}
	var none *history // replay, and tests that build a processor alone
	if got := none.resume(0x200); got.Pos != 0x200 {
		t.Fatalf("a nil history resumes at %v", got.Pos)
	}
}

// TestHistoryTailBound: past its bound the tail forgets its oldest half;
// a reconnect publishes those again (duplicates), never takes them for a
// new history.
func TestHistoryTailBound(t *testing.T) {
	h := newHistory(&replication.Marks{})
	h.tailCap = 4
	h.start(proof{mark: 1, at: 0x100}, proof{})
	at := time.Unix(1_700_000_000, 0)
	for i := range 5 {
		end := lsn.LSN(0x110 + 0x10*i)
		h.committed(txnID{final: end - 8, xid: uint32(i), commit: at}, end, true)
	}
	h.resume(0x150)
	for i, want := range []again{forgotten, forgotten, published, published, published} {
		end := lsn.LSN(0x110 + 0x10*i)
		if got := h.redecoded(txnID{final: end - 8, xid: uint32(i), commit: at}); got != want {
			t.Errorf("transaction %d: %v, want %v", i, got, want)
		}
	}
}
