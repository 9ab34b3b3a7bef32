package replication

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGuardFinishedNamesSubtransactions: once a reading finds the outbox
// out of the stream, the guard's Finished leaves open every transaction
// running at the reading behind the gap, a subtransaction's id too, which
// the snapshot's running list does not name (a row inserted in a savepoint
// carries it), and the repair given it reads only their rows: a row of a
// transaction that ended before the reading is the stream's. Taken for
// ended, the open subtransaction's row written in the gap was lost.
func TestGuardFinishedNamesSubtransactions(t *testing.T) {
	ctx, pg, conn := startServer(t)
	dsn := pg.DSN("postgres")
	if _, err := conn.Exec(ctx, `CREATE TABLE ob (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text, event_type text NOT NULL, payload jsonb);
		CREATE PUBLICATION ob FOR TABLE ob; CREATE TABLE other (n int)`); err != nil {
		t.Fatal(err)
	}
	insert := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, name string) uint64 {
		t.Helper()
		var xid uint64
		if err := q.QueryRow(ctx, "INSERT INTO ob (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	ended := insert(conn, "ended") // before the reading: the stream's
	// Open across the reading: an id of its own, and a savepoint's, taken
	// before the reading by a write elsewhere; the savepoint writes the
	// outbox after it.
	oc, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close(context.Background())
	open, err := oc.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.Background()) }()
	var top, sub uint64
	if err := open.QueryRow(ctx, "INSERT INTO other VALUES (1) RETURNING pg_current_xact_id()::text::bigint").Scan(&top); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Exec(ctx, "SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	if err := open.QueryRow(ctx, "INSERT INTO other VALUES (2) RETURNING xmin::text::bigint").Scan(&sub); err != nil {
		t.Fatal(err)
	}
	// A later transaction ends: the savepoint's id is below the reading's
	// xmax, and the snapshot's running list names only the transaction.
	if _, err := conn.Exec(ctx, "INSERT INTO other VALUES (3)"); err != nil {
		t.Fatal(err)
	}
	if sub == top {
		t.Fatalf("the premise: the savepoint's insert has its own id (got %d, the transaction's)", sub)
	}

	src := gapSource(t, pg, "ob")
	src.OutboxTable.Columns = []string{"aggregate_type", "aggregate_id", "event_type", "payload"}
	g, err := NewGuard(ctx, src, 0)
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	defer g.Close()
	if _, ok := g.Finished(lsn.LSN(1) << 62); ok {
		t.Fatal("finished transactions known before a reading found the outbox out of the stream")
	}
	if _, err := conn.Exec(ctx, "ALTER PUBLICATION ob DROP TABLE ob"); err != nil {
		t.Fatal(err)
	}
	if why, gap := g.Check(ctx); !gap {
		t.Fatalf("the guard did not find the gap (%q)", why)
	}
	fin, ok := g.Finished(lsn.LSN(1) << 62)
	if !ok || fin.Xmax <= sub || !slices.Contains(fin.Open, top) || !slices.Contains(fin.Open, sub) || slices.Contains(fin.Open, ended) {
		t.Fatalf("finished %+v (known %v), want below an xmax past %d, open %d and its subtransaction %d, not %d",
			fin, ok, sub, top, sub, ended)
	}

	// The gap: the savepoint writes the outbox, then the transaction; a
	// later one writes too.
	if got := insert(open, "open-sub"); got != sub {
		t.Fatalf("the savepoint's row has id %d, want %d", got, sub)
	}
	if _, err := open.Exec(ctx, "RELEASE SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	insert(open, "open")
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	insert(conn, "later")
	var joined []int64
	for _, x := range fin.Open {
		joined = append(joined, int64(x))
	}
	finished := offsets.FinishedTxns{Xmax: fin.Xmax, Open: offsets.JoinXids(joined)}
	rows, _, err := src.GapRows(ctx, ended, offsets.RepairedRows{}, finished, []RowSpec{{Mapping: gapMapping}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := eventTypes(rows)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"later", "open", "open-sub"}; !slices.Equal(got, want) {
		t.Fatalf("the repair read %v, want %v: the row of a transaction ended before the reading is the stream's", got, want)
	}
}
