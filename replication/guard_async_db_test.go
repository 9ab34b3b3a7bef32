package replication

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestGuardVouchedAsyncCommit: Guard.Vouched claims every transaction below
// Below had inserted its commit record at or before By. A transaction
// committed with synchronous_commit = off leaves the proc array (is below
// the next snapshot's xmin) before its commit record is written, so a By
// taken from a reading's Before (pg_current_wal_lsn, the write position)
// could stay below its commit record while the next readings vouched for a
// bound above its id; the restart's repair, placed at By, then came before
// that transaction (review11: it failed so). By is the insert position read
// after the previous reading's snapshot.
func TestGuardVouchedAsyncCommit(t *testing.T) {
	ctx, pg, conn := startServer(t)
	dsn := pg.DSN("postgres")
	for _, sql := range []string{
		`CREATE TABLE ob (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
			aggregate_id text, event_type text NOT NULL, payload jsonb)`,
		"CREATE PUBLICATION ob_pub FOR TABLE ob",
		"CREATE TABLE load (n int)",
		// The WAL writer writes async commits every wal_writer_delay, or
		// when a page completes (a busy server's async writers).
		"ALTER SYSTEM SET wal_writer_delay = '10s'",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	db, err := ParseDB(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, Publication: "ob_pub", OutboxTable: OutboxTable{Schema: "public", Table: "ob",
		Columns: []string{"aggregate_type", "aggregate_id", "event_type", "payload"}}}
	g, err := NewGuard(ctx, src, 0)
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	defer g.Close()

	// A light async load elsewhere keeps the WAL writer awake.
	loadCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lc, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer lc.Close(context.Background())
		_, _ = lc.Exec(ctx, "SET synchronous_commit = off")
		for loadCtx.Err() == nil {
			_, _ = lc.Exec(loadCtx, "INSERT INTO load VALUES (1)")
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stop(); wg.Wait() }()

	w, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if _, err := w.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	hits := 0
	for i := 0; i < 200 && hits == 0; i++ {
		tx, err := w.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var xid uint64
		var pre lsn.LSN
		if err := tx.QueryRow(ctx, `INSERT INTO ob (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('a', 'g', 'E', '{}') RETURNING txid_current()`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		// The commit record is inserted after this position.
		if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&pre); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var wAfter lsn.LSN
		_ = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&wAfter)
		if i < 5 {
			e, _ := g.Vouched()
			t.Logf("i %d xid %d pre %v write after commit %v vouched %+v", i, xid, pre, wAfter, e)
		}
		for j := 0; j < 4; j++ {
			if why, _ := g.Check(ctx); why != "" {
				t.Fatal(why)
			}
			if e, ok := g.Vouched(); ok && e.Below > xid && e.By <= pre {
				var write lsn.LSN
				_ = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()").Scan(&write)
				t.Errorf("iteration %d: Vouched %+v: transaction %d is below %d, but its commit record lies past %v >= By %v "+
					"(it committed with synchronous_commit = off; write position now %v)", i, e, xid, e.Below, pre, e.By, write)
				hits++
				break
			}
		}
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM RESET wal_writer_delay"); err != nil {
		t.Log(err)
	}
}
