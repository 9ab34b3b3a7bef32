package replication

// Review reproductions (adversarial review of 1cbd15e..0105cfc): the
// repaired rows' filter, NOT (xid >= Repaired.Xmin AND
// pg_visible_in_snapshot(xid, Repaired.Snapshot)), takes "visible in the
// snapshot" for "read by the earlier repair". PostgreSQL's pg_snapshot does
// not support that for two kinds of xid:
//   - a subtransaction's xid (a row inserted after a SAVEPOINT, or in a
//     PL/pgSQL EXCEPTION block) whose top-level transaction was running at
//     the snapshot: pg_snapshot's xip lists top-level ids only, so the
//     subxid looks completed (PG docs: pg_visible_in_snapshot "will not give
//     the correct answer for a subtransaction ID");
//   - any xid running when the snapshot was taken on a hot standby: a
//     recovery snapshot keeps its running xids in subxip, and
//     pg_current_snapshot() copies xip only, so the xip list is empty.
// In both cases a row the earlier repair never saw (its writer committed
// after the snapshot) is left out of the later repair. If that row was
// written while the outbox was outside the publication (the later part of a
// merged gap: Pending.Later, or a change while stopped after a committed
// repair: decide's "case old != nil"), nothing else ever publishes it: loss.
//
// Both tests assert the correct behaviour and FAIL at 0105cfc.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

func reviewReadGap(ctx context.Context, t *testing.T, src Source, xmin uint64, done offsets.RepairedRows) ([]string, Gap) {
	t.Helper()
	m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}
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

const reviewOutboxDDL = ` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
	aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`

// TestGapRowsReviewSubtransactionRowNotRepaired: a transaction T that began
// after the outbox was put back in the publication (so the first repair
// does not wait for it) runs across the first repair's snapshot S. It had
// opened a SAVEPOINT and got a subtransaction id u before S. The outbox then
// leaves the publication again (the merged gap's later part, bound Later <=
// T's id) and T inserts its rows, one at top level and one in the
// subtransaction, then commits. The restart finds the first repair in Kafka
// and reads from Later leaving out the rows S "saw": the top-level row is
// read, the subtransaction's row is not, and nothing else publishes it.
func TestGapRowsReviewSubtransactionRowNotRepaired(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("review_subxact_%d", time.Now().UnixNano()%1e9)
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(conn, `CREATE TABLE `+table+reviewOutboxDDL)
	insert := func(c interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, name string) uint64 {
		t.Helper()
		var xid uint64
		if err := c.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	first := insert(conn, "gap-a-row") // the first gap's row, read by the first repair
	// The table is back in the publication: the first repair waits only for
	// writers up to this catalog change.
	exec(conn, "CREATE PUBLICATION "+table+" FOR TABLE "+table)

	other, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var top uint64
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&top); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	// The subtransaction gets its id now (a write elsewhere, or an earlier
	// outbox row while the table was in the publication).
	exec2 := func(sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec2("CREATE TEMP TABLE review_scratch (x int)")
	exec2("INSERT INTO review_scratch VALUES (1)")
	var sub uint64
	if err := tx.QueryRow(ctx, "SELECT xmin::text::bigint FROM review_scratch").Scan(&sub); err != nil {
		t.Fatal(err)
	}
	if sub == top {
		t.Fatalf("premise: the savepoint's write carries the top-level id %d, not a subtransaction id", sub)
	}
	insert(conn, "decoded-row") // a later id completes: S's xmax passes u

	src := Source{DB: mustDB(t, pg.DSN("postgres")), Publication: table, OutboxTable: OutboxTable{Schema: "public", Table: table}}
	got, g1 := reviewReadGap(ctx, t, src, first, offsets.RepairedRows{})
	if !slices.Contains(got, "gap-a-row") {
		t.Fatalf("first repair read %v", got)
	}
	t.Logf("first repair read %+v; T = %d (running), its subtransaction u = %d", g1.Read, top, sub)

	// The outbox leaves the publication again; T writes its rows now
	// (undecodable), one at top level, one in the subtransaction.
	insert(tx, "gap-b-in-savepoint") // still in the savepoint: xmin u
	exec2("RELEASE SAVEPOINT s")
	insert(tx, "gap-b-top-level") // xmin T
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The restart: the first repair is in Kafka (resolved), the gap is
	// read from Later (<= T) leaving out what S saw.
	later := top
	got, _ = reviewReadGap(ctx, t, src, later, g1.Read)
	if want := []string{"gap-b-top-level", "gap-b-in-savepoint"}; !slices.Equal(got, want) {
		t.Fatalf("LOSS: the second repair read %v, want %v: the subtransaction's row, which the first repair never saw, "+
			"is taken for one it read (pg_visible_in_snapshot on a subtransaction id)", got, want)
	}
}

// TestGapRowsReviewStandbySnapshotHasNoXip: the stream reads a hot standby
// (postgres.primary_dsn set), so the repair's snapshot is the standby's. A
// transaction T running on the primary across the first repair's snapshot
// is not in that snapshot's xip list (recovery snapshots keep running xids
// in subxip; pg_current_snapshot copies xip), so the second repair leaves
// out T's row written in the gap's later part: loss, with no savepoint.
func TestGapRowsReviewStandbySnapshotHasNoXip(t *testing.T) {
	if testing.Short() || testenvExternal() {
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
	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	table := fmt.Sprintf("review_standby_%d", time.Now().UnixNano()%1e9)
	if _, err := conn.Exec(ctx, `CREATE TABLE `+table+reviewOutboxDDL); err != nil {
		t.Fatal(err)
	}
	insert := func(c interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, name string) uint64 {
		t.Helper()
		var xid uint64
		if err := c.QueryRow(ctx, "INSERT INTO "+table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
			"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	first := insert(conn, "gap-a-row")
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+table+" FOR TABLE "+table); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	var top uint64
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&top); err != nil {
		t.Fatal(err)
	}
	// T's id reaches the standby with its first WAL record.
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE review_scratch (x int)"); err != nil {
		t.Fatal(err)
	}
	insert(conn, "decoded-row") // a later id completes: the snapshot's xmax passes T

	src := Source{DB: mustDB(t, standby.DSN("postgres")), Primary: mustDB(t, primary.DSN("postgres")), Publication: table,
		OutboxTable: OutboxTable{Schema: "public", Table: table}}
	got, g1 := reviewReadGap(ctx, t, src, first, offsets.RepairedRows{})
	if !slices.Contains(got, "gap-a-row") {
		t.Fatalf("first repair read %v", got)
	}
	t.Logf("first repair read (standby) %+v; T = %d running on the primary", g1.Read, top)

	insert(tx, "gap-b-row") // the outbox is outside the publication again
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ = reviewReadGap(ctx, t, src, top, g1.Read)
	if want := []string{"gap-b-row"}; !slices.Equal(got, want) {
		t.Fatalf("LOSS: the second repair read %v, want %v: T's row is taken for one the first repair read (%+v)",
			got, want, g1.Read)
	}
}

func mustDB(t *testing.T, dsn string) *DB {
	t.Helper()
	db, err := ParseDB(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func testenvExternal() bool { return os.Getenv(testenv.EnvPGDSN) != "" }
