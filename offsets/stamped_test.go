package offsets

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestCommitTimes: the time returned for a position is never later than the
// commit of the newest transaction at or below it, and nothing is guessed
// for a position older than what the ring remembers.
func TestCommitTimes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c CommitTimes
	if _, ok := c.Before(100); ok {
		t.Fatal("an empty ring knows a commit time")
	}
	c.Add(100, t0)
	c.Add(200, t0.Add(time.Millisecond)) // within coalesce: joins the entry of 100
	c.Add(300, t0.Add(time.Second))
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
		got, ok := c.Before(tt.pos)
		if ok != tt.wantOK || !got.Equal(tt.want) {
			t.Errorf("Before(%v) = %v, %v; want %v, %v", tt.pos, got, ok, tt.want, tt.wantOK)
		}
	}
	// Past the ring's length the oldest entries are forgotten, not guessed.
	var r CommitTimes
	for i := range 3 * len(r.ring) {
		r.Add(lsn.LSN(1000+i), t0.Add(time.Duration(i)*time.Second))
	}
	if _, ok := r.Before(1000); ok {
		t.Error("a forgotten position has a commit time")
	}
	last := lsn.LSN(1000 + 3*len(r.ring) - 1)
	if got, ok := r.Before(last); !ok || !got.Equal(t0.Add(time.Duration(3*len(r.ring)-1)*time.Second)) {
		t.Errorf("newest position: %v, %v", got, ok)
	}
}

// TestStampedTimeline: once the stream reports a timeline (it followed a
// promotion), saves carry it instead of the one at start; what the store
// holds is remembered and reported.
func TestStampedTimeline(t *testing.T) {
	ctx := t.Context()
	store := NewFileStore(filepath.Join(t.TempDir(), "checkpoint"))
	id := Identity{SystemID: "7300000000000000001", Timeline: 1, Database: "app", Slot: "s"}
	var reported lsn.LSN
	s := NewStamped(store, id, func(c Checkpoint) { reported = c.LSN })
	if _, ok := s.Held(); ok {
		t.Fatal("a checkpoint is held before any load or save")
	}
	for _, step := range []struct {
		streamTLI int32
		pos       lsn.LSN
		want      int32
	}{{0, 0x100, 1}, {1, 0x200, 1}, {2, 0x300, 2}} {
		s.Timeline.Store(step.streamTLI)
		if err := s.Save(ctx, Checkpoint{LSN: step.pos, SnapshotDone: true}); err != nil {
			t.Fatal(err)
		}
		got, err := store.Load(ctx)
		if err != nil || got.Timeline != step.want || got.SystemID != id.SystemID || got.LSN != step.pos {
			t.Fatalf("after a save on stream timeline %d: %+v, %v; want timeline %d at %v", step.streamTLI, got, err, step.want, step.pos)
		}
		if held, ok := s.Held(); !ok || held.LSN != step.pos || reported != step.pos {
			t.Fatalf("held %+v, %v, reported %v; want %v", held, ok, reported, step.pos)
		}
	}
}

// TestCommitTimesAfter: the oldest transaction ending above a position,
// which the oldest-unacknowledged-event age is measured from.
func TestCommitTimesAfter(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var c CommitTimes
	if _, ok := c.After(0); ok {
		t.Fatal("an empty ring knows a commit after 0")
	}
	c.Add(100, t0)
	c.Add(200, t0.Add(time.Second))
	c.Add(300, t0.Add(2*time.Second))
	for _, tt := range []struct {
		pos    lsn.LSN
		want   time.Time
		wantOK bool
	}{
		{0, t0, true},
		{99, t0, true},
		{100, t0.Add(time.Second), true},
		{250, t0.Add(2 * time.Second), true},
		{300, time.Time{}, false},
		{1 << 40, time.Time{}, false},
	} {
		got, ok := c.After(tt.pos)
		if ok != tt.wantOK || !got.Equal(tt.want) {
			t.Errorf("After(%v) = %v, %v; want %v, %v", tt.pos, got, ok, tt.want, tt.wantOK)
		}
	}
}
