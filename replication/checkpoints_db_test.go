package replication

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestTableStoreStampsServerTimeline: a connector that followed a
// promotion without restarting still holds the identity it started with
// (timeline 1); the table store records the timeline the server writes on,
// so the restart's CheckPosition trusts a position past the fork instead of
// taking it for a point-in-time restore.
func TestTableStoreStampsServerTimeline(t *testing.T) {
	if testing.Short() || os.Getenv(testenv.EnvPGDSN) != "" {
		t.Skip("starts a primary and a standby of its own")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	standby, err := testenv.StartStandby(ctx, primary, testenv.StandbyOptions{NoSyncStandbySlots: true})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	db, err := ParseDB(primary.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	before, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if db, err = ParseDB(standby.DSN("postgres"), nil); err != nil {
		t.Fatal(err)
	}
	after, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fork, ok := after.ForkPoint(before.Timeline)
	if after.Timeline == before.Timeline || !ok {
		t.Fatalf("promotion: timeline %d -> %d, history %v", before.Timeline, after.Timeline, after.History)
	}
	store := NewTableStore(db, "outbox_cdc.checkpoints", "s")
	defer store.Close()
	saved := offsets.Checkpoint{LSN: after.WALEnd, SnapshotDone: true, Identity: offsets.Identity{SystemID: before.SystemID,
		Timeline: before.Timeline, Database: before.Database, Slot: "s"}}
	if saved.LSN <= fork {
		t.Fatalf("WAL end %v not past the fork %v", saved.LSN, fork)
	}
	if err := store.Save(ctx, saved); err != nil {
		t.Fatal(err)
	}
	got, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Timeline != after.Timeline {
		t.Fatalf("stored timeline %d, want the server's %d", got.Timeline, after.Timeline)
	}
	now, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPosition(got, now, store.Forget()); err != nil {
		t.Fatalf("restart refuses the checkpoint saved after following the promotion: %v", err)
	}
	// The rule itself is unchanged: the same position with the stale stamp
	// is indistinguishable from a restore to before it, and refused.
	if err := CheckPosition(saved, now, store.Forget()); err == nil {
		t.Fatalf("a checkpoint stamped timeline %d past its fork %v was trusted", saved.Timeline, fork)
	}
}
