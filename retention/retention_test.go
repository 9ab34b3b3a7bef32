package retention

import (
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := func(ago time.Duration, wal lsn.LSN, xmin uint64) Reading {
		return Reading{At: now.Add(-ago), WAL: wal, Xmin: xmin}
	}
	three := []Reading{r(3*time.Second, 100, 10), r(2*time.Second, 200, 20), r(time.Second, 300, 30)}
	owner := State{Owner: true}
	cases := []struct {
		name     string
		readings []Reading
		s        State
		want     Decision
		kept     int
	}{
		{"no reading", nil, State{Owner: true, Acked: 1000}, Decision{Why: "waiting for the acknowledged position to reach a reading"}, 0},
		{"acked below every reading", three, State{Owner: true, Acked: 99}, Decision{Why: "waiting for the acknowledged position to reach a reading"}, 3},
		{"acked exactly at the first", three, State{Owner: true, Acked: 100}, Decision{Delete: true, Below: 10}, 3},
		{"acked between: the newest reached", three, State{Owner: true, Acked: 250}, Decision{Delete: true, Below: 20}, 2},
		{"acked past all", three, State{Owner: true, Acked: 1 << 40}, Decision{Delete: true, Below: 30}, 1},
		{"not the slot's owner", three, State{Acked: 1 << 40}, Decision{Why: "not streaming from the slot"}, 1},
		{"snapshot pending", three, State{Owner: true, Snapshot: true, Acked: 1 << 40}, Decision{Why: "the initial snapshot is not done"}, 1},
		{"gap recorded", three, State{Owner: true, Gap: true, Acked: 1 << 40}, Decision{Why: "a gap is recorded and its repair not acknowledged"}, 1},
		{"gap with nothing reached", three, State{Owner: true, Gap: true}, Decision{Why: "a gap is recorded and its repair not acknowledged"}, 3},
		{"stale reading unused", []Reading{r(maxReadingAge+time.Second, 100, 10), r(time.Second, 300, 30)}, State{Owner: true, Acked: 200},
			Decision{Why: "waiting for the acknowledged position to reach a reading"}, 1},
		{"reading at the age bound used", []Reading{r(maxReadingAge, 100, 10)}, State{Owner: true, Acked: 100}, Decision{Delete: true, Below: 10}, 1},
		{"owner with acked zero", three, owner, Decision{Why: "waiting for the acknowledged position to reach a reading"}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, kept := Decide(now, c.readings, c.s)
			if got != c.want {
				t.Errorf("decision %+v, want %+v", got, c.want)
			}
			if len(kept) != c.kept {
				t.Errorf("kept %d readings, want %d", len(kept), c.kept)
			}
		})
	}
}

// TestDecideKeepsNewest: under a stall the queue stays bounded and keeps
// the newest readings, which vouch for the most rows.
func TestDecideKeepsNewest(t *testing.T) {
	// The reading used stays for the next round, while the position stalls.
	now0 := time.Now()
	rs := []Reading{{At: now0, WAL: 100, Xmin: 10}, {At: now0, WAL: 200, Xmin: 20}}
	d, kept := Decide(now0, rs, State{Owner: true, Acked: 150})
	d2, _ := Decide(now0, append(kept, Reading{At: now0, WAL: 300, Xmin: 30}), State{Owner: true, Acked: 150})
	if d.Below != 10 || d2 != d {
		t.Fatalf("first round %+v, second %+v: want both to delete below 10", d, d2)
	}
	now := time.Now()
	rs = nil
	for i := range keep + 10 {
		rs = append(rs, Reading{At: now, WAL: lsn.LSN(1000 + i), Xmin: uint64(i)})
	}
	_, kept = Decide(now, rs, State{Owner: true, Acked: 1})
	if len(kept) != keep || kept[len(kept)-1].Xmin != uint64(keep+9) || kept[0].Xmin != 10 {
		t.Fatalf("kept %d, first %d, last %d", len(kept), kept[0].Xmin, kept[len(kept)-1].Xmin)
	}
	// With a reading used, it stays first and the newest fill the rest.
	_, kept = Decide(now, rs, State{Owner: true, Acked: 1000})
	if len(kept) != keep || kept[0].Xmin != 0 || kept[1].Xmin != 11 || kept[len(kept)-1].Xmin != uint64(keep+9) {
		t.Fatalf("kept %d, first %d, second %d, last %d", len(kept), kept[0].Xmin, kept[1].Xmin, kept[len(kept)-1].Xmin)
	}
}

// TestDecideNeverPastAcked is the safety property over random readings:
// a decision to delete always names the Xmin of a reading at or below the
// acknowledged position.
func TestDecideNeverPastAcked(t *testing.T) {
	now := time.Now()
	for seed := range uint64(500) {
		x := seed*2654435761 + 1
		next := func(n uint64) uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x % n }
		var rs []Reading
		wal, xmin := lsn.LSN(0), uint64(0)
		for range next(20) {
			wal += lsn.LSN(next(100) + 1)
			xmin += next(5)
			rs = append(rs, Reading{At: now.Add(-time.Duration(next(uint64(2 * maxReadingAge)))), WAL: wal, Xmin: xmin})
		}
		acked := lsn.LSN(next(uint64(wal) + 50))
		d, _ := Decide(now, rs, State{Owner: true, Acked: acked})
		if !d.Delete {
			continue
		}
		ok := false
		for _, r := range rs {
			if r.Xmin == d.Below && r.WAL <= acked && now.Sub(r.At) <= maxReadingAge {
				ok = true
			}
		}
		if !ok {
			t.Fatalf("seed %d: Below %d is no fresh reading at or below acked %v: %+v", seed, d.Below, acked, rs)
		}
	}
}

func TestPace(t *testing.T) {
	cases := []struct {
		took time.Duration
		duty float64
		want time.Duration
	}{
		{100 * time.Millisecond, 0.1, 900 * time.Millisecond},
		{100 * time.Millisecond, 0.5, 100 * time.Millisecond},
		{100 * time.Millisecond, 1, 0},
		{100 * time.Millisecond, 0, 0},
		{0, 0.1, 0},
	}
	for _, c := range cases {
		if got := Pace(c.took, c.duty); got != c.want {
			t.Errorf("Pace(%v, %v) = %v, want %v", c.took, c.duty, got, c.want)
		}
	}
}
