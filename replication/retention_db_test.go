package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/retention"
)

// TestRetentionDB runs the retention SQL against a real server: a batch
// deletes only rows older than the retention whose inserting transaction
// precedes the reading's xmin, in bounded batches, and nothing while verify
// holds the lock; check names what the role and the table lack.
func TestRetentionDB(t *testing.T) {
	ctx, pg, conn := startServer(t)
	exec := func(c *pgx.Conn, sql string) {
		t.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(conn, `CREATE TABLE ret (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL DEFAULT 'o',
		aggregate_id text NOT NULL DEFAULT 'a', event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	exec(conn, `CREATE INDEX ON ret (created_at)`)
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: "ret"}}
	r := NewRetainer(src)
	defer r.Close(ctx)
	insert := func(c *pgx.Conn, kind string, n int, age time.Duration) {
		t.Helper()
		if _, err := c.Exec(ctx, `INSERT INTO ret (event_type, created_at) SELECT $1, now() - make_interval(secs => $2) FROM generate_series(1, $3)`,
			kind, age.Seconds(), n); err != nil {
			t.Fatal(err)
		}
	}
	count := func(kind string) (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM ret WHERE event_type = $1", kind).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	del := func(below uint64, limit int) int64 {
		t.Helper()
		n, busy, err := r.Delete(ctx, retention.Decision{Below: below}, time.Hour, limit)
		if err != nil || busy {
			t.Fatalf("delete: %d, busy %v, %v", n, busy, err)
		}
		return n
	}

	insert(conn, "old", 12, 2*time.Hour)
	insert(conn, "recent", 3, time.Minute)
	// A transaction open at the reading, with old rows, committed after it.
	open, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	exec(open, "BEGIN")
	insert(open, "open", 2, 2*time.Hour)
	x, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(open, "COMMIT")
	insert(conn, "later", 4, 2*time.Hour) // after the reading, with old created_at

	// Bounded batches: 5, 5, then the 2 left of the rows before the reading.
	for _, want := range []int64{5, 5, 2, 0} {
		if got := del(x.Xmin, 5); got != want {
			t.Fatalf("batch deleted %d, want %d", got, want)
		}
	}
	for kind, want := range map[string]int{"old": 0, "recent": 3, "open": 2, "later": 4} {
		if got := count(kind); got != want {
			t.Errorf("%s rows: %d left, want %d", kind, got, want)
		}
	}
	// A later reading covers them; verify's lock holds the batch back.
	y, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if x.WAL == 0 || y.Xmin <= x.Xmin || y.WAL <= x.WAL {
		t.Fatalf("later reading %+v not after %+v", y, x)
	}
	release, err := VerifyLock(ctx, []Source{src})
	if err != nil {
		t.Fatal(err)
	}
	if n, busy, err := r.Delete(ctx, retention.Decision{Below: y.Xmin}, time.Hour, 100); n != 0 || !busy || err != nil {
		t.Fatalf("delete under verify's lock: %d, busy %v, %v", n, busy, err)
	}
	release()
	if got := del(y.Xmin, 100); got != 6 {
		t.Fatalf("deleted %d after verify, want 6 (open and later)", got)
	}
	if got := count("recent"); got != 3 {
		t.Errorf("recent rows: %d left, want 3", got)
	}

	st, err := r.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes <= 0 || time.Since(st.Oldest) < 30*time.Second || time.Since(st.Oldest) > 2*time.Minute {
		t.Errorf("stats %+v", st)
	}

	// A lost slot's hold keeps its transactions' rows, by xid, however old.
	holds := NewHolds(db, "outbox_cdc.repair_holds", "s")
	from, err := holds.NextXid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(conn, "held", 3, 3*time.Hour)
	below, err := holds.NextXid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(conn, "free", 2, 3*time.Hour)
	exec(conn, "SELECT pg_create_logical_replication_slot('ret_other', 'pgoutput')")
	z, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(z.Slots) != 1 || z.Slots[0].Name != "ret_other" || z.Slots[0].Confirmed == 0 || z.Next < z.Xmin ||
		z.Epoch.SystemID == "" || z.Epoch.Timeline != 1 || z.Epoch != y.Epoch {
		t.Fatalf("reading %+v: want the other slot, its xids and the same epoch as %+v", z, y)
	}
	exec(conn, "SELECT pg_drop_replication_slot('ret_other')")
	for _, keep := range []retention.Hold{{From: from, Below: below}, {Below: below}} {
		if n, _, err := r.Delete(ctx, retention.Decision{Below: z.Xmin, Keep: keep}, time.Hour, 100); err != nil || n != 2 {
			t.Fatalf("hold %+v: deleted %d (%v), want the 2 free rows", keep, n, err)
		}
		if got := count("held"); got != 3 {
			t.Fatalf("hold %+v: %d held rows left, want 3", keep, got)
		}
		insert(conn, "free", 2, 3*time.Hour)
		if z, err = r.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := holds.Add(ctx, retention.Hold{From: from, Below: below}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := holds.Add(ctx, retention.Hold{From: from + 1, Below: below + 5}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if h, _, err := holds.Load(ctx); err != nil || h != (retention.Hold{From: from, Below: below + 5}) {
		t.Fatalf("hold stored %+v (%v), want [%d, %d)", h, err, from, below+5)
	}
	if ok, err := holds.Clear(ctx, retention.Hold{From: from, Below: below}); ok || err != nil {
		t.Fatalf("a repair of less than the hold cleared it: %v %v", ok, err)
	}
	if ok, err := holds.Clear(ctx, retention.Hold{From: from, Below: below + 5}); !ok || err != nil {
		t.Fatalf("the repair of the whole hold did not clear it: %v %v", ok, err)
	}

	t.Run("xid comparison wraps", func(t *testing.T) {
		for _, c := range []struct {
			a, b int64
			want bool
		}{
			{10, 11, true}, {11, 11, false}, {12, 11, false},
			{4294967295, 3, true}, // a just before the wrap precedes b after it
			{3, 4294967295, false},
			{100, 100 + 1<<31 - 1, true}, {100, 100 + 1<<31, false},
		} {
			var got bool
			q := "SELECT " + fmt.Sprintf(xidPrecedes, "$1::bigint", "$2::bigint")
			if err := conn.QueryRow(ctx, q, c.a, c.b).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%d precedes %d: %v, want %v", c.a, c.b, got, c.want)
			}
		}
	})

	t.Run("check", func(t *testing.T) {
		exec(conn, "CREATE ROLE ret_reader")
		exec(conn, "GRANT SELECT ON ret TO ret_reader")
		exec(conn, "CREATE TABLE ret_noindex (id uuid PRIMARY KEY, created_at timestamptz)")
		exec(conn, "CREATE TABLE ret_nocol (id uuid PRIMARY KEY)")
		exec(conn, "CREATE TABLE ret_part (id uuid, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)")
		exec(conn, "CREATE INDEX ON ret_part (created_at)")
		problems := func(table, role string) string {
			t.Helper()
			var out []string
			s := Source{OutboxTable: OutboxTable{Schema: "public", Table: table}}
			if err := checkRetention(ctx, conn, s, role, func(p, f string) { out = append(out, p+"; "+f) }); err != nil {
				t.Fatal(err)
			}
			return strings.Join(out, "\n")
		}
		if p := problems("ret", "postgres"); p != "" {
			t.Errorf("a good table: %s", p)
		}
		exec(conn, "SET ROLE ret_reader")
		p := problems("ret", "ret_reader")
		exec(conn, "RESET ROLE")
		if !strings.Contains(p, `role "ret_reader" cannot DELETE from "public"."ret"`) || !strings.Contains(p, `GRANT DELETE ON "public"."ret" TO "ret_reader"`) {
			t.Errorf("no DELETE: %s", p)
		}
		if p := problems("ret_noindex", "postgres"); !strings.Contains(p, "no index on created_at") || !strings.Contains(p, "CREATE INDEX CONCURRENTLY") {
			t.Errorf("no index: %s", p)
		}
		if p := problems("ret_nocol", "postgres"); !strings.Contains(p, "no created_at column") {
			t.Errorf("no column: %s", p)
		}
		if p := problems("ret_part", "postgres"); p != "" { // its partitions are managed (partitions_db_test.go)
			t.Errorf("partitioned by created_at, owned: %s", p)
		}
		if p := problems("ret_missing", "postgres"); p != "" {
			t.Errorf("a missing table is checkTable's to report: %s", p)
		}
	})
}
