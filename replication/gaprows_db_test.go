package replication

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGapRowsKeepInsertionOrder: the gap repair publishes a transaction's
// rows in the order they were inserted, also when VACUUM has recorded free
// space in an earlier page, so that the transaction's later rows went
// there (their ctid is lower than the earlier rows'). The chaos suite saw
// one aggregate's events swapped this way after an ops-publication-gap.
func TestGapRowsKeepInsertionOrder(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_order_%d", time.Now().UnixNano()%1e9)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE ` + table + ` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	defer func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+table) }()
	roomInPageZero(ctx, t, conn, table)

	// One transaction, one statement per event: a 2 KB event that does not
	// fit page 0 starts a new page, then 60 small events fill it and go on
	// in page 0.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint64
	if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 61 {
		payload := "to_jsonb(repeat('z', 100))"
		if i == 0 { // not compressible: it must take its 2 KB
			payload = "(SELECT to_jsonb(string_agg(md5(g::text), '')) FROM generate_series(1, 60) g)"
		}
		ev := fmt.Sprintf("e%02d", i)
		want = append(want, ev)
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('order', 'a', $1, `+payload+`)`, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The premise: the heap order is not the insertion order.
	heap := byCtid(ctx, t, conn, table)
	if slices.Equal(heap, want) {
		t.Fatalf("the heap kept the insertion order (%v): the test did not make a transaction's rows land in an earlier page", heap)
	}

	rows, g, err := gapSource(t, pg, table).GapRows(ctx, xid, offsets.RepairedRows{}, offsets.FinishedTxns{}, []RowSpec{{Mapping: gapMapping}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := eventTypes(rows)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("gap rows in order\n%v\nwant the insertion order\n%v\n(heap order %v)", got, want, heap)
	}
	if g.Transactions != 1 || !g.Read.Has(xid) {
		t.Fatalf("gap transactions %d (read %+v), want only %d", g.Transactions, g.Read, xid)
	}
}

// TestGapRowsWaitsForOpenWriters: a transaction that inserted rows while the
// outbox was outside the publication and is still open when the repair
// begins commits after it: the stream never decodes those rows, so the
// repair must read them (the chaos suite lost 3 rows of a held transaction
// that way). GapRows waits for it, saying so, and reads its rows.
func TestGapRowsWaitsForOpenWriters(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_open_%d", time.Now().UnixNano()%1e9)
	if _, err := conn.Exec(ctx, `CREATE TABLE `+table+` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+table) }()
	open, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid uint64
	if err := tx.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', 'held') "+
		"RETURNING pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	// The table comes back into the publication while the writer is open;
	// a transaction that begins after that and holds nothing of the outbox
	// (a long report, a migration of another table) is not waited for. (One
	// that writes the outbox is, when open at the repair's start: it may
	// have inserted before the change committed, with an id above the
	// change's; TestGapRowsReview2WriterBetweenReAddAndItsCommit.)
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+table+" FOR TABLE "+table); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "DROP PUBLICATION "+table) }()
	later, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close(context.Background())
	ltx, err := later.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ltx.Rollback(context.Background()) }()
	if _, err := ltx.Exec(ctx, "CREATE TABLE "+table+"_other (a int); INSERT INTO "+table+"_other VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: table}, Publication: table}
	m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		rows, _, err := src.GapRows(ctx, xid, offsets.RepairedRows{}, offsets.FinishedTxns{}, []RowSpec{{Mapping: m}}, nil)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		done <- result{n, rows.Err()}
	}()
	select {
	case r := <-done:
		t.Fatalf("the repair read the table while a writer of the gap was open: %d rows, %v", r.n, r.err)
	case <-time.After(time.Second):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.n != 1 {
			t.Fatalf("the repair after the writer's commit read %d rows (%v), want its 1 row", r.n, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the repair did not read the table 30 s after the writer committed")
	}
}

// TestGapRowsLeaveOutRepairedRows: a second repair of a gap leaves out the
// rows the first one read (at or above its bound, visible in its
// snapshot), and reads the rest: rows the first snapshot did not see, and
// rows below its bound. A rejected snapshot text is a fatal error, not SQL.
func TestGapRowsLeaveOutRepairedRows(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_repaired_%d", time.Now().UnixNano()%1e9)
	if _, err := conn.Exec(ctx, `CREATE TABLE `+table+` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), "DROP TABLE "+table) }()
	insert := func(name string) uint64 {
		t.Helper()
		var xid uint64
		if err := conn.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING pg_current_xact_id()::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	low := insert("below-first-bound")
	first := insert("read-by-first")
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: table}}
	m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}
	read := func(xmin uint64, done offsets.RepairedRows) ([]string, Gap) {
		t.Helper()
		rows, g, err := src.GapRows(ctx, xmin, done, offsets.FinishedTxns{}, []RowSpec{{Mapping: m}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			ev, err := rows.Event()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(ev.EventType.Bytes))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got, g
	}
	got, g1 := read(first, offsets.RepairedRows{})
	if !slices.Equal(got, []string{"read-by-first"}) || g1.Read.Xmin != first || g1.Read.Below <= first {
		t.Fatalf("first repair read %v (%+v), want [read-by-first], from %d to past it", got, g1.Read, first)
	}
	insert("after-first")
	got, _ = read(low, g1.Read)
	if want := []string{"below-first-bound", "after-first"}; !slices.Equal(got, want) {
		t.Fatalf("second repair read %v, want %v", got, want)
	}
	// An id listed at or above Below is left out too.
	listed := insert("listed")
	got, _ = read(low, offsets.RepairedRows{Xmin: first, Below: first + 1, Xids: fmt.Sprint(listed)})
	if want := []string{"below-first-bound", "after-first"}; !slices.Equal(got, want) {
		t.Fatalf("third read %v, want %v (the listed id left out)", got, want)
	}
	_, _, err = src.GapRows(ctx, low, offsets.RepairedRows{Xmin: first, Below: 9, Xids: "1}'; DROP TABLE x; --"}, offsets.FinishedTxns{}, nil, nil)
	if !fault.IsFatal(err) {
		t.Fatalf("a damaged snapshot text: err %v, want a fatal error", err)
	}
}
