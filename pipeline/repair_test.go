package pipeline

import (
	"log/slog"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestRepairDecide: the one decision at start, from the gap the checkpoint
// holds, the position committed to Kafka and a change found while stopped.
func TestRepairDecide(t *testing.T) {
	loaded := &gapInfo{Since: 100, Xmin: 50}
	rows := offsets.RepairedRows{Xmin: 50, Below: 60}
	tests := []struct {
		name      string
		loaded    *gapInfo
		committed lsn.LSN
		change    *stoppedChange
		want      *gapInfo // the repair this run runs (nil: none)
		gap       *gapInfo // the gap recorded after the decision
		clear     lsn.LSN
		placed    bool
		lookUp    bool
	}{
		{name: "nothing recorded, nothing changed"},
		{name: "the checkpoint's gap is repaired", loaded: loaded, want: loaded, gap: loaded},
		{name: "committed at Since: the repair did not commit", loaded: loaded, committed: 100, want: loaded, gap: loaded},
		{name: "committed past Since: the repair committed before the restart", loaded: loaded, committed: 101,
			gap: &gapInfo{Since: 100, Xmin: noXmin}, clear: 101}, // kept, nothing to read, until cleared
		{name: "a change while stopped places a gap at the start", change: &stoppedChange{why: "w", since: 300, xmin: 70, saved: 70},
			want: &gapInfo{Since: 300, Xmin: 70}, gap: &gapInfo{Since: 300, Xmin: 70}, placed: true},
		{name: "a change the pending repair covers", loaded: loaded, change: &stoppedChange{why: "w", since: 300, xmin: 50, saved: 50},
			want: loaded, gap: loaded},
		{name: "a change below the pending repair's bound widens it", loaded: loaded,
			change: &stoppedChange{why: "w", since: 300, xmin: 40, saved: 40},
			want:   &gapInfo{Since: 100, Xmin: 40}, gap: &gapInfo{Since: 100, Xmin: 40}, placed: true},
		{name: "at_least_once: the start's floor does not lower the pending repair's bound", loaded: loaded,
			change: &stoppedChange{why: "w", since: 300, xmin: 30, saved: 50}, want: loaded, gap: loaded},
		{name: "at_least_once: a saved bound below the pending repair's widens it, not the floor", loaded: loaded,
			change: &stoppedChange{why: "w", since: 300, xmin: 30, saved: 45},
			want:   &gapInfo{Since: 100, Xmin: 45}, gap: &gapInfo{Since: 100, Xmin: 45}, placed: true},
		{name: "a change after a committed repair gets its own, looked up in Kafka", loaded: loaded, committed: 200,
			change: &stoppedChange{why: "w", since: 300, xmin: 60, saved: 60},
			want:   &gapInfo{Since: 300, Xmin: 60, LookUp: true}, gap: &gapInfo{Since: 300, Xmin: 60, LookUp: true},
			placed: true, lookUp: true},
		{name: "the look-up is recorded with the gap", loaded: &gapInfo{Since: 300, Xmin: 60, LookUp: true},
			want: &gapInfo{Since: 300, Xmin: 60, LookUp: true}, gap: &gapInfo{Since: 300, Xmin: 60, LookUp: true}, lookUp: true},
		{name: "a pending repair in Kafka: the part after it, saved before the stream", committed: 112,
			loaded: &gapInfo{Since: 115, Xmin: 50, Pending: offsets.PendingRepair{Rows: rows, End: 110, Later: 70}},
			want:   &gapInfo{Since: 115, Xmin: 70, Repaired: rows}, gap: &gapInfo{Since: 115, Xmin: 70, Repaired: rows},
			placed: true},
		{name: "a pending repair not in Kafka: all of the gap, saved before the stream", committed: 100,
			loaded: &gapInfo{Since: 115, Xmin: 50, Pending: offsets.PendingRepair{Rows: rows, End: 110, Later: 70}},
			want:   &gapInfo{Since: 115, Xmin: 50}, gap: &gapInfo{Since: 115, Xmin: 50}, placed: true},
		{name: "a repair that published nothing is in Kafka: nothing left", committed: 90,
			loaded: &gapInfo{Since: 100, Xmin: 50, Pending: offsets.PendingRepair{Rows: rows}},
			gap:    &gapInfo{Since: 100, Xmin: noXmin, Repaired: rows}, clear: 100, placed: true},
		{name: "a change after a repair that is in Kafka leaves its rows out", committed: 120,
			loaded: &gapInfo{Since: 100, Xmin: 50, Pending: offsets.PendingRepair{Rows: rows, End: 110}},
			change: &stoppedChange{why: "w", since: 300, xmin: 40, saved: 40},
			want:   &gapInfo{Since: 300, Xmin: 40, Repaired: rows, LookUp: true},
			gap:    &gapInfo{Since: 300, Xmin: 40, Repaired: rows, LookUp: true}, placed: true, lookUp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRepair(slog.New(slog.DiscardHandler))
			if tt.loaded != nil {
				r.load(*tt.loaded)
			}
			placed, lookUp := r.decide(tt.committed, tt.change)
			if placed != tt.placed || lookUp != tt.lookUp {
				t.Errorf("placed, lookUp = %v, %v, want %v, %v", placed, lookUp, tt.placed, tt.lookUp)
			}
			if got := repairOf(r); !sameGap(got, tt.want) {
				t.Errorf("repairs %v, want %v", got, tt.want)
			}
			if r.pending.Load() != (tt.want != nil) {
				t.Errorf("pending = %v, want %v", r.pending.Load(), tt.want != nil)
			}
			if got := r.gap.Load(); !sameGap(got, tt.gap) {
				t.Errorf("gap %v, want %v", got, tt.gap)
			}
			if got := lsn.LSN(r.clear.Load()); got != tt.clear {
				t.Errorf("clear = %v, want %v", got, tt.clear)
			}
			if tt.placed && r.saved == r.gap.Load() {
				t.Error("a placed gap counts as saved: the start would not save it before the stream")
			}
		})
	}
}

