package replication

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGuardReview14RestoreGapOnFirstReadingKeepsOldFinished (review14,
// LOSS after a restore on the same timeline / a promotion of a standby
// that was behind).
//
// addFloor drops the floors of an older watch connection (a new connection
// may be to a server that assigns the ids past its fork again), but only
// when a good reading arrives on the new connection. When the first
// reading on the new connection is the one that finds the table out of the
// publication, Check returns the gap before addFloor runs, and
// Guard.Finished (failGap: guards.finished(verified)) answers from the old
// server's readings: ids the restored server assigns again, below the old
// Xmax and not open there, count as ended. Here a long transaction held
// the gap's bound down on the old server (the case the change is for), so
// the bound keeps the restored server's writer in; the finished list
// leaves it out. Before the change the repair read its row.
func TestGuardReview14RestoreGapOnFirstReadingKeepsOldFinished(t *testing.T) {
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
	// The backup the server is later restored from (same system
	// identifier, same timeline).
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

	// The old history: a long transaction holds the bound down while
	// others commit; the guard reads and vouches.
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
	for i := range 15 {
		for range 3 {
			if _, err := c.Exec(ctx, "INSERT INTO other VALUES (1)"); err != nil {
				t.Fatal(err)
			}
		}
		if why, _ := g.Check(ctx); why != "" {
			t.Fatalf("reading %d: %s", i, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	oldFin, _ := g.Finished(g.Verified())
	t.Logf("old server: long transaction %d, bound %d, verified %v, finished %+v", lx, g.Xmin(), g.Verified(), oldFin)

	// The server is restored (same timeline): the long transaction and
	// everything after the backup are gone; its ids are assigned again.
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
	bound := g.Xmin()
	for { // ids up to the old bound are taken by unrelated work
		var x uint64
		if err := r.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		if x+1 >= bound {
			break
		}
	}
	// On the restored server the outbox leaves the publication and a
	// writer inserts (never decoded), before the guard's next reading.
	if _, err := r.Exec(ctx, "ALTER PUBLICATION ob DROP TABLE ob"); err != nil {
		t.Fatal(err)
	}
	var wx uint64
	if err := r.QueryRow(ctx, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'reused') "+
		"RETURNING xmin::text::bigint").Scan(&wx); err != nil {
		t.Fatal(err)
	}
	var why string
	var gap bool
	for range 20 { // the first Check fails on the dead connection, the next reconnects
		if why, gap = g.Check(ctx); gap {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !gap {
		t.Fatal("the guard did not find the gap on the restored server")
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
		t.Errorf("LOSS: the gap found on the first reading of a new connection takes the finished transactions of the old "+
			"server's readings (%+v): the restored server's writer %d reuses an id below its Xmax and is left out (read %v)",
			f, wx, got)
	}
}
