package replication

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// review16 (f095a79: another slot bounds retention by restart_lsn).

func review16Table(ctx context.Context, t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if _, err := conn.Exec(ctx, `CREATE TABLE ret (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL DEFAULT 'o',
		aggregate_id text NOT NULL DEFAULT 'a', event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
}

func review16Exec(ctx context.Context, t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func review16Retainer(t *testing.T, dsn string) *Retainer {
	t.Helper()
	db, err := ParseDB(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRetainer(Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: "ret"}, Slot: "own"})
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

// TestReview16CrashRedecodesDeletedRows: the premise of f095a79 is that a
// consumer whose slot a crash takes back needs the rows past the position it
// goes back to. It does not: logical decoding reads the INSERTs from the
// WAL, which the slot keeps from its restart_lsn. This is the scenario of
// TestRetentionOtherSlotAfterCrash with the old bound (confirmed_flush_lsn
// before the crash) and the rows actually deleted: after the crash the
// slot's consumer receives every deleted row again, payload included.
func TestReview16CrashRedecodesDeletedRows(t *testing.T) {
	ctx, pg, conn := startServer(t)
	review16Table(ctx, t, conn)
	review16Exec(ctx, t, conn, "SELECT pg_create_logical_replication_slot('other', 'test_decoding')")
	review16Exec(ctx, t, conn, "INSERT INTO ret (event_type) SELECT 'e' FROM generate_series(1, 100)")
	review16Exec(ctx, t, conn, "SELECT pg_replication_slot_advance('other', pg_current_wal_lsn())")
	review16Exec(ctx, t, conn, "CHECKPOINT")
	review16Exec(ctx, t, conn, "INSERT INTO ret (event_type, payload) SELECT 'f', jsonb_build_object('n', g) FROM generate_series(1, 100) g")
	review16Exec(ctx, t, conn, "SELECT pg_replication_slot_advance('other', pg_current_wal_lsn())")
	var before lsn.LSN
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'other'").Scan(&before); err != nil {
		t.Fatal(err)
	}
	// What the old bound let retention delete: every row, all committed
	// below the confirmed_flush_lsn read above.
	review16Exec(ctx, t, conn, "DELETE FROM ret")
	conn.Close(ctx)
	if err := pg.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after := pgConnectTest(ctx, t, pg.DSN("postgres"))
	var back lsn.LSN
	var left int
	if err := after.QueryRow(ctx, "SELECT (SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'other'), (SELECT count(*) FROM ret)").
		Scan(&back, &left); err != nil {
		t.Fatal(err)
	}
	if back >= before || left != 0 {
		t.Fatalf("premise: confirmed %v before the crash, %v after (want it back); %d rows left (want 0)", before, back, left)
	}
	var again, withPayload int
	if err := after.QueryRow(ctx, `SELECT count(*) FILTER (WHERE data LIKE 'table public.ret: INSERT:%event_type[text]:''f''%'),
		count(*) FILTER (WHERE data LIKE 'table public.ret: INSERT:%event_type[text]:''f''%payload[jsonb]:''{"n": %')
		FROM pg_logical_slot_peek_changes('other', NULL, NULL)`).Scan(&again, &withPayload); err != nil {
		t.Fatal(err)
	}
	if again != 100 || withPayload != 100 {
		t.Fatalf("after the crash the slot's consumer decoded %d of the 100 deleted rows (%d with their payload)", again, withPayload)
	}
	t.Logf("slot back from %v to %v; its consumer decodes all 100 deleted rows again from the WAL, with their payload", before, back)
}

// TestReview16CreatingSlotHoldsEverything: a slot being created (waiting
// for a running transaction to reach a consistent point) shows a restart_lsn
// and no confirmed_flush_lsn. retention.Slot says a slot that confirmed
// nothing yet holds every row back (zero); the reading takes its
// restart_lsn instead, so rows committed before it go while it is created.
func TestReview16CreatingSlotHoldsEverything(t *testing.T) {
	ctx, pg, conn := startServer(t)
	review16Table(ctx, t, conn)
	review16Exec(ctx, t, conn, "INSERT INTO ret (event_type) SELECT 'e' FROM generate_series(1, 100)")
	r := review16Retainer(t, pg.DSN("postgres"))
	x0, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}

	open := pgConnectTest(ctx, t, pg.DSN("postgres"))
	review16Exec(ctx, t, open, "BEGIN")
	review16Exec(ctx, t, open, "SELECT txid_current()") // creation waits for it
	creator := pgConnectTest(ctx, t, pg.DSN("postgres"))
	done := make(chan error, 1)
	go func() {
		_, err := creator.Exec(ctx, "SELECT pg_create_logical_replication_slot('green', 'pgoutput')")
		done <- err
	}()
	var restart, confirmed *string
	for deadline := time.Now().Add(20 * time.Second); ; {
		err := conn.QueryRow(ctx, "SELECT restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'green'").
			Scan(&restart, &confirmed)
		if err == nil && restart != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot green never showed a restart_lsn: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("premise: the creation did not wait for the open transaction (%v)", err)
	default:
	}
	x1, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := retention.Decide([]retention.Reading{x0, x1}, retention.State{Owner: true, HoldRead: true, Acked: 1 << 62})
	review16Exec(ctx, t, open, "COMMIT")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("green in creation: restart_lsn %v, confirmed_flush_lsn %v; the reading took %+v; decision %+v", *restart, confirmed, x1.Slots, d)
	if len(x1.Slots) != 1 || x1.Slots[0].Confirmed != 0 || d.Delete {
		t.Fatalf("a slot that confirmed nothing yet (confirmed_flush_lsn NULL) was taken at %v and the decision is %+v: "+
			"want it to hold every row back (retention.Slot: zero)", x1.Slots, d)
	}
}

// TestReview16CaughtUpSlotHoldsLastRows: another slot's consumer that has
// confirmed everything (confirmed_flush_lsn at the WAL end) still holds back
// the rows committed after the last running-transactions record it decoded:
// restart_lsn only moves to such a record, and every reading taken after the
// newest one has its WAL position past it. On an idle server (nothing
// important written, so bgwriter logs no further record) that lasts until
// the next write.
func TestReview16CaughtUpSlotHoldsLastRows(t *testing.T) {
	ctx, pg, conn := startServer(t)
	review16Table(ctx, t, conn)
	review16Exec(ctx, t, conn, "SELECT pg_create_logical_replication_slot('other', 'pgoutput')")
	review16Exec(ctx, t, conn, "INSERT INTO ret (event_type) SELECT 'e' FROM generate_series(1, 100)")
	// Wait for bgwriter's running-transactions record after the rows (it
	// logs one at most every 15 s, and only after important WAL).
	var w0 lsn.LSN
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&w0); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(25 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var w lsn.LSN
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&w); err != nil {
			t.Fatal(err)
		}
		if w != w0 {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("bgwriter logged no running-transactions record in 25 s")
		}
	}
	r := review16Retainer(t, pg.DSN("postgres"))
	var readings []retention.Reading
	take := func() retention.Reading {
		x, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		readings = append(readings, x)
		return x
	}
	x := take()
	// The consumer is caught up: it confirms the WAL end, as a walsender
	// client acknowledging keepalives does.
	review16Exec(ctx, t, conn, "SELECT pg_replication_slot_advance('other', pg_current_wal_insert_lsn())")
	var restart, confirmed lsn.LSN
	slot := func() {
		if err := conn.QueryRow(ctx, "SELECT restart_lsn, confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'other'").
			Scan(&restart, &confirmed); err != nil {
			t.Fatal(err)
		}
	}
	slot()
	if confirmed < x.WAL {
		t.Fatalf("premise: the slot confirmed %v, below the reading's %v", confirmed, x.WAL)
	}
	time.Sleep(20 * time.Second) // idle: no important WAL, no further record
	review16Exec(ctx, t, conn, "SELECT pg_replication_slot_advance('other', pg_current_wal_insert_lsn())")
	slot()
	y := take()
	d, _ := retention.Decide(readings, retention.State{Owner: true, HoldRead: true, Acked: 1 << 62})
	t.Logf("reading at %v then %v; the other slot confirmed %v, restart_lsn %v; decision %+v", x.WAL, y.WAL, confirmed, restart, d)
	if y.WAL != x.WAL {
		t.Skipf("the server wrote WAL while idle (%v -> %v): not the idle case", x.WAL, y.WAL)
	}
	if !d.Delete {
		t.Fatalf("every consumer confirmed past the readings (the other slot at %v) yet nothing may be deleted: restart_lsn %v trails "+
			"the readings' %v for as long as nothing important is written", confirmed, restart, x.WAL)
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
