package replication

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestTableStoreReview2MergedGapKeepsStaleColumn (review 2 of
// 0105cfc..b302077; FAILS at b302077): gap_repaired now carries the gap's
// since and xmin and is ignored when they differ from gap_since/gap_xmin.
// But an older binary (1cbd15e: no gap_repaired, its upsert leaves the
// column as it was) that loads the newer binary's gap G {S, X} and whose
// guard finds a second gap G2 before G is cleared records the merge
// {min(S, verified), min(X, guard xmin)}: once a reading vouched past S,
// that is {S, X} again, and in at_least_once (no anchor) it is saved so.
// The column's since/xmin then match by construction, not by accident: the
// upgraded binary loads G's Pending with the merged gap, and resolved takes
// a Pending that published nothing (End 0, unconditional) or whose End
// Kafka passed for the whole gap: Xmin = noXmin, nothing is read, and G2's
// rows (written while the table was out again, never decoded) are lost
// unless the change-while-stopped check finds G2 again (not for a
// FOR TABLES IN SCHEMA membership).
// Suggested fix: tie the column to the save that wrote it, e.g. store in
// it the row's updated_at (set by now() in the same upsert, e.g. with
// jsonb_build_object server-side) and ignore it when updated_at differs:
// every older binary's save sets updated_at = now().
func TestTableStoreReview2MergedGapKeepsStaleColumn(t *testing.T) {
	ctx, pg, conn := startServer(t)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA review2_store`); err != nil {
		t.Fatal(err)
	}
	db := mustDB(t, pg.DSN("postgres"))
	id, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store := NewTableStore(db, "review2_store.checkpoints", "s")
	defer store.Close()
	ident := offsets.Identity{SystemID: id.SystemID, Timeline: id.Timeline, Database: id.Database, Slot: "s"}
	// The newer binary: gap G {0/300, 80}; its repair read [80, 90) and
	// published nothing (every row was the stream's): Pending End 0.
	pending := offsets.PendingRepair{Rows: offsets.RepairedRows{Xmin: 80, Below: 90}}
	if err := store.Save(ctx, offsets.Checkpoint{LSN: 0x100, SnapshotDone: true, Identity: ident,
		Gap: &offsets.Gap{Since: 0x300, Xmin: 80, Pending: pending}}); err != nil {
		t.Fatal(err)
	}
	// The older binary (downgrade): it loads {0/300, 80}, its guard finds
	// G2 (verified 0/380 >= 0/300, xmin 95 >= 80) and saves the merge,
	// {0/300, 80}, with its own upsert (gap_repaired not among its columns).
	oldSave := `INSERT INTO review2_store.checkpoints AS t (slot, lsn, snapshot_done, updated_at, gap_since, gap_xmin)
		VALUES ('s', $1::pg_lsn, true, now(), $2::pg_lsn, $3::bigint)
		ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn, snapshot_done = excluded.snapshot_done, updated_at = now(),
			gap_since = excluded.gap_since, gap_xmin = excluded.gap_xmin`
	if _, err := conn.Exec(ctx, oldSave, "0/100", "0/300", int64(80)); err != nil {
		t.Fatal(err)
	}
	got, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Gap == nil || got.Gap.Since != 0x300 || got.Gap.Xmin != 80 {
		t.Fatalf("premise: loaded gap %+v", got.Gap)
	}
	if got.Gap.Pending != (offsets.PendingRepair{}) || !got.Gap.Repaired.IsZero() || got.Gap.LookUp {
		t.Fatalf("LOSS (after the upgrade): the older binary's merged gap {0/300, 80} (G with G2) loads with the newer "+
			"binary's record of G's repair %+v: resolved takes Pending (End 0) for the whole gap's and reads nothing of G2", *got.Gap)
	}
}
