package pipeline

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// review8: the hold-back (hold.go) of exactly_once. This test drives the
// real holdBack; the guard's bound is given as numbers (the guard needs a
// server).

// TestReview8HoldMergeLivelock: under a steady load whose guard bound lags
// the newest outbox transaction by more than maxHeld transactions (20,000
// one-row transactions/s with the bound 250 ms behind: 5,000; the
// vouched reading is two readings of 100 ms old plus the oldest running
// transaction), the bound moves forward all the time, yet the hold never
// releases the first commit it held: add merges the two oldest entries
// into one that keeps the oldest final and takes the newer xid, so the
// front entry's xid climbs with the load and stays above the bound. The
// slot's confirmed position and the checkpoint stay there for as long as
// the load lasts (WAL retention grows without bound; every restart
// republishes everything since). It should trail the bound by the
// bound's lag, as it does with a lag under maxHeld (the control).
func TestReview8HoldMergeLivelock(t *testing.T) {
	deadline := time.Now().Add(30 * time.Second)
	run := func(lag int) (first, got, want lsn.LSN) {
		const n = 60000
		const xid0 = 1_000_000
		final := func(i int) lsn.LSN { return lsn.LSN(0x10000 + 0x100*i) }
		h := newHoldBack(final(0) - 1)
		for i := range n {
			if time.Now().After(deadline) {
				break
			}
			h.add(uint32(xid0+i), final(i))
			h.decoded(final(i) + 0x10)
			if i%50 == 49 { // a status update or a checkpoint save
				bound := uint64(xid0 + max(0, i-lag)) // the guard's xmin, lag transactions back
				got = h.at(bound)
			}
		}
		// Every transaction below the bound may be confirmed: the hold
		// should be at the first one at or above it.
		return final(0), got, final(max(0, n-1-lag))
	}
	// Control: a lag under maxHeld tracks the bound.
	if _, got, want := run(maxHeld - 200); got < want-0x100*100 {
		t.Fatalf("control (lag %d): hold at %v, want about %v", maxHeld-200, got, want)
	}
	first, got, want := run(maxHeld + 900)
	if got < want-0x100*100 {
		t.Fatalf("lag %d transactions (maxHeld %d): after 60,000 transactions, the bound moving all along, the hold is at %v "+
			"(the first commit held: %v), want about %v: the slot and the checkpoint never advance while the load lasts",
			maxHeld+900, maxHeld, got, first, want)
	}
}
