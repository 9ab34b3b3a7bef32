package pipeline

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestCommitTimes: the time returned for a position is never later than the
// commit of the newest transaction at or below it, and nothing is guessed
// for a position older than what the ring remembers.
func TestCommitTimes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c commitTimes
	if _, ok := c.before(100); ok {
		t.Fatal("an empty ring knows a commit time")
	}
	c.add(100, t0)
	c.add(200, t0.Add(time.Millisecond)) // within coalesce: joins the entry of 100
	c.add(300, t0.Add(time.Second))
	tests := []struct {
		pos    lsn.LSN
		want   time.Time
		wantOK bool
	}{
		{99, time.Time{}, false},
		{100, t0, true},
		{250, t0, true}, // the 200 transaction committed at t0+1ms: t0 is a lower bound
		{300, t0.Add(time.Second), true},
		{1 << 40, t0.Add(time.Second), true},
	}
	for _, tt := range tests {
		got, ok := c.before(tt.pos)
		if ok != tt.wantOK || !got.Equal(tt.want) {
			t.Errorf("before(%v) = %v, %v; want %v, %v", tt.pos, got, ok, tt.want, tt.wantOK)
		}
	}
	// Past the ring's length the oldest entries are forgotten, not guessed.
	var r commitTimes
	for i := range 3 * len(r.ring) {
		r.add(lsn.LSN(1000+i), t0.Add(time.Duration(i)*time.Second))
	}
	if _, ok := r.before(1000); ok {
		t.Error("a forgotten position has a commit time")
	}
	last := lsn.LSN(1000 + 3*len(r.ring) - 1)
	if got, ok := r.before(last); !ok || !got.Equal(t0.Add(time.Duration(3*len(r.ring)-1)*time.Second)) {
		t.Errorf("newest position: %v, %v", got, ok)
	}
}

// TestRunbook: a lost slot's error gains the repair command, starting
// repairMargin before the last delivered commit; other errors are kept.
func TestRunbook(t *testing.T) {
	commit := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := &Pipeline{cfg: Config{ConfigPath: "/etc/outbox-cdc.yaml"}, lastCkpt: &lastCheckpoint{}}
	lost := &replication.FatalError{Reason: "slot_invalidated", Err: errors.New("slot x was invalidated")}
	if got := p.runbook(lost); got != error(lost) {
		t.Fatalf("without a checkpoint: %v, want the error unchanged", got)
	}
	p.lastCkpt.c, p.lastCkpt.ok = offsets.Checkpoint{LSN: 0x500, CommitTime: commit}, true
	got := p.runbook(fmt.Errorf("stream: %w", lost))
	want := "outbox-cdc verify --config /etc/outbox-cdc.yaml --repair --since 2026-11-30T11:55:00Z"
	var f *replication.FatalError
	if !strings.Contains(got.Error(), want) || !errors.As(got, &f) || f.Reason != "slot_invalidated" {
		t.Fatalf("runbook: %v\nwant it to contain %q and keep the reason", got, want)
	}
	other := &replication.FatalError{Reason: "schema_mismatch", Err: errors.New("column gone")}
	if got := p.runbook(other); got != error(other) {
		t.Fatalf("schema error changed: %v", got)
	}
	if got := p.runbook(nil); got != nil {
		t.Fatalf("nil became %v", got)
	}
}

// TestIdentifiedStampsStreamTimeline: once the stream reports a timeline (it
// followed a promotion), saves carry it instead of the one at start.
func TestIdentifiedStampsStreamTimeline(t *testing.T) {
	ctx := t.Context()
	store := offsets.NewFileStore(filepath.Join(t.TempDir(), "checkpoint"))
	id := offsets.Identity{SystemID: "7300000000000000001", Timeline: 1, Database: "app", Slot: "s"}
	ident := identified{store, id, new(atomic.Int32), prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), &lastCheckpoint{}}
	for _, step := range []struct {
		streamTLI int32
		pos       lsn.LSN
		want      int32
	}{{0, 0x100, 1}, {1, 0x200, 1}, {2, 0x300, 2}} {
		ident.timeline.Store(step.streamTLI)
		if err := ident.Save(ctx, offsets.Checkpoint{LSN: step.pos, SnapshotDone: true}); err != nil {
			t.Fatal(err)
		}
		got, err := store.Load(ctx)
		if err != nil || got.Timeline != step.want || got.SystemID != id.SystemID || got.LSN != step.pos {
			t.Fatalf("after a save on stream timeline %d: %+v, %v; want timeline %d at %v", step.streamTLI, got, err, step.want, step.pos)
		}
		if last, ok := ident.last.get(); !ok || last.LSN != step.pos {
			t.Fatalf("last checkpoint %+v, %v; want %v", last, ok, step.pos)
		}
	}
}
