package replication

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestRetentionOtherSlotAfterCrash: the position a reading takes for
// another logical slot of the database is one the slot keeps through a
// crash. A slot's confirmed_flush_lsn reaches disk only at the next
// checkpoint unless its restart_lsn or catalog xmin moved too (PG docs,
// pg_replication_slot_advance: "in the event of a crash, the slot may
// return to an earlier position"), and its consumer then reads again from
// there: retention had deleted rows committed past it (short exactly_once
// chaos seed 8825403953442955520, a pg-crash-restart 0.5 s after the
// deletion: 47 rows past the second slot).
func TestRetentionOtherSlotAfterCrash(t *testing.T) {
	ctx, pg, conn := startServer(t)
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(conn, `CREATE TABLE ret (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL DEFAULT 'o',
		aggregate_id text NOT NULL DEFAULT 'a', event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	exec(conn, "SELECT pg_create_logical_replication_slot('other', 'pgoutput')")
	exec(conn, "INSERT INTO ret (event_type) SELECT 'e' FROM generate_series(1, 100)")
	exec(conn, "SELECT pg_replication_slot_advance('other', pg_current_wal_lsn())")
	exec(conn, "CHECKPOINT") // the slot as it is now is on disk
	// A second advance over WAL without a running-transactions record:
	// confirmed_flush_lsn moves, restart_lsn does not, nothing is saved.
	exec(conn, "INSERT INTO ret (event_type) SELECT 'f' FROM generate_series(1, 100)")
	var moved bool
	if err := conn.QueryRow(ctx, `WITH b AS (SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'other'),
		a AS (SELECT pg_replication_slot_advance('other', pg_current_wal_lsn()))
		SELECT (SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'other') = (SELECT restart_lsn FROM b) FROM a`).Scan(&moved); err != nil {
		t.Fatal(err)
	}

	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRetainer(Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: "ret"}, Slot: "own"})
	x, err := r.Read(ctx)
	r.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Slots) != 1 || x.Slots[0].Name != "other" {
		t.Fatalf("reading's other slots %+v, want the slot other", x.Slots)
	}
	var before lsn.LSN
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'other'").Scan(&before); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := pg.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after := pgConnectTest(ctx, t, pg.DSN("postgres"))
	var kept lsn.LSN
	if err := after.QueryRow(ctx, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'other'").Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept >= before {
		t.Fatalf("premise: the crash did not take the slot back (confirmed %v before, %v after; restart_lsn kept: %v)", before, kept, moved)
	}
	if x.Slots[0].Kept > kept {
		t.Fatalf("the reading took %v for the other slot, which a crash took back to %v: retention could delete rows its consumer reads again",
			x.Slots[0].Kept, kept)
	}
}

// pgConnectTest connects to dsn, closed when the test ends.
func pgConnectTest(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
