package replication

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGuardReview15SyncStandbyDropAboveXmaxFinishedLoses (review15, LOSS).
//
// The fix for review14 (1) tracks as "unsettled" the floor reading's
// Running list only: the snapshot's xip, which holds only ids BELOW the
// snapshot's xmax. xmax is latestCompletedXid + 1, not the next id: a
// transaction running at the reading whose id is above every completed
// one is in no list the check looks at. The change that took the table out
// is such a transaction when it is the newest one and its commit is held
// by a synchronous standby (its commit record is written, it stays in the
// proc array, nothing newer completes on a quiet outbox): a writer that
// took its id BEFORE the change (w < d), inserted after the change's
// commit record (never decoded) and committed locally counts as ended at
// every later reading (w < xmax = w+1, not running). The readings vouch
// (the long transaction keeps Running non-empty, GuardMargin passes), the
// change becomes visible, the gap is found, and Finished leaves the
// writer out: its row is lost. The bound alone keeps it in (a long
// transaction, the case the finished list is for, holds it down).
//
// The change's id IS in the floor's lock holders (it holds its xid lock
// while it waits for the standby): tracking the holders at or above Xmax
// as unsettled too would refuse this floor.
func TestGuardReview15SyncStandbyDropAboveXmaxFinishedLoses(t *testing.T) {
	review15DropAboveXmax(t, false)
}

// TestGuardReview15PreparedDropAboveXmaxFinishedLoses: the same with the
// change made by a prepared transaction, its COMMIT PREPARED held by the
// standby (the prepared transaction's id lock is in pg_locks too).
func TestGuardReview15PreparedDropAboveXmaxFinishedLoses(t *testing.T) {
	review15DropAboveXmax(t, true)
}

func review15DropAboveXmax(t *testing.T, prepared bool) {
	ctx, pg, conn := startServer(t)
	dsn := pg.DSN("postgres")
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
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
	xid := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) uint64 {
		t.Helper()
		var x uint64
		if err := q.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	exec(conn, `CREATE TABLE ob (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text, event_type text NOT NULL, payload jsonb)`)
	exec(conn, "CREATE PUBLICATION ob FOR TABLE ob")
	exec(conn, "SELECT pg_create_logical_replication_slot('rv15', 'pgoutput')")
	exec(conn, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'before')")

	exec(conn, "ALTER SYSTEM SET synchronous_commit = 'local'")
	exec(conn, "ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
	exec(conn, "SELECT pg_reload_conf()")
	time.Sleep(300 * time.Millisecond)

	// A long transaction holds the gap's bound down (the case the finished
	// list is for).
	long, err := connect().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(context.Background())
	lx := xid(long)

	src := gapSource(t, pg, "ob")
	src.OutboxTable.Columns = []string{"aggregate_type", "aggregate_id", "event_type", "payload"}
	g, err := NewGuard(ctx, src, 0)
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	defer g.Close()
	check := func() {
		t.Helper()
		if why, _ := g.Check(ctx); why != "" {
			t.Fatalf("the guard found %q while the ALTER was invisible", why)
		}
	}
	for range 3 {
		check()
		time.Sleep(100 * time.Millisecond)
	}

	// The application's writer takes its id first (an earlier statement
	// of its transaction).
	wconn := connect()
	w, err := wconn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wx := xid(w)

	// The migration's ALTER commits synchronously: its record is written,
	// it waits for the standby, still running, id above every completed.
	dropper := connect()
	exec(dropper, "SET synchronous_commit = on")
	var dropPid int
	if err := dropper.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&dropPid); err != nil {
		t.Fatal(err)
	}
	dx := make(chan uint64, 1)
	dropped := make(chan error, 1)
	go func() {
		tx, err := dropper.Begin(ctx)
		if err != nil {
			dropped <- err
			return
		}
		var x uint64
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&x); err != nil {
			dropped <- err
			return
		}
		dx <- x
		if _, err := tx.Exec(ctx, "ALTER PUBLICATION ob DROP TABLE ob"); err != nil {
			dropped <- err
			return
		}
		if !prepared {
			dropped <- tx.Commit(ctx)
			return
		}
		// The PREPARE itself does not wait (only the COMMIT PREPARED does).
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
			dropped <- err
			return
		}
		if _, err := tx.Exec(ctx, "PREPARE TRANSACTION 'rv15'"); err != nil {
			dropped <- err
			return
		}
		_, err = dropper.Exec(ctx, "COMMIT PREPARED 'rv15'")
		dropped <- err
	}()
	d := <-dx
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'",
			dropPid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ALTER did not wait for the synchronous standby")
		}
	}
	// The writer inserts after the ALTER's commit record and commits
	// locally at once.
	exec(wconn, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'lost')")
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The guard reads on, for longer than GuardMargin (and holdersEvery).
	for range 25 {
		check()
		time.Sleep(100 * time.Millisecond)
	}
	s, err := NewWatch(src).read(ctx, g.RelID(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("long %d, writer %d, ALTER %d; a reading now: xmin %d xmax %d running %v holders %v",
		lx, wx, d, s.Xmin, s.Xmax, s.Running, s.Holders)
	if d < s.Xmax || !slices.Contains(s.Holders, d) {
		t.Fatalf("premise: the ALTER (%d) at or above the reading's xmax (%d), holding its lock (%v)", d, s.Xmax, s.Holders)
	}

	if _, err := conn.Exec(ctx, "SELECT pg_cancel_backend($1)", dropPid); err != nil {
		t.Fatal(err)
	}
	if err := <-dropped; err != nil {
		t.Fatalf("the ALTER: %v", err)
	}
	var why string
	var gap bool
	for range 50 {
		if why, gap = g.Check(ctx); gap {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !gap {
		t.Fatal("the guard did not find the gap")
	}
	since, bound := g.Verified(), g.Xmin()
	fin, known := g.Finished(since)
	t.Logf("gap: %s; since %v, bound %d, finished %+v (known %v)", why, since, bound, fin, known)

	exec(conn, "ALTER PUBLICATION ob ADD TABLE ob")
	var decodedLost int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('rv15', NULL, NULL,
		'proto_version', '1', 'publication_names', 'ob') WHERE get_byte(data, 0) = 73 AND xid::text::bigint = $1`,
		int64(uint32(wx))).Scan(&decodedLost); err != nil {
		t.Fatal(err)
	}
	if decodedLost != 0 {
		t.Fatalf("premise: the writer's row is never decoded (decoded %d)", decodedLost)
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	read := func(f offsets.FinishedTxns) []string { return gapRead(ctx, t, src, bound, f) }
	if old := read(offsets.FinishedTxns{}); !slices.Contains(old, "lost") {
		t.Fatalf("premise: with the bound alone the repair reads the writer's row (read %v)", old)
	}
	var f offsets.FinishedTxns
	if known {
		f = review14Finished(fin)
	}
	if got := read(f); !slices.Contains(got, "lost") {
		t.Errorf("LOSS: the repair with the gap's finished transactions (%+v) read %v: the writer %d (id below the "+
			"ALTER's %d) committed after the ALTER's commit record, which a synchronous standby held invisible; the "+
			"ALTER's id was at or above the floor's xmax, so in no Running list the fix checks", f, got, wx, d)
	}
}
