package offsets

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

func TestFileStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "checkpoint")
	s := NewFileStore(path)
	if _, err := s.Load(ctx); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("first Load = %v, want ErrNoCheckpoint", err)
	}
	for _, c := range []Checkpoint{{LSN: 0x16B374D848}, {LSN: 0x16B374D900, SnapshotDone: true}} {
		if err := s.Save(ctx, c); err != nil {
			t.Fatalf("Save: %v", err)
		}
		got, err := s.Load(ctx)
		if err != nil || got.LSN != c.LSN || got.SnapshotDone != c.SnapshotDone {
			t.Fatalf("Load = %+v, %v; want %+v", got, err, c)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("%d files in the directory, want only the checkpoint (no temp files left)", len(entries))
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx); err == nil || errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("corrupt file: Load = %v, want an error", err)
	}
}

// TestFileStoreIdentity: the identity round-trips, a checkpoint of an older
// version (no identity fields) loads with a zero identity, Save never moves a
// same-identity position back, and Replace always writes.
func TestFileStoreIdentity(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "checkpoint")
	s := NewFileStore(path)
	if err := os.WriteFile(path, []byte(`{"lsn":"0/500","snapshot_done":true,"updated_at":"2025-01-01T00:00:00Z"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := s.Load(ctx)
	if err != nil || !old.IsZero() || old.LSN != 0x500 {
		t.Fatalf("old-format file: Load = %+v, %v; want LSN 0/500 and no identity", old, err)
	}
	a := Identity{SystemID: "7300000000000000001", Timeline: 1, Database: "app", Slot: "outbox_cdc"}
	b := a
	b.Timeline = 2
	steps := []struct {
		name    string
		replace bool
		c       Checkpoint
		stale   bool
		want    lsn.LSN // stored LSN afterwards
	}{
		{"identity added to an old checkpoint, lower", false, Checkpoint{LSN: 0x400, Identity: a}, false, 0x400},
		{"forward", false, Checkpoint{LSN: 0x600, Identity: a, CommitTime: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}, false, 0x600},
		{"same position again", false, Checkpoint{LSN: 0x600, Identity: a}, false, 0x600},
		{"back, same identity: stale", false, Checkpoint{LSN: 0x580, Identity: a}, true, 0x600},
		{"back, identity changed", false, Checkpoint{LSN: 0x100, Identity: b}, false, 0x100},
		{"replace moves back", true, Checkpoint{LSN: 0x50, Identity: b}, false, 0x50},
	}
	for _, st := range steps {
		save := s.Save
		if st.replace {
			save = s.Replace
		}
		err := save(ctx, st.c)
		if errors.Is(err, ErrStale) != st.stale || (err != nil && !st.stale) {
			t.Fatalf("%s: err = %v, want stale=%v", st.name, err, st.stale)
		}
		got, err := s.Load(ctx)
		if err != nil || got.LSN != st.want {
			t.Fatalf("%s: stored %+v, %v; want LSN %v", st.name, got, err, st.want)
		}
		if !st.stale && got.Identity != st.c.Identity {
			t.Fatalf("%s: stored identity %+v, want %+v", st.name, got.Identity, st.c.Identity)
		}
		if !st.stale && !got.CommitTime.Equal(st.c.CommitTime) {
			t.Fatalf("%s: stored commit time %v, want %v", st.name, got.CommitTime, st.c.CommitTime)
		}
	}
	if f := s.Forget(); f != "remove the file "+path {
		t.Errorf("Forget() = %q", f)
	}
}

func TestWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := (*Window)(nil).Confirmable(t0, 100); got != 100 {
		t.Fatalf("nil window: %v", got)
	}
	b := NewWindow(0, 1000)
	if got := b.Confirmable(t0, 5000); got != 4000 {
		t.Fatalf("byte window: %v, want 4000", got)
	}
	if got := b.Confirmable(t0, 500); got != 0 {
		t.Fatalf("byte window below size: %v, want 0", got)
	}
	d := NewWindow(time.Minute, 0)
	steps := []struct {
		after time.Duration
		acked uint64
		want  uint64
	}{
		{0, 100, 0},                // nothing a minute old yet
		{30 * time.Second, 200, 0}, // still not
		{60 * time.Second, 300, 100},
		{95 * time.Second, 400, 200},
		{10 * time.Minute, 400, 400},
	}
	for _, s := range steps {
		if got := d.Confirmable(t0.Add(s.after), lsn.LSN(s.acked)); uint64(got) != s.want {
			t.Fatalf("at +%v acked %d: confirmable %d, want %d", s.after, s.acked, got, s.want)
		}
	}
	if len(d.samples) > 2 {
		t.Fatalf("window keeps %d samples, want old ones dropped", len(d.samples))
	}
}
