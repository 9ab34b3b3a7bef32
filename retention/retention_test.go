package retention

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

func TestDecide(t *testing.T) {
	ep := Epoch{SystemID: "7", Timeline: 1, Conn: 1, Session: 1}
	r := func(wal lsn.LSN, xmin uint64) Reading {
		return Reading{WAL: wal, Xmin: xmin, Next: xmin + 5, Epoch: ep}
	}
	three := []Reading{r(100, 10), r(200, 20), r(300, 30)}
	other := func(e Epoch) Reading { x := r(300, 30); x.Epoch = e; return x }
	withSlots := func(rs []Reading, sl ...Slot) []Reading {
		out := append([]Reading(nil), rs...)
		out[len(out)-1].Slots = sl
		return out
	}
	on := func(acked lsn.LSN) State { return State{Owner: true, HoldRead: true, Session: 1, Acked: acked} }
	waiting := Decision{Why: "waiting for the acknowledged position to reach a reading"}
	cases := []struct {
		name     string
		readings []Reading
		s        State
		want     Decision
		kept     int
	}{
		{"no reading", nil, on(1000), Decision{Why: "no reading yet"}, 0},
		{"acked below every reading", three, on(99), waiting, 3},
		{"acked exactly at the first", three, on(100), Decision{Delete: true, Below: 10}, 3},
		{"acked between: the newest reached", three, on(250), Decision{Delete: true, Below: 20}, 2},
		{"acked past all", three, on(1 << 40), Decision{Delete: true, Below: 30}, 1},
		{"not the slot's owner", three, State{Session: 1, HoldRead: true, Acked: 1 << 40}, Decision{Why: "not streaming from the slot"}, 1},
		{"hold unread", three, State{Owner: true, Session: 1, Acked: 1 << 40}, Decision{Why: "the lost slots' repair holds could not be read"}, 1},
		{"snapshot pending", three, State{Owner: true, HoldRead: true, Session: 1, Snapshot: true, Acked: 1 << 40}, Decision{Why: "the initial snapshot is not done"}, 1},
		{"gap recorded", three, State{Owner: true, HoldRead: true, Session: 1, Gap: true, Acked: 1 << 40}, Decision{Why: "a gap is recorded and its repair not acknowledged"}, 1},
		{"gap with nothing reached", three, State{Owner: true, HoldRead: true, Session: 1, Gap: true}, Decision{Why: "a gap is recorded and its repair not acknowledged"}, 3},
		{"owner with acked zero", three, State{Owner: true, HoldRead: true, Session: 1}, waiting, 3},
		// A reading of another history is never compared with the position.
		{"timeline changed", append(three[:2:2], other(Epoch{SystemID: "7", Timeline: 2, Conn: 1, Session: 1})), on(250), waiting, 1},
		{"system changed", append(three[:2:2], other(Epoch{SystemID: "8", Timeline: 1, Conn: 1, Session: 1})), on(250), waiting, 1},
		{"retainer reconnected", append(three[:2:2], other(Epoch{SystemID: "7", Timeline: 1, Conn: 2, Session: 1})), on(250), waiting, 1},
		{"stream reconnected", three, State{Owner: true, HoldRead: true, Session: 2, Acked: 1 << 40}, waiting, 0},
		// The xid span replaces a clock: a reading stays usable while its xid
		// is comparable, however long the position stalls.
		{"old reading by xid", []Reading{r(100, 10), {WAL: 300, Xmin: 10 + maxXidSpan, Next: 10 + maxXidSpan, Epoch: ep}}, on(200), waiting, 1},
		{"reading at the span bound used", []Reading{r(100, 10), {WAL: 300, Xmin: 9 + maxXidSpan, Next: 9 + maxXidSpan, Epoch: ep}}, on(200),
			Decision{Delete: true, Below: 10}, 2},
		// Every other slot of the database bounds the position.
		{"another slot behind", withSlots(three, Slot{"debezium", 150}), on(1 << 40), Decision{Delete: true, Below: 10}, 3},
		{"another slot with nothing confirmed", withSlots(three, Slot{"new", 0}), on(1 << 40),
			Decision{Why: "waiting for slot new (another consumer of the database, confirmed at 0/0) to reach a reading"}, 3},
		{"other slots ahead", withSlots(three, Slot{"a", 1 << 41}, Slot{"b", 1 << 41}), on(250), Decision{Delete: true, Below: 20}, 2},
		// The lost slot's hold travels with the decision, within the span.
		{"hold", three, State{Owner: true, HoldRead: true, Session: 1, Acked: 1 << 40, Hold: Hold{From: 5, Below: 25}},
			Decision{Delete: true, Below: 30, Keep: Hold{From: 5, Below: 25}}, 1},
		{"hold too old", []Reading{{WAL: 1, Xmin: maxXidSpan + 100, Next: maxXidSpan + 100, Epoch: ep}},
			State{Owner: true, HoldRead: true, Session: 1, Acked: 1 << 40, Hold: Hold{From: 99, Below: 150}},
			Decision{Why: "the lost slot's hold on xids [99, 150) is too far back to compare with rows' xids: run outbox-cdc verify --repair"}, 1},
		{"unknown start, recent hold", []Reading{{WAL: 1, Xmin: maxXidSpan + 100, Next: maxXidSpan + 100, Epoch: ep}},
			State{Owner: true, HoldRead: true, Session: 1, Acked: 1 << 40, Hold: Hold{Below: maxXidSpan}},
			Decision{Delete: true, Below: maxXidSpan + 100, Keep: Hold{Below: maxXidSpan}}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, kept := Decide(c.readings, c.s)
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
// the newest readings, which vouch for the most rows, and the one in use.
func TestDecideKeepsNewest(t *testing.T) {
	at := func(wal lsn.LSN, xmin uint64) Reading { return Reading{WAL: wal, Xmin: xmin, Next: xmin + 1} }
	rs := []Reading{at(100, 10), at(200, 20)}
	d, kept := Decide(rs, State{Owner: true, HoldRead: true, Acked: 150})
	d2, _ := Decide(append(kept, at(300, 30)), State{Owner: true, HoldRead: true, Acked: 150})
	if d.Below != 10 || d2 != d {
		t.Fatalf("first round %+v, second %+v: want both to delete below 10", d, d2)
	}
	rs = nil
	for i := range keep + 10 {
		rs = append(rs, at(lsn.LSN(1000+i), uint64(i)))
	}
	_, kept = Decide(rs, State{Owner: true, HoldRead: true, Acked: 1})
	if len(kept) != keep || kept[len(kept)-1].Xmin != uint64(keep+9) || kept[0].Xmin != 10 {
		t.Fatalf("kept %d, first %d, last %d", len(kept), kept[0].Xmin, kept[len(kept)-1].Xmin)
	}
	_, kept = Decide(rs, State{Owner: true, HoldRead: true, Acked: 1000})
	if len(kept) != keep || kept[0].Xmin != 0 || kept[1].Xmin != 11 || kept[len(kept)-1].Xmin != uint64(keep+9) {
		t.Fatalf("kept %d, first %d, second %d, last %d", len(kept), kept[0].Xmin, kept[1].Xmin, kept[len(kept)-1].Xmin)
	}
}

// TestDecideStallKeepsReading: one event waiting for an hour (an unknown
// topic) keeps only the rows committed after the last reading below it:
// the reading in use is not dropped by age, so what waits is bounded by
// one retention_interval of rows, delivered or not (issue 35, item 6).
func TestDecideStallKeepsReading(t *testing.T) {
	s := State{Owner: true, HoldRead: true, Acked: 150} // the waiting event commits at 151
	rs := []Reading{{WAL: 140, Xmin: 10, Next: 11}}
	for i := range 3600 { // a reading a second, each past the waiting event
		rs = append(rs, Reading{WAL: lsn.LSN(200 + i), Xmin: uint64(20 + i), Next: uint64(21 + i)})
		var d Decision
		d, rs = Decide(rs, s)
		if !d.Delete || d.Below != 10 {
			t.Fatalf("after %d readings: %+v, want to delete below xid 10", i+1, d)
		}
	}
}

func TestBoundNamesTheSlot(t *testing.T) {
	b, why := Bound(500, []Slot{{"a", 700}, {"b", 300}, {"c", 400}})
	if b != 300 || !strings.Contains(why, "slot b") {
		t.Fatalf("Bound = %v, %q; want 300 by slot b", b, why)
	}
	if b, why := Bound(500, nil); b != 500 || why != "the acknowledged position" {
		t.Fatalf("Bound without slots = %v, %q", b, why)
	}
}

func TestHoldMerge(t *testing.T) {
	cases := []struct{ a, b, want Hold }{
		{Hold{}, Hold{}, Hold{}},
		{Hold{From: 5, Below: 9}, Hold{}, Hold{From: 5, Below: 9}},
		{Hold{}, Hold{From: 5, Below: 9}, Hold{From: 5, Below: 9}},
		{Hold{From: 5, Below: 9}, Hold{From: 7, Below: 12}, Hold{From: 5, Below: 12}},
		{Hold{From: 0, Below: 9}, Hold{From: 7, Below: 12}, Hold{From: 0, Below: 12}},
	}
	for _, c := range cases {
		if got := c.a.Merge(c.b); got != c.want {
			t.Errorf("%+v.Merge(%+v) = %+v, want %+v", c.a, c.b, got, c.want)
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
