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
