package replication

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestGuardVouch: a reading vouches for its position once every transaction
// running at it has ended (seen by a later reading), or by itself when none
// was running, or after GuardMargin; never earlier.
func TestGuardVouch(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	rd := func(before lsn.LSN, xmin uint64, at time.Duration, running ...uint64) reading {
		return reading{Snapshot: Snapshot{Before: before, Xmin: xmin, Running: running}, at: t0.Add(at), before: xmin}
	}
	tests := []struct {
		name     string
		readings []reading
		want     lsn.LSN // verified after the last reading
		wantXmin uint64
	}{
		{"nothing running: at once", []reading{rd(100, 10, 0)}, 100, 10},
		{"running at the first, ended by the second", []reading{rd(100, 10, 0, 10, 12), rd(200, 15, 100*time.Millisecond, 15)}, 100, 10},
		{"still running at the second", []reading{rd(100, 10, 0, 10, 12), rd(200, 12, 100*time.Millisecond, 12)}, 0, 0},
		{"one of two ended, other below the later xmin", []reading{rd(100, 10, 0, 10, 12), rd(200, 13, 100*time.Millisecond, 14)}, 100, 10},
		{"long transaction: the margin vouches", []reading{rd(100, 5, 0, 5), rd(200, 5, 500*time.Millisecond, 5), rd(300, 5, time.Second, 5)}, 100, 5},
		{"a transaction still running holds every reading", []reading{
			rd(100, 5, 0, 5, 9), rd(200, 9, 100*time.Millisecond, 9, 20), rd(300, 9, 200*time.Millisecond, 9, 21)}, 0, 0},
		{"settled in the middle", []reading{
			rd(100, 5, 0, 5), rd(200, 7, 100*time.Millisecond, 7), rd(300, 8, 200*time.Millisecond, 8)}, 200, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &Guard{}
			for _, r := range tc.readings {
				g.vouch(r)
			}
			if got := g.Verified(); got != tc.want {
				t.Errorf("verified %v, want %v", got, tc.want)
			}
			if got := g.xmin.Load(); got != tc.wantXmin {
				t.Errorf("xmin %d, want %d", got, tc.wantXmin)
			}
			if len(g.pending) > maxPending {
				t.Errorf("%d readings pending", len(g.pending))
			}
		})
	}
}

// TestGuardGapXmin: the gap's xmin is the older of the vouched reading's
// and the one before it, so a transaction that committed between the
// vouched reading's WAL position and its snapshot is inside the gap.
func TestGuardGapXmin(t *testing.T) {
	g := &Guard{}
	t0 := time.Unix(1_000_000, 0)
	g.vouch(reading{Snapshot: Snapshot{Before: 100, Xmin: 20}, at: t0, before: 12})
	if g.Verified() != 100 || g.xmin.Load() != 12 {
		t.Fatalf("verified %v xmin %d, want 100 and 12", g.Verified(), g.xmin.Load())
	}
}

// TestGuardVouched: the pair a checkpoint saves (TableStream.Xmin and
// Verified) comes from one vouching reading, with the After of the reading
// before it as the position (an asynchronous commit can leave the proc
// array before its record is written, so not the vouching reading's
// Before); none before the first (the start's bound is the first
// reading's xmin, which ended nothing by the start position) and none from
// the first reading itself, whose snapshot came after its Before (review11).
func TestGuardVouched(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	first := Snapshot{Before: 100, Xmin: 20, After: 110, Running: []uint64{20}}
	g := &Guard{}
	g.pending = []reading{{first, t0, first.Xmin, 0}} // as NewGuard leaves it
	g.last, g.lastAt = first.Xmin, first.After
	g.verified.Store(50)
	g.xmin.Store(first.Xmin)
	if e, ok := g.Vouched(); ok {
		t.Fatalf("vouched %+v before any reading vouched", e)
	}
	second := Snapshot{Before: 200, Xmin: 25, After: 210, Running: []uint64{25}}
	g.vouch(reading{second, t0.Add(100 * time.Millisecond), g.last, g.lastAt})
	g.last, g.lastAt = second.Xmin, second.After
	if g.Verified() != 100 {
		t.Fatalf("verified %v, want the first reading's 0/64", g.Verified())
	}
	if e, ok := g.Vouched(); ok {
		t.Fatalf("vouched %+v from the first reading, whose xmin came after its Before", e)
	}
	third := Snapshot{Before: 300, Xmin: 30, After: 310}
	g.vouch(reading{third, t0.Add(200 * time.Millisecond), g.last, g.lastAt})
	e, ok := g.Vouched()
	if !ok || e != (Ended{Below: 25, By: 210}) || e.Below != g.Xmin() {
		t.Fatalf("vouched %+v %v, want {25 0/D2}: the bound with the After of the reading before (xmin %d, verified %v)",
			e, ok, g.Xmin(), g.Verified())
	}
}

// TestPairAfter: a reading pairs with the last good reading's After only
// on the same connection (review12: a reconnect may reach another server).
func TestPairAfter(t *testing.T) {
	if got := pairAfter(0x500, 3, 3); got != 0x500 {
		t.Errorf("same connection: %v, want 0/500", got)
	}
	if got := pairAfter(0x500, 3, 4); got != 0 {
		t.Errorf("new connection: %v, want no pair", got)
	}
}

func TestGuardPendingBounded(t *testing.T) {
	g := &Guard{}
	t0 := time.Unix(1_000_000, 0)
	for i := range 10 * maxPending { // one transaction runs throughout, readings 1 ms apart
		g.vouch(reading{Snapshot: Snapshot{Before: lsn.LSN(i + 1), Xmin: 1, Running: []uint64{1}}, at: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	if len(g.pending) > maxPending {
		t.Fatalf("%d readings pending, want at most %d", len(g.pending), maxPending)
	}
}

// TestGuardFloorKeptThroughAStall: while the acknowledged position stalls
// (an event waits for a missing topic), the checkpoint stays put and the
// guard reads on. The floor at the checkpoint must outlive maxFloors
// readings: without it a save records no floor, and a change found at the
// next start repairs from the saved bound, whose copies can come out of
// order (pipeline stoppedBound). Found by review.
func TestGuardFloorKeptThroughAStall(t *testing.T) {
	g := &Guard{watch: &Watch{}}
	ckpt := lsn.LSN(1000)
	g.SeedFloor(ckpt, 450)
	if f := g.Floor(ckpt); f != 450 {
		t.Fatalf("floor at the checkpoint %d, want 450", f)
	}
	for i := range 3 * maxFloors {
		g.addFloor(Snapshot{After: ckpt + lsn.LSN(100*(i+1)), Xmin: 500 + uint64(i)})
	}
	if f := g.Floor(ckpt); f != 450 {
		t.Errorf("floor at the checkpoint %d after %d readings, want 450", f, 3*maxFloors)
	}
	if f, want := g.Floor(ckpt+lsn.LSN(100*3*maxFloors)), uint64(500+3*maxFloors-1); f != want {
		t.Errorf("floor at the last reading %d, want %d", f, want)
	}
}
