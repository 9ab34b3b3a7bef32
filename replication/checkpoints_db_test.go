package replication

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/offsets/offsetstest"
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

// TestTableStoreRefusesRewoundServer: the server is restored from a copy
// older than a save the store made. Its WAL then ends below what the store
// saw, and a position acknowledged before the restore means nothing in the
// new history: make test once lost the rows a restored server committed,
// when a save (capped by the guard at the new WAL end) landed between the
// restore and the stream's reconnect, and the restart resumed past them.
func TestTableStoreRefusesRewoundServer(t *testing.T) {
	if testing.Short() || os.Getenv(testenv.EnvPGDSN) != "" {
		t.Skip("restores a server of its own")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	backup, err := pg.CopyData(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		c, err := db.connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 20000) g") // WAL past the copy
	srv, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store := NewTableStore(db, "outbox_cdc.checkpoints", "s")
	defer store.Close()
	id := offsets.Identity{SystemID: srv.SystemID, Timeline: srv.Timeline, Database: srv.Database, Slot: "s"}
	if err := store.Save(ctx, offsets.Checkpoint{LSN: srv.WALEnd, SnapshotDone: true, Identity: id}); err != nil {
		t.Fatalf("save before the restore: %v", err)
	}

	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	now, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now.WALEnd >= srv.WALEnd {
		t.Fatalf("restored WAL end %v not below %v: the restore shows nothing", now.WALEnd, srv.WALEnd)
	}
	// A position the new history has reached, as the guard would vouch for
	// it. (The first attempt may fail on the connection the restart closed,
	// as the checkpoint loop's would; it retries.)
	for i := 0; i < 2; i++ {
		if err = store.Save(ctx, offsets.Checkpoint{LSN: now.WALEnd, SnapshotDone: true, Identity: id}); err == nil ||
			!strings.Contains(err.Error(), "SQLSTATE 57P01") {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "restored from an older copy") {
		t.Fatalf("save on the restored server: %v, want it refused as a rewound server", err)
	}
	// A new store (the restarted connector) starts from what the server holds.
	fresh := NewTableStore(db, "outbox_cdc.checkpoints", "s")
	defer fresh.Close()
	if err := fresh.Save(ctx, offsets.Checkpoint{LSN: now.WALEnd, SnapshotDone: true, Identity: id}); err != nil {
		t.Fatalf("a new store on the restored server: %v", err)
	}
	// A store that saved nothing before the restore (the connector started
	// just before it) still refuses, from what the stream had acknowledged:
	// make test lost the 50 rows of TestRestoreUnderRunningConnector so.
	unsaved := NewTableStore(db, "outbox_cdc.checkpoints", "s")
	defer unsaved.Close()
	unsaved.SetFloor(func() lsn.LSN { return srv.WALEnd })
	if err := unsaved.Save(ctx, offsets.Checkpoint{LSN: now.WALEnd, SnapshotDone: true, Identity: id}); err == nil ||
		!strings.Contains(err.Error(), "which it had sent the connector") {
		t.Fatalf("save by a store with the acknowledged floor above the restored WAL end: %v, want it refused", err)
	}
}

// TestTableStoreRepairHold: the table store keeps a lost slot's repair
// hold as every store must (offsetstest.RepairHold), in the upsert itself.
func TestTableStoreRepairHold(t *testing.T) {
	ctx, pg, _ := startServer(t)
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	store := NewTableStore(db, "outbox_cdc.checkpoints", "s")
	defer store.Close()
	offsetstest.RepairHold(ctx, t, store)
}

// TestTableStoreKeepsRepairedRows: the gap's record of what earlier
// repairs read, and of the transactions finished before it, survives a
// save and a load (gap_repaired), and an older table without the column
// gets it.
func TestTableStoreKeepsRepairedRows(t *testing.T) {
	ctx, pg, conn := startServer(t)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA old_store; CREATE TABLE old_store.checkpoints (slot text PRIMARY KEY,
		lsn pg_lsn NOT NULL, snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := db.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store := NewTableStore(db, "old_store.checkpoints", "s")
	defer store.Close()
	gaps := []*offsets.Gap{
		{Since: 0x300, Xmin: 80, Repaired: offsets.RepairedRows{Xmin: 50, Below: 90, Xids: "91,93"},
			Pending: offsets.PendingRepair{Rows: offsets.RepairedRows{Xmin: 40, Below: 120}, End: 0x2f0, Later: 110}, LookUp: true},
		{Since: 0x300, Xmin: 80},
		{Since: 0x300, Xmin: 80, Finished: offsets.FinishedTxns{Xmax: 95, Open: "81,84,87"}},
		nil,
	}
	for _, g := range gaps {
		c := offsets.Checkpoint{LSN: 0x100, SnapshotDone: true, Gap: g,
			Identity: offsets.Identity{SystemID: id.SystemID, Timeline: id.Timeline, Database: id.Database, Slot: "s"}}
		if err := store.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
		got, err := store.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if (got.Gap == nil) != (g == nil) || (g != nil && *got.Gap != *g) {
			t.Errorf("saved gap %+v, loaded %+v", g, got.Gap)
		}
	}
}