func repairOf(r *repair) *gapInfo {
	if r.bf == nil {
		return nil
	}
	return &r.bf.gapInfo
}

func sameGap(a, b *gapInfo) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// TestRepairLifecycle walks a gap from its finding to its clearing, with
// what each step lets the checkpoint record, retention delete and the
// exactly_once hold confirm.
func TestRepairLifecycle(t *testing.T) {
	r := newRepair(slog.New(slog.DiscardHandler))
	r.decide(0, nil)
	if r.blocksRetention() || r.open() {
		t.Fatal("no gap: retention blocked or a gap open")
	}
	if g, changed := r.toSave(500, nil); g != nil || changed {
		t.Fatalf("toSave with no gap = %v, %v", g, changed)
	}

	// Found while running, twice: merged to the lower bounds.
	r.found(gapInfo{Since: 200, Xmin: 30})
	r.found(gapInfo{Since: 150, Xmin: 40})
	if g := r.gap.Load(); *g != (gapInfo{Since: 150, Xmin: 30}) {
		t.Fatalf("merged gap %v, want {150 30}", *g)
	}
	if !r.blocksRetention() || !r.open() {
		t.Fatal("a recorded gap must block retention")
	}

	// exactly_once: the save anchors it at the last end handed over, once.
	g, changed := r.toSave(160, func() lsn.LSN { return 180 })
	if !changed || g.Since != 180 || g.Xmin != 30 {
		t.Fatalf("anchored %v (changed %v), want Since 180", g, changed)
	}
	r.wasSaved(g)
	if g2, changed := r.toSave(170, func() lsn.LSN { t.Fatal("froze again"); return 0 }); g2 != g || changed {
		t.Fatalf("second save: %v changed %v, want the anchored gap unchanged", g2, changed)
	}

	// The restart: the gap loaded, the repair decided and run.
	r2 := newRepair(slog.New(slog.DiscardHandler))
	r2.load(*g)
	r2.decide(0, nil)
	if r2.bf == nil || !r2.pending.Load() {
		t.Fatal("the loaded gap is not repaired")
	}
	if x, ok := r2.bound(1000); !ok || x != 30 {
		t.Fatalf("bound = %d, %v: the hold must keep the gap's bound until the repair commits", x, ok)
	}
	if got, _ := r2.toSave(100, func() lsn.LSN { return 999 }); got.Since != 180 {
		t.Fatalf("the loaded gap was anchored again: %v", got)
	}
	read := offsets.RepairedRows{Xmin: 30, Below: 40}
	r2.committed(300, 250, read, true) // the repair's transaction ends at 300; its rows commit before 250
	if r2.pending.Load() {
		t.Fatal("still pending after the repair was handed over")
	}
	if _, ok := r2.bound(299); !ok {
		t.Fatal("the hold let go before the watermark passed the repair's transaction")
	}
	if _, ok := r2.bound(300); !ok {
		t.Fatal("the hold let go before a checkpoint recorded the repair")
	}
	if g, _ := r2.toSave(240, nil); g == nil || g.Pending.Rows != read || g.Pending.End != 300 {
		t.Fatalf("the checkpoint records %+v, want the repair pending with what it read", g)
	} else {
		r2.wasSaved(g)
	}
	if _, ok := r2.bound(300); ok {
		t.Fatal("the hold keeps the bound after the repair is acknowledged and recorded")
	}
	if got := r2.recorded(249); got == nil {
		t.Fatal("the gap was cleared before the watermark passed the repair's rows")
	}
	if got := r2.recorded(250); got != nil || r2.blocksRetention() {
		t.Fatalf("the gap is still recorded (%v) or blocks retention after its repair", got)
	}
	if _, changed := r2.toSave(300, nil); !changed {
		t.Fatal("the cleared gap does not make the next save due")
	}

	// A gap found after a repair committed is cleared only by its own.
	r2.found(gapInfo{Since: 400, Xmin: 90})
	if got := r2.recorded(1000); got == nil {
		t.Fatal("a new gap was cleared by the old repair's position")
	}
}

