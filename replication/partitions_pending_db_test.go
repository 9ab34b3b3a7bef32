package replication

import (
	"testing"
	"time"
)

// TestPartitionsPendingFirst: while one partition of a root is pending
// detach (a DETACH … CONCURRENTLY cut short, a kill -9), PostgreSQL refuses
// every other DETACH … CONCURRENTLY on that root ("already pending
// detach") until it is finalized. A retention round drops in the order
// Partitions lists and stops at the first error, so Partitions lists a
// partition pending detach first: here the pending one is the newer, made
// after the other, and dropping in the listed order drops both.
func TestPartitionsPendingFirst(t *testing.T) {
	ctx, pg, conn := startServer(t)
	for _, q := range []string{
		`CREATE TABLE pend (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		"CREATE INDEX ON pend (created_at)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRetainer(Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: "pend"}})
	defer r.Close(ctx)
	t0 := time.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	for i := range 2 {
		from := t0.Add(time.Duration(i) * time.Hour)
		if ok, err := r.CreatePartition(ctx, from, from.Add(time.Hour)); !ok || err != nil {
			t.Fatalf("create %d: %v, %v", i, ok, err)
		}
	}
	cutDetachShort(ctx, t, pg.DSN("postgres"), "pend", PartitionName("pend", t0.Add(time.Hour)))
	parts, err := r.Partitions(ctx)
	if err != nil || len(parts) != 2 {
		t.Fatalf("partitions %+v, %v", parts, err)
	}
	if !parts[0].DetachPending || parts[1].DetachPending {
		t.Errorf("listed %+v: the partition pending detach is not first", parts)
	}
	x, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if done, err := r.DropPartition(ctx, p, x.Xmin); !done || err != nil {
			t.Fatalf("drop %+v in the listed order: %v, %v", p, done, err)
		}
	}
	if n := mustCount(t, conn, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pend'::regclass"); n != 0 {
		t.Errorf("%d partitions left", n)
	}
}
