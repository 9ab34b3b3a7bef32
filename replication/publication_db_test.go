package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestMembershipUnderDropAndCreate: while another session drops the outbox
// and creates it again, over and over, every reading describes one state of
// the catalog. make test once saw the connector stop with "was renamed to
// public.<outbox>" for a table dropped and created again: the name was
// resolved with the catalog's latest snapshot (to_regclass) and the rows
// read with the statement's, so a reading could find no table under the
// name and the start table still under it.
func TestMembershipUnderDropAndCreate(t *testing.T) {
	ctx, pg, conn := startServer(t)
	dsn := pg.DSN("postgres")
	create := `CREATE TABLE churn (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text, event_type text NOT NULL, payload jsonb)`
	for _, sql := range []string{create, "CREATE PUBLICATION churn_pub FOR TABLE churn"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	db, err := ParseDB(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{DB: db, Publication: "churn_pub", OutboxTable: OutboxTable{Schema: "public", Table: "churn",
		Columns: []string{"aggregate_type", "aggregate_id", "event_type", "payload"}}}
	start, err := readMembership(ctx, conn, src, 0, true)
	if err != nil {
		t.Fatal(err)
	}

	// The guard, as the connector runs it, on the table as it is now:
	// whenever it finds the outbox gone, it says it was dropped.
	g, err := NewGuard(ctx, src, 0)
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	defer g.Close()

	// A snapshot older than the catalog, made deterministic: a repeatable
	// read transaction keeps the snapshot of its first statement, and the
	// table is dropped and created again after it. (In the connector's
	// read committed readings the statement's snapshot precedes the
	// catalog lookups by microseconds, which a loaded machine stretches.)
	old, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close(context.Background())
	for _, sql := range []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT 1"} {
		if _, err := old.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, sql := range []string{"DROP TABLE churn", create} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if s, err := readMembership(ctx, old, src, start.RelID, true); err != nil {
		t.Fatalf("reading with the old snapshot: %v", err)
	} else if why := s.LeftStream(src, start.Membership); s.RelID != start.RelID || strings.Contains(why, "renamed") {
		t.Errorf("reading with a snapshot from before the drop: %q (relid %d, start name %q), want the start table (relid %d) under its name",
			why, s.RelID, s.StartName, start.RelID)
	}
	if _, err := old.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}

	// The churner drops and creates the table until told to stop; its
	// error comes back on done (only the test goroutine fails the test).
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			done <- err
			return
		}
		defer c.Close(context.Background())
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			for _, sql := range []string{"DROP TABLE churn", create} {
				if _, err := c.Exec(ctx, sql); err != nil {
					done <- fmt.Errorf("%s: %w", sql, err)
					return
				}
			}
		}
	}()
	reader, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(context.Background())
	var bad []string
	deadline := time.Now().Add(8 * time.Second)
	n, found := 0, 0
	for ; time.Now().Before(deadline) && len(bad) < 5; n++ {
		s, err := readMembership(ctx, reader, src, start.RelID, true)
		if err == nil && s.RelID != 0 && len(s.Missing) > 0 {
			bad = append(bad, fmt.Sprintf("reading %d: table %d without columns %v", n, s.RelID, s.Missing))
		}
		why, gap := g.Check(ctx)
		if why == "" {
			continue
		}
		found++
		if !gap || !strings.Contains(why, "was dropped") {
			bad = append(bad, fmt.Sprintf("guard check %d: %q (gap %v)", n, why, gap))
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("churner: %v", err)
	}
	if len(bad) > 0 {
		t.Fatalf("%d readings saw a catalog state that never was (the table was only dropped and created again):\n%s",
			len(bad), strings.Join(bad, "\n"))
	}
	if found == 0 {
		t.Fatalf("the guard never found the outbox dropped in %d checks", n)
	}
	t.Logf("%d checks, %d found the outbox dropped, each saying so", n, found)
}
