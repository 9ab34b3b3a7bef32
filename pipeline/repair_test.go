package pipeline

import (
	"log/slog"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestRepairDecide: the one decision at start, from the gap the checkpoint
// holds, the position committed to Kafka and a change found while stopped.
func TestRepairDecide(t *testing.T) {
	loaded := &gapInfo{Since: 100, Xmin: 50}
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
			gap: loaded, clear: 101},
		{name: "a change while stopped places a gap at the start", change: &stoppedChange{why: "w", since: 300, xmin: 70},
			want: &gapInfo{Since: 300, Xmin: 70}, gap: &gapInfo{Since: 300, Xmin: 70}, placed: true},
		{name: "a change the pending repair covers", loaded: loaded, change: &stoppedChange{why: "w", since: 300, xmin: 50},
			want: loaded, gap: loaded},
		{name: "a change below the pending repair's bound widens it", loaded: loaded,
			change: &stoppedChange{why: "w", since: 300, xmin: 40},
			want:   &gapInfo{Since: 100, Xmin: 40}, gap: &gapInfo{Since: 100, Xmin: 40}, placed: true},
		{name: "a change after a committed repair gets its own, looked up in Kafka", loaded: loaded, committed: 200,
			change: &stoppedChange{why: "w", since: 300, xmin: 60},
			want:   &gapInfo{Since: 300, Xmin: 60}, gap: &gapInfo{Since: 300, Xmin: 60}, placed: true, lookUp: true},
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
	r2.committed(300, 250) // the repair's transaction ends at 300; its rows commit before 250
	if r2.pending.Load() {
		t.Fatal("still pending after the repair was handed over")
	}
	if _, ok := r2.bound(299); !ok {
		t.Fatal("the hold let go before the watermark passed the repair's transaction")
	}
	if _, ok := r2.bound(300); ok {
		t.Fatal("the hold keeps the bound after the repair is acknowledged")
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
