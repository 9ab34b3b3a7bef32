package replication

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGapRowsLeaveOutLaterWriters: a transaction that wrote none of the
// outbox before the repair began inserts with the table back in the
// publication, so the stream decodes its rows in the order they were
// written; the repair leaves it out even when it commits before the
// repair's snapshot. Read by the repair, a multi-row INSERT's rows came in
// ctid order, which is not the insertion order once the free space map
// hands back an earlier page (short chaos seed 4544573273812459008: a bulk
// transaction begun during the repair's wait went 2950, 2982, 2951). Two
// kinds: one that took its id before the repair began (running then,
// holding no lock on the outbox) and one that began after.
func TestGapRowsLeaveOutLaterWriters(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_later_%d", time.Now().UnixNano()%1e9)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	begin := func(c *pgx.Conn) pgx.Tx {
		t.Helper()
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	insert := func(tx pgx.Tx, names ...string) {
		t.Helper()
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) "+
			"SELECT 'o', 'a', n FROM unnest($1::text[]) n", names); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE `+table+` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	// The gap's writer: inserted while the table was outside the
	// publication, still open when the repair begins.
	gapTx := begin(connect())
	var xmin uint64
	if err := gapTx.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'gap') "+
		"RETURNING pg_current_xact_id()::text::bigint").Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+table+" FOR TABLE "+table); err != nil {
		t.Fatal(err)
	}
	// Running when the repair begins, with an id, and nothing of the outbox.
	earlyTx := begin(connect())
	if _, err := earlyTx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}

	done := startGapRows(ctx, gapSource(t, pg, table), xmin)
	waitForRepairWait(ctx, t, conn)
	insert(earlyTx, "early1", "early2")
	if err := earlyTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	lateTx := begin(connect())
	insert(lateTx, "late1", "late2", "late3")
	if err := lateTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := gapTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || !slices.Equal(r.got, []string{"gap"}) {
			t.Fatalf("the repair read %v (%v), want only the gap's row: the later writers' rows are the stream's", r.got, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the repair did not read the table 30 s after the gap's writer committed")
	}
}

// TestGapRowsOrderByWithinStatement: the rows one multi-row INSERT wrote in
// a gap share their cmin, and ctid is not their order when the free space
// map hands back room in an earlier page; snapshot.order_by (here a
// bigserial) is, and the repair orders by it within the statement, as the
// configuration says it does.
func TestGapRowsOrderByWithinStatement(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_orderby_%d", time.Now().UnixNano()%1e9)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE ` + table + ` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), pos bigserial, aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb)`)
	roomInPageZero(ctx, t, conn, table)
	// One statement: a 2 KB event that does not fit page 0 starts a new
	// page, then 60 small ones fill it and go on in page 0.
	var xmin uint64
	if err := conn.QueryRow(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'a', format('e%s', lpad(g::text, 2, '0')), CASE WHEN g = 0
			THEN (SELECT to_jsonb(string_agg(md5(h::text), '')) FROM generate_series(1, 60) h)
			ELSE to_jsonb(repeat('z', 100)) END
		FROM generate_series(0, 60) g ORDER BY g RETURNING pg_current_xact_id()::text::bigint`).Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 61 {
		want = append(want, fmt.Sprintf("e%02d", i))
	}
	heap := byCtid(ctx, t, conn, table)
	if slices.Equal(heap, want) {
		t.Fatalf("the heap kept the insertion order (%v): the statement's rows did not land in an earlier page", heap)
	}
	exec("CREATE PUBLICATION " + table + " FOR TABLE " + table)
	rows, _, err := gapSource(t, pg, table).GapRows(ctx, xmin, offsets.RepairedRows{}, []RowSpec{{Mapping: gapMapping, OrderBy: "pos"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := eventTypes(rows)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("gap rows in order\n%v\nwant the order of pos\n%v\n(heap order %v)", got, want, heap)
	}
}
