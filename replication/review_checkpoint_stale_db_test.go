package replication

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestTableStoreKeepsRepairedRowsReviewStaleColumn (review of
// 1cbd15e..0105cfc; FAILS at 0105cfc): gap_repaired belongs to the gap in
// gap_since/gap_xmin, but an older binary's save (its INSERT ... ON
// CONFLICT DO UPDATE lists every column but gap_repaired, see
// `git show 1cbd15e:replication/checkpoints.go`) leaves the column as the
// newer binary wrote it. A rollback to the older version that clears the
// newer version's gap and then records a gap of its own, followed by the
// upgrade again, loads the older binary's gap with the stale Pending: the
// upgraded binary's resolved takes it for this gap's repair, in Kafka
// (pipeline/review_repair_race_test.go, TestRepairReviewStaleGapRepairedColumn:
// the gap is not read at all: loss).
func TestTableStoreKeepsRepairedRowsReviewStaleColumn(t *testing.T) {
	ctx, pg, conn := startServer(t)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA review_store`); err != nil {
		t.Fatal(err)
	}
	db := mustDB(t, pg.DSN("postgres"))
	id, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store := NewTableStore(db, "review_store.checkpoints", "s")
	defer store.Close()
	ident := offsets.Identity{SystemID: id.SystemID, Timeline: id.Timeline, Database: id.Database, Slot: "s"}
	// The newer binary: a gap whose repair was handed over, not cleared yet.
	stale := offsets.PendingRepair{Rows: offsets.RepairedRows{Xmin: 50, Below: 60}, End: 0x2f0}
	if err := store.Save(ctx, offsets.Checkpoint{LSN: 0x100, SnapshotDone: true, Identity: ident,
		Gap: &offsets.Gap{Since: 0x300, Xmin: 80, Pending: stale}}); err != nil {
		t.Fatal(err)
	}
	// The older binary's saves: the gap cleared, later a gap of its own
	// (the columns its upsert sets; gap_repaired is not among them).
	oldSave := `INSERT INTO review_store.checkpoints AS t (slot, lsn, snapshot_done, updated_at, gap_since, gap_xmin)
		VALUES ('s', $1::pg_lsn, true, now(), $2::pg_lsn, $3::bigint)
		ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn, snapshot_done = excluded.snapshot_done, updated_at = now(),
			gap_since = excluded.gap_since, gap_xmin = excluded.gap_xmin`
	if _, err := conn.Exec(ctx, oldSave, "0/400", nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, oldSave, "0/480", "0/500", int64(300)); err != nil {
		t.Fatal(err)
	}
	got, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Gap == nil || got.Gap.Since != 0x500 || got.Gap.Xmin != 300 {
		t.Fatalf("premise: loaded gap %+v, want the older binary's {since 0/500, xmin 300}", got.Gap)
	}
	if got.Gap.Pending != (offsets.PendingRepair{}) || !got.Gap.Repaired.IsZero() || got.Gap.LookUp {
		t.Fatalf("the older binary's gap {since 0/500, xmin 300} loads with the newer binary's stale repairs %+v: "+
			"resolved takes that Pending (end 0/2F0, long passed in Kafka) for this gap's and reads nothing", *got.Gap)
	}
}
