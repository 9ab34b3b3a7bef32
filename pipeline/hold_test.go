package pipeline

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestHoldBack: the hold is the commit of the first outbox transaction
// decoded whose id is at or above the bound, and never past what the
// stream decoded; ids compare modulo 2³² against the full bound.
func TestHoldBack(t *testing.T) {
	type txn struct {
		xid   uint32
		final lsn.LSN
	}
	const epoch = uint64(1) << 32
	for _, c := range []struct {
		name     string
		from     lsn.LSN
		txns     []txn
		decoded  lsn.LSN
		bound    uint64
		want     lsn.LSN
		wantLeft int
	}{
		{name: "nothing decoded: the start", from: 100, bound: 5, want: 100},
		{name: "all below the bound: the frontier", from: 100, txns: []txn{{3, 110}, {4, 120}}, decoded: 130, bound: 5, want: 130},
		{name: "first at the bound holds", from: 100, txns: []txn{{3, 110}, {5, 120}, {9, 125}}, decoded: 130, bound: 5, want: 120, wantLeft: 2},
		{name: "a later low id does not release an earlier high one", from: 100, txns: []txn{{9, 110}, {4, 120}}, decoded: 130, bound: 5,
			want: 110, wantLeft: 2},
		{name: "bound past every id", from: 100, txns: []txn{{9, 110}, {7, 120}}, decoded: 130, bound: 10, want: 130},
		{name: "wraparound: an id of the next epoch is above", from: 100, txns: []txn{{2, 110}}, decoded: 130,
			bound: epoch - 10, want: 110, wantLeft: 1},
		{name: "wraparound: an id of the last epoch is below", from: 100, txns: []txn{{0xfffffff0, 110}}, decoded: 130,
			bound: epoch + 5, want: 130},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHoldBack(c.from)
			for _, x := range c.txns {
				h.add(x.xid, x.final)
			}
			h.decoded(c.decoded)
			if got := h.at(c.bound); got != c.want || len(h.txns) != c.wantLeft {
				t.Fatalf("at(%d) = %v with %d left, want %v with %d", c.bound, got, len(h.txns), c.want, c.wantLeft)
			}
		})
	}
}

// TestHoldBackBounded: past maxHeld entries the newest takes the next
// ones in, holding at its own commit until the bound passes the highest
// id it took: later, never earlier; the front stays exact.
func TestHoldBackBounded(t *testing.T) {
	h := newHoldBack(0)
	for i := range maxHeld + 10 {
		h.add(uint32(1000+i), lsn.LSN(10+i))
	}
	h.decoded(lsn.LSN(1 << 20))
	if got := h.at(1000); got != 10 || len(h.txns) != maxHeld {
		t.Fatalf("at(1000) = %v with %d entries, want 10 with %d", got, len(h.txns), maxHeld)
	}
	if got := h.at(1001); got != 11 {
		t.Fatalf("at(1001) = %v, want 11 (the front is exact)", got)
	}
	// The last entry took ids up to 1000+maxHeld+9: it holds at its own
	// commit until the bound passes them.
	last := uint64(1000 + maxHeld - 1)
	if got := h.at(last + 10); got != lsn.LSN(10+maxHeld-1) {
		t.Fatalf("at(%d) = %v, want %v (merged entry)", last+10, got, lsn.LSN(10+maxHeld-1))
	}
	if got := h.at(last + 11); got != 1<<20 {
		t.Fatalf("at(%d) = %v, want the frontier", last+11, got)
	}
}

// TestBackfillDue: the repair joins the first transaction committing at or
// after Since, one whose commit ends past Since, or a keepalive strictly
// past it; never once handed over.
func TestBackfillDue(t *testing.T) {
	b := newBackfill(gapInfo{Since: 100, Xmin: 7})
	for _, c := range []struct {
		name             string
		got, want        bool
		final, end, idle lsn.LSN
	}{
		{name: "commit before", got: b.due(99)},
		{name: "commit at", got: b.due(100), want: true},
		{name: "end at Since", got: b.ends(100)},
		{name: "end past Since", got: b.ends(101), want: true},
		{name: "keepalive at Since", got: b.idle(100)},
		{name: "keepalive past Since", got: b.idle(101), want: true},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	b.done = true
	if b.due(200) || b.ends(200) || b.idle(200) {
		t.Error("due once handed over")
	}
	var none *backfill
	if none.due(200) || none.pending() {
		t.Error("a nil repair is due")
	}
}