// TestRepairGapAfterCommittedRepair: exactly_once. A run repairs a gap
// (its transaction handed over to Kafka) and, before the watermark clears
// it, the guard finds a second gap; the two are recorded as one. The
// restart must not read the first repair's rows again once Kafka holds
// them: they were never decodable, so nothing in the stream says they are
// delivered. The long exactly_once chaos run (seed 12424546033271313958)
// sent 2,288 copies this way after two publication changes 2 s apart.
func TestRepairGapAfterCommittedRepair(t *testing.T) {
	r := newRepair(slog.New(slog.DiscardHandler))
	r.load(gapInfo{Since: 100, Xmin: 50})
	r.decide(0, nil)
	read := offsets.RepairedRows{Xmin: 50, Below: 90, Xids: "92"}
	r.committed(300, 250, read, true) // handed over; the rows commit before 250
	r.found(gapInfo{Since: 260, Xmin: 80})
	r.found(gapInfo{Since: 270, Xmin: 85}) // found twice (the guard, then the final check)
	g, _ := r.toSave(260, func() lsn.LSN { return 320 })
	if x, ok := r.bound(299); !ok || x != 50 {
		t.Fatalf("bound = %d, %v: until the first repair is acknowledged a restart may repair from 50", x, ok)
	}

	// Kafka committed the first repair's transaction: only the second gap is read.
	r2 := newRepair(slog.New(slog.DiscardHandler))
	r2.load(*g)
	r2.decide(320, nil)
	if got := repairOf(r2); got == nil || got.Xmin != 80 || got.Repaired != read {
		t.Fatalf("after the first repair committed, the restart repairs %+v; want from the second gap's bound 80, "+
			"but for the rows the first read", got)
	}
	if x, ok := r2.bound(0); !ok || x != 80 {
		t.Fatalf("bound = %d, %v, want 80 until this repair commits", x, ok)
	}
	if g2, changed := r2.toSave(0, func() lsn.LSN { t.Fatal("froze a loaded gap"); return 0 }); !changed ||
		g2.Xmin != 80 || g2.Repaired != read || g2.Pending != (offsets.PendingRepair{}) {
		t.Fatalf("the resolved gap is not saved as such: %+v (changed %v)", g2, changed)
	}

	// Kafka lost it: the restart repairs both, from the first bound.
	r3 := newRepair(slog.New(slog.DiscardHandler))
	r3.load(*g)
	r3.decide(290, nil)
	if got := repairOf(r3); got == nil || got.Xmin != 50 || !got.Repaired.IsZero() {
		t.Fatalf("the first repair never committed, the restart repairs %+v; want all from 50", got)
	}

	// The second restart's repair is handed over too, and a third gap
	// merges: what both repairs read is left out once the second commits.
	r2.committed(400, 390, readRows(*repairOf(r2), offsets.RepairedRows{Xmin: 80, Below: 120, Xids: "125"}), true)
	r2.found(gapInfo{Since: 410, Xmin: 110})
	g3, _ := r2.toSave(0, func() lsn.LSN { return 450 })
	r4 := newRepair(slog.New(slog.DiscardHandler))
	r4.load(*g3)
	r4.decide(450, nil)
	want := gapInfo{Since: 450, Xmin: 110, Repaired: offsets.RepairedRows{Xmin: 50, Below: 120, Xids: "125"}}
	if got := repairOf(r4); got == nil || *got != want {
		t.Fatalf("third restart repairs %+v, want %+v", got, want)
	}
	// Kafka lost the second: the first is in Kafka still.
	r5 := newRepair(slog.New(slog.DiscardHandler))
	r5.load(*g3)
	r5.decide(399, nil)
	want = gapInfo{Since: 450, Xmin: 80, Repaired: read}
	if got := repairOf(r5); got == nil || *got != want {
		t.Fatalf("third restart without the second repair repairs %+v, want %+v", got, want)
	}
}

