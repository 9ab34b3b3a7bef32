// Package offsetstest holds the checks every offsets.Store must pass, for
// the tests of each store (offsets' file store, replication's table store).
package offsetstest

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// RepairHold runs the repair hold's rules (offsets.Checkpoint.RepairSince)
// against s, which must hold no checkpoint: a save keeps the earliest of the
// stored and the saved hold, Replace included, and only ClearRepair from at
// most the hold removes it.
func RepairHold(ctx context.Context, t *testing.T, s offsets.Store) {
	t.Helper()
	h := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	none := time.Time{}
	steps := []struct {
		what     string
		do       func() (bool, error)
		cleared  bool
		wantHold time.Time
	}{
		{"a save without a hold", save(ctx, s, s.Save, 1, none), false, none},
		{"a new slot's hold", save(ctx, s, s.Replace, 2, h), false, h},
		{"a later save keeps it", save(ctx, s, s.Save, 3, none), false, h},
		{"a later hold does not move it", save(ctx, s, s.Replace, 4, h.Add(time.Hour)), false, h},
		{"an earlier hold does", save(ctx, s, s.Save, 5, h.Add(-time.Hour)), false, h.Add(-time.Hour)},
		{"a repair from after the hold leaves it", clear(ctx, s, h), false, h.Add(-time.Hour)},
		{"a repair from the hold clears it", clear(ctx, s, h.Add(-time.Hour)), true, none},
		{"a save after the clear does not bring it back", save(ctx, s, s.Save, 6, none), false, none},
		{"nothing left to clear", clear(ctx, s, h.Add(-2*time.Hour)), false, none},
	}
	for _, st := range steps {
		cleared, err := st.do()
		if err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		got, err := s.Load(ctx)
		if err != nil {
			t.Fatalf("%s: load: %v", st.what, err)
		}
		if cleared != st.cleared || !got.RepairSince.Equal(st.wantHold) {
			t.Errorf("%s: cleared %v, hold %v; want %v, %v", st.what, cleared, got.RepairSince, st.cleared, st.wantHold)
		}
	}
}

func save(ctx context.Context, s offsets.Store, how func(context.Context, offsets.Checkpoint) error, pos lsn.LSN, hold time.Time) func() (bool, error) {
	return func() (bool, error) {
		return false, how(ctx, offsets.Checkpoint{LSN: pos, SnapshotDone: true, RepairSince: hold})
	}
}

func clear(ctx context.Context, s offsets.Store, since time.Time) func() (bool, error) {
	return func() (bool, error) { return s.ClearRepair(ctx, since) }
}
