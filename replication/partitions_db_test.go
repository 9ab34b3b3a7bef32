package replication

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestPartitionsDB: the partitions the connector makes carry its mark;
// another's range is left alone; a partition is dropped only once every
// row in it is delivered and verify is not running; a detach cut short is
// finalized; check asks for range partitioning on created_at and ownership.
func TestPartitionsDB(t *testing.T) {
	ctx, pg, _ := startServer(t)
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	conn := connect()
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(conn, `CREATE TABLE part (id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text, created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	exec(conn, "CREATE INDEX ON part (created_at)")
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: "part"}}
	r := NewRetainer(src)
	defer r.Close(ctx)
	if ok, err := r.Partitioned(ctx); !ok || err != nil {
		t.Fatalf("partitioned %v, %v", ok, err)
	}
	t0 := time.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	win := func(i int) (time.Time, time.Time) {
		return t0.Add(time.Duration(i) * time.Hour), t0.Add(time.Duration(i+1) * time.Hour)
	}
	create := func(i int) (bool, error) { f, to := win(i); return r.CreatePartition(ctx, f, to) }
	for i, want := range []bool{true, false} {
		if got, err := create(0); got != want || err != nil {
			t.Fatalf("create #%d: %v, %v; want %v", i, got, err, want)
		}
	}
	for i := 1; i <= 3; i++ {
		if got, err := create(i); !got || err != nil {
			t.Fatalf("create %d: %v, %v", i, got, err)
		}
	}
	f4, to4 := win(4)
	exec(conn, "CREATE TABLE part_hand PARTITION OF part FOR VALUES FROM ('"+f4.Format(time.RFC3339)+"') TO ('"+to4.Format(time.RFC3339)+"')")
	if _, err := create(4); !errors.Is(err, ErrPartitionOverlap) {
		t.Fatalf("creating over a partition made by hand: %v", err)
	}
	parts, err := r.Partitions(ctx)
	if err != nil || len(parts) != 4 {
		t.Fatalf("partitions %+v, %v; want the 4 the connector made", parts, err)
	}
	byFrom := map[time.Time]Partition{}
	for _, p := range parts {
		if !p.Attached || p.DetachPending || p.To.Sub(p.From) != time.Hour || p.Name != PartitionName("part", p.From) {
			t.Errorf("partition %+v", p)
		}
		byFrom[p.From] = p
	}
	f0, _ := win(0)
	f1, _ := win(1)
	f2, _ := win(2)
	f3, _ := win(3)

	// Rows committed after the reading keep their partition.
	exec(conn, "INSERT INTO part (event_type, created_at) VALUES ('a', $1)", f0.Add(time.Minute))
	x, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec(conn, "INSERT INTO part (event_type, created_at) VALUES ('b', $1)", f0.Add(2*time.Minute))
	if done, err := r.DropPartition(ctx, byFrom[f0], x.Xmin); done || err != nil {
		t.Fatalf("dropped a partition holding a row not delivered: %v, %v", done, err)
	}
	y, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if done, err := r.DropPartition(ctx, byFrom[f0], y.Xmin); !done || err != nil {
		t.Fatalf("drop once delivered: %v, %v", done, err)
	}
	gone := func(p Partition) bool {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", "public."+p.Name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !gone(byFrom[f0]) {
		t.Fatal("the partition is still there")
	}

	// Not while verify holds the lock.
	release, err := VerifyLock(ctx, []Source{src})
	if err != nil {
		t.Fatal(err)
	}
	if done, err := r.DropPartition(ctx, byFrom[f1], y.Xmin); done || err != nil || gone(byFrom[f1]) {
		t.Fatalf("dropped while verify runs: %v, %v", done, err)
	}
	release()
	if done, err := r.DropPartition(ctx, byFrom[f1], y.Xmin); !done || err != nil {
		t.Fatalf("drop after verify: %v, %v", done, err)
	}

	// A detached partition, not dropped yet, is found by its mark and dropped.
	exec(conn, "ALTER TABLE part DETACH PARTITION "+byFrom[f2].Name)
	// A DETACH CONCURRENTLY cut short while it waits for an older snapshot.
	cutDetachShort(ctx, t, pg.DSN("postgres"), "part", byFrom[f3].Name)
	parts, err = r.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	state := map[time.Time]Partition{}
	for _, p := range parts {
		state[p.From] = p
	}
	if p := state[f2]; p.Attached || p.DetachPending {
		t.Errorf("detached partition %+v", p)
	}
	if p := state[f3]; !p.Attached || !p.DetachPending {
		t.Errorf("partition pending detach %+v", p)
	}
	for _, f := range []time.Time{f2, f3} {
		if done, err := r.DropPartition(ctx, state[f], y.Xmin); !done || err != nil || !gone(state[f]) {
			t.Errorf("drop %+v: %v, %v", state[f], done, err)
		}
	}
	if n := mustCount(t, conn, "SELECT count(*) FROM part"); n != 0 {
		t.Errorf("%d rows left in dropped partitions", n)
	}
	if n := mustCount(t, conn, "SELECT count(*) FROM part_hand"); n != 0 || gone(Partition{Name: "part_hand"}) {
		t.Error("the partition made by hand was touched")
	}
	if st, err := r.Stats(ctx); err != nil || st.Bytes <= 0 {
		t.Errorf("stats of a partitioned table: %+v, %v", st, err)
	}

	t.Run("check", func(t *testing.T) {
		exec(conn, "CREATE TABLE part_by_id (id int, created_at timestamptz) PARTITION BY RANGE (id)")
		exec(conn, "CREATE TABLE part_noindex (created_at timestamptz) PARTITION BY RANGE (created_at)")
		exec(conn, "DO $$ BEGIN CREATE ROLE part_app; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
		problems := func(table string) string {
			var out []string
			s := Source{OutboxTable: OutboxTable{Schema: "public", Table: table}}
			if err := checkRetention(ctx, conn, s, "x", func(p, f string) { out = append(out, p+"; "+f) }); err != nil {
				t.Fatal(err)
			}
			return strings.Join(out, "\n")
		}
		if p := problems("part"); p != "" {
			t.Errorf("owner of a table partitioned by created_at: %s", p)
		}
		if p := problems("part_by_id"); !strings.Contains(p, "not partitioned by range on created_at") {
			t.Errorf("partitioned by id: %s", p)
		}
		if p := problems("part_noindex"); !strings.Contains(p, `run CREATE INDEX ON "public"."part_noindex" (created_at)`) {
			t.Errorf("partitioned, no index: %s", p)
		}
		exec(conn, "SET ROLE part_app")
		p := problems("part")
		exec(conn, "RESET ROLE")
		if !strings.Contains(p, "does not own") || !strings.Contains(p, "ALTER TABLE \"public\".\"part\" OWNER TO") {
			t.Errorf("not the owner: %s", p)
		}
	})
}

func mustCount(t *testing.T, conn *pgx.Conn, q string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cutDetachShort leaves the partition name of root pending detach: its
// DETACH … CONCURRENTLY is cancelled while it waits, in its second
// transaction, for a snapshot older than its first.
func cutDetachShort(ctx context.Context, t *testing.T, dsn, root, name string) {
	t.Helper()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	conn, reader, detacher := connect(), connect(), connect()
	exec(reader, "BEGIN ISOLATION LEVEL REPEATABLE READ")
	exec(reader, "SELECT count(*) FROM "+root)
	var pid int
	if err := detacher.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	detached := make(chan error, 1)
	go func() {
		_, err := detacher.Exec(ctx, "ALTER TABLE "+root+" DETACH PARTITION "+name+" CONCURRENTLY")
		detached <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhdetachpending)",
			"public."+name).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // poll: the detach's first transaction commits the pending state
	}
	exec(conn, "SELECT pg_cancel_backend($1)", pid)
	if err := <-detached; err == nil {
		t.Fatal("the detach was not cut short")
	}
	exec(reader, "ROLLBACK")
}