// TestFinishedAt: two gaps merged keep the finished transactions of the
// one with the lower Since (a reading behind the higher one could name a
// transaction committed between the two); at the same Since the older
// reading, unknown when either is.
func TestFinishedAt(t *testing.T) {
	f1 := offsets.FinishedTxns{Xmax: 90, Open: "85"}
	f2 := offsets.FinishedTxns{Xmax: 120, Open: "101,110"}
	for _, tt := range []struct {
		name string
		a, b gapInfo
		want offsets.FinishedTxns
	}{
		{"the lower Since's", gapInfo{Since: 100, Finished: f2}, gapInfo{Since: 200, Finished: f1}, f2},
		{"the lower Since's, the other way", gapInfo{Since: 200, Finished: f1}, gapInfo{Since: 100, Finished: f2}, f2},
		{"the lower Since's unknown", gapInfo{Since: 100}, gapInfo{Since: 200, Finished: f1}, offsets.FinishedTxns{}},
		{"same Since: the older reading", gapInfo{Since: 100, Finished: f2}, gapInfo{Since: 100, Finished: f1}, f1},
		{"same Since, one unknown", gapInfo{Since: 100, Finished: f2}, gapInfo{Since: 100}, offsets.FinishedTxns{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := finishedAt(tt.a, tt.b); got != tt.want {
				t.Fatalf("finishedAt = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestGuardsFinishedSeveralTables: with several outbox tables a gap's
// finished transactions are unknown: one table's guard vouches for its own
// table only (TestGuardReview15OtherTableChangeSettlesFloor).
func TestGuardsFinishedSeveralTables(t *testing.T) {
	g := &guards{gs: make([]*replication.Guard, 2)}
	if f := g.finished(1 << 40); !f.IsZero() {
		t.Fatalf("finished %+v with two tables, want unknown", f)
	}
}
