package replication

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGapRowsReview3WriterAboveSnapshotXmax (review3, LOSS; 32e2fab).
//
// outboxLockHolders turns each pg_locks transactionid (32 bits) into a full
// id against ref = pg_snapshot_xmax(pg_current_snapshot()) and subtracts
// 2^32 from any id above ref, taking it for the previous epoch. But xmax is
// the newest ENDED id + 1, not the next id: a running transaction can have
// an id above it. Such a writer gets an id 2^32 too low, fails x.id >= from,
// and is never listed, so the wait does not wait for it.
//
// Path: R (ALTER PUBLICATION ... ADD TABLE) takes id r; an unrelated
// transaction U takes r+1 and stays open (any long transaction, or another
// writer); the writer T takes r+2 and inserts before R commits (outside
// the publication: not decoded); R commits. Now xmax = r+1 (U is the
// oldest running, nothing above r ended) and T = r+2 > xmax. The repair
// starts while T is open: the catalog part waits up to r, the lock part
// drops T, so the repair reads without T's row; T commits after; its row is
// neither decoded nor repaired.
//
// Expected: the repair waits for T (as it does when T = r+1,
// TestGapRowsReview2WriterBetweenReAddAndItsCommit) and reads its row.
// Observed at 898faad: the repair returns at once without T's row: LOSS.
func TestGapRowsReview3WriterAboveSnapshotXmax(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("review3_xmax_%d", time.Now().UnixNano()%1e9)
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	insert := func(c *pgx.Conn, name string) uint64 {
		t.Helper()
		var xid uint64
		if err := c.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	exec(conn, `CREATE TABLE `+table+reviewOutboxDDL)
	exec(conn, "CREATE TABLE "+table+"_other (x int)")
	exec(conn, "CREATE PUBLICATION "+table+" FOR TABLE "+table)
	exec(conn, "SELECT pg_create_logical_replication_slot('"+table+"', 'pgoutput')")
	defer func() {
		_, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot('"+table+"')")
	}()
	insert(conn, "before-gap")
	exec(conn, "ALTER PUBLICATION "+table+" DROP TABLE "+table)
	var bound uint64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&bound); err != nil {
		t.Fatal(err)
	}
	insert(conn, "gap-row")

	rconn := connect()
	rtx, err := rconn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback(context.Background())
	if _, err := rtx.Exec(ctx, "ALTER PUBLICATION "+table+" ADD TABLE "+table); err != nil {
		t.Fatal(err)
	}
	var r uint64
	if err := rtx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&r); err != nil {
		t.Fatal(err)
	}
	// U: an unrelated transaction with the next id, open throughout.
	uconn := connect()
	exec(uconn, "BEGIN")
	exec(uconn, "INSERT INTO "+table+"_other VALUES (1)")
	defer func() { _, _ = uconn.Exec(context.Background(), "ROLLBACK") }()
	// T: the outbox writer, above U, inserting before R commits.
	tconn := connect()
	exec(tconn, "BEGIN")
	tx := insert(tconn, "gap-row-of-T")
	if err := rtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var xmax uint64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	if tx <= xmax {
		t.Fatalf("premise: T (%d) above the snapshot's xmax (%d); R %d", tx, xmax, r)
	}
	t.Logf("gap bound %d, R %d, xmax %d, T %d (open)", bound, r, xmax, tx)

	type result struct {
		got []string
		g   Gap
	}
	done := make(chan result, 1)
	src := Source{DB: mustDB(t, pg.DSN("postgres")), Publication: table, OutboxTable: OutboxTable{Schema: "public", Table: table}}
	go func() {
		got, g := reviewReadGap(ctx, t, src, bound, offsets.RepairedRows{})
		done <- result{got, g}
	}()
	var res result
	waited := false
	select {
	case res = <-done:
	case <-time.After(2 * time.Second):
		waited = true
	}
	exec(tconn, "COMMIT")
	if waited {
		res = <-done
	}
	insert(conn, "after-readd")
	decoded := map[string]bool{}
	rows, err := conn.Query(ctx, "SELECT data FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL, "+
		"'proto_version', '1', 'publication_names', $1::text)", table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"before-gap", "gap-row", "gap-row-of-T", "after-readd"} {
			if bytes.Contains(data, []byte("\x00\x00\x00"+string(rune(len(n)))+n)) {
				decoded[n] = true
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the repair waited for T: %v; it read %v (%+v); the stream decoded %v", waited, res.got, res.g.Read, decoded)
	if !decoded["before-gap"] || decoded["gap-row"] {
		t.Fatalf("premise: the slot's read: %v", decoded)
	}
	if !decoded["gap-row-of-T"] && !slices.Contains(res.got, "gap-row-of-T") {
		t.Fatalf("LOSS: T's row (xid %d, above the snapshot's xmax %d; re-add %d) is neither decoded nor read by the repair: "+
			"outboxLockHolders took T's id for the previous epoch (id > pg_snapshot_xmax) and the wait did not wait for it (waited: %v)",
			tx, xmax, r, waited)
	}
}
