package replication

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGuardReview15RestoreSavedFloorKeepsOldFinished (review15, LOSS after
// a restore on the same timeline; review14 (2), second variant).
//
// The fix refuses Finished when the gap is found on another connection
// than the floors' (gapConn != conns). But addFloor, on the first good
// reading of a new connection, keeps g.saved (the floor last handed to a
// checkpoint by Floor), and saved is a whole floorPair: with the old
// server's fin and unsettled. One good reading on the restored server
// (N1) before the gap makes gapConn == conns; when N1 is not at or behind
// the gap's position (its Before moved Verified: the restored server's
// WAL is past the old verified position, or N1 read no holders), Finished
// picks the saved floor: the old server's Xmax and Open. N1 even prunes
// its unsettled ids (below N1's xmin on the restored server). A writer of
// the restored server that reuses an id below the old Xmax counts as
// ended. The bound keeps it in.
func TestGuardReview15RestoreSavedFloorKeepsOldFinished(t *testing.T) {
	ctx, pg, conn := startServer(t)
	dsn := pg.DSN("postgres")
	for _, sql := range []string{
		`CREATE TABLE ob (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text, event_type text NOT NULL, payload jsonb)`,
		"CREATE PUBLICATION ob FOR TABLE ob", "CREATE TABLE other (n int)",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	conn.Close(ctx)
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
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	c := connect()
	long, err := connect().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lx uint64
	if err := long.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&lx); err != nil {
		t.Fatal(err)
	}
	src := gapSource(t, pg, "ob")
	src.OutboxTable.Columns = []string{"aggregate_type", "aggregate_id", "event_type", "payload"}
	g, err := NewGuard(ctx, src, 0)
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	defer g.Close()
	work := func() {
		t.Helper()
		for range 10 {
			if _, err := c.Exec(ctx, "INSERT INTO other VALUES (1)"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Idle-paced readings (each reads the holders), the checkpoint takes
	// its floor (Floor, as checkpoint.go does with the verified position).
	for i := range 4 {
		work()
		time.Sleep(holdersEvery + 50*time.Millisecond)
		if why, _ := g.Check(ctx); why != "" {
			t.Fatalf("reading %d: %s", i, why)
		}
	}
	g.Floor(g.Verified())
	g.floorMu.Lock()
	saved := g.saved
	g.floorMu.Unlock()
	oldVerified := g.Verified()
	t.Logf("old server: long %d, verified %v, bound %d, saved floor at %v fin %+v unsettled %v",
		lx, oldVerified, g.Xmin(), saved.at, saved.fin, saved.unsettled)
	if saved.fin.Xmax == 0 {
		t.Fatal("premise: the saved floor read the holders")
	}

	// Restore (same timeline); the restored server's WAL goes past the
	// old verified position (it ran on for a while), ids are reused.
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	r := connect()
	for {
		var x uint64
		if err := r.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		if x+1 >= g.Xmin() {
			break
		}
	}
	for {
		var at lsn.LSN
		if err := r.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&at); err != nil {
			t.Fatal(err)
		}
		if at > oldVerified+4096 {
			break
		}
		if _, err := r.Exec(ctx, "SELECT pg_logical_emit_message(false, 'x', 'y'), pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
	}
	// The guard's watch reconnects; its first reading is good (N1).
	good := false
	for range 20 {
		if why, _ := g.Check(ctx); why != "" {
			t.Fatalf("restored server: %s", why)
		}
		if g.Verified() != oldVerified {
			good = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !good {
		t.Fatal("premise: a good reading on the restored server moved the verified position")
	}
	// Then the outbox leaves the publication and a writer inserts.
	if _, err := r.Exec(ctx, "ALTER PUBLICATION ob DROP TABLE ob"); err != nil {
		t.Fatal(err)
	}
	var wx uint64
	if err := r.QueryRow(ctx, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'reused') "+
		"RETURNING xmin::text::bigint").Scan(&wx); err != nil {
		t.Fatal(err)
	}
	why, gap := g.Check(ctx)
	if !gap {
		t.Fatalf("the guard did not find the gap (%q)", why)
	}
	since, xmin := g.Verified(), g.Xmin()
	fin, known := g.Finished(since)
	t.Logf("restored server: writer %d; gap %q since %v bound %d finished %+v (known %v)", wx, why, since, xmin, fin, known)
	if _, err := r.Exec(ctx, "ALTER PUBLICATION ob ADD TABLE ob"); err != nil {
		t.Fatal(err)
	}
	read := func(f offsets.FinishedTxns) []string { return gapRead(ctx, t, src, xmin, f) }
	if old := read(offsets.FinishedTxns{}); !slices.Contains(old, "reused") {
		t.Fatalf("premise: without finished transactions the repair reads the writer's row (read %v)", old)
	}
	var f offsets.FinishedTxns
	if known {
		f = review14Finished(fin)
	}
	if got := read(f); !slices.Contains(got, "reused") {
		t.Errorf("LOSS: after one good reading on the restored server, Finished takes the saved floor of the old "+
			"server (%+v): the restored server's writer %d reuses an id below its Xmax and is left out (read %v)",
			f, wx, got)
	}
}
