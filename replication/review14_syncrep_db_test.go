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

// review14Finished is what pipeline.guards.finished saves for f.
func review14Finished(f Finished) offsets.FinishedTxns {
	open := make([]int64, len(f.Open))
	for i, x := range f.Open {
		open[i] = int64(x)
	}
	return offsets.FinishedTxns{Xmax: f.Xmax, Open: offsets.JoinXids(open)}
}

// TestGuardReview14SyncStandbyDropHeldFinishedLoses (review14, LOSS).
//
// Finished claims: every id below a reading's Xmax that is neither running
// nor holding its lock committed before the reading's After (<= Since),
// "with the table in the publication", so the stream decodes it. That
// holds only if the membership change's commit record follows the
// transaction's inserts. A commit that waits for a synchronous standby has
// inserted (and flushed) its commit record but stays in the proc array,
// invisible, for as long as the standby takes. Meanwhile a transaction
// with synchronous_commit = local (or off) inserts into the outbox after
// that commit record (the decoder filters its rows: the table is out of
// the publication at their position) and commits at once. Every guard
// reading still sees the table (the ALTER is invisible), sees the writer
// ended, and after GuardMargin vouches for a position past both (the
// documented "barring one held back by a synchronous standby" window).
// The gap record then carries a Finished that names the writer as ended:
// the repair leaves its row out, and the stream never decoded it. Before
// the change the repair read it (its id is at or above the gap's bound).
func TestGuardReview14SyncStandbyDropHeldFinishedLoses(t *testing.T) {
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
	exec(conn, `CREATE TABLE ob (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text, event_type text NOT NULL, payload jsonb)`)
	exec(conn, "CREATE PUBLICATION ob FOR TABLE ob")
	exec(conn, "CREATE TABLE other (n int)")
	exec(conn, "SELECT pg_create_logical_replication_slot('rv14', 'pgoutput')")
	insert := func(c *pgx.Conn, name string) uint64 {
		t.Helper()
		var xid uint64
		if err := c.QueryRow(ctx, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	before := insert(conn, "before")

	// A synchronous standby that does not answer (standing for one that
	// is slow); the application commits with synchronous_commit = local.
	exec(conn, "ALTER SYSTEM SET synchronous_commit = 'local'")
	exec(conn, "ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
	exec(conn, "SELECT pg_reload_conf()")
	time.Sleep(300 * time.Millisecond)

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

	// The migration's session commits synchronously: the ALTER's commit
	// record is written, then it waits for the standby.
	dropper := connect()
	exec(dropper, "SET synchronous_commit = on")
	var dropPid int
	if err := dropper.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&dropPid); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() {
		_, err := dropper.Exec(ctx, "ALTER PUBLICATION ob DROP TABLE ob")
		dropped <- err
	}()
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
	// The application's writer: after the ALTER's commit record, committed
	// locally at once.
	lost := insert(connect(), "lost")
	var afterLost lsn.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&afterLost); err != nil {
		t.Fatal(err)
	}
	// The guard reads on, every 100 ms, for longer than GuardMargin.
	for range 20 {
		check()
		time.Sleep(100 * time.Millisecond)
	}
	verified := g.Verified()
	fin, known := g.Finished(verified)
	t.Logf("writer %d (row 'lost'), its commit before %v; verified %v, bound %d, finished %+v (known %v)",
		lost, afterLost, verified, g.Xmin(), fin, known)

	// The standby answers (here: the wait is cancelled; the ALTER had
	// committed locally): the ALTER becomes visible and the guard finds
	// the gap, recording what failGap records.
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
	fin, known = g.Finished(since)
	t.Logf("gap: %s; since %v, bound %d, finished %+v (known %v)", why, since, bound, fin, known)

	// The stream never decodes the writer's row: it was written after the
	// ALTER's commit record.
	exec(conn, "ALTER PUBLICATION ob ADD TABLE ob")
	var decodedLost, decodedBefore int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE xid::text::bigint = $1), count(*) FILTER (WHERE xid::text::bigint = $2)
		FROM pg_logical_slot_peek_binary_changes('rv14', NULL, NULL, 'proto_version', '1', 'publication_names', 'ob')
		WHERE get_byte(data, 0) = 73`, int64(uint32(lost)), int64(uint32(before))).Scan(&decodedLost, &decodedBefore); err != nil {
		t.Fatal(err)
	}
	t.Logf("inserts decoded: the writer's %d, 'before' %d", decodedLost, decodedBefore)
	if decodedBefore != 1 || decodedLost != 0 {
		t.Fatalf("premise: 'before' decoded once (%d) and the writer's row never (%d)", decodedBefore, decodedLost)
	}

	read := func(f offsets.FinishedTxns) []string { return gapRead(ctx, t, src, bound, f) }
	if old := read(offsets.FinishedTxns{}); !slices.Contains(old, "lost") {
		t.Fatalf("premise: without finished transactions the repair reads the row (read %v)", old)
	}
	var f offsets.FinishedTxns
	if known {
		f = review14Finished(fin)
	}
	if got := read(f); !slices.Contains(got, "lost") {
		t.Errorf("LOSS: the repair with the gap's finished transactions (%+v) read %v: the writer %d committed before "+
			"the reading (so 'finished'), but after the ALTER's commit record, which a synchronous standby kept "+
			"invisible for more than GuardMargin; the stream never decoded its row", f, got, lost)
	}
}
