package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitRepairWaits waits until p's gap repair polls the running
// transactions (replication/gapwait.go): it waits for an open writer.
// It fails the test if p exits first.
func waitRepairWaits(ctx context.Context, t *testing.T, probe *pgx.Conn, p *process, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "the gap repair waiting for an open transaction", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited before its gap repair waited: %v\n%s", p.proc.Err(), p.output())
		}
		var n int
		err := probe.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '/* outbox-cdc: the gap repair waits */%' "+
			"AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n > 0
	})
}

// endLockWaiters ends the sessions of conn's database that wait for a lock:
// a save a row lock holds inside the server would still commit once the
// lock goes; ended, it is a save never sent.
func endLockWaiters(ctx context.Context, t *testing.T, conn *pgx.Conn) {
	t.Helper()
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
}

// copiesOf counts the records with payload {"n": name} that read_committed
// sees on topic.
func copiesOf(t *testing.T, topic, name string) int {
	t.Helper()
	n := 0
	for _, r := range readIsolated(t, true, topic) {
		if string(r.Value) == fmt.Sprintf(`{"n": %q}`, name) {
			n++
		}
	}
	return n
}

// lockCheckpoint holds slot's checkpoint row locked (a slow or unanswering
// store) until the returned transaction ends.
func lockCheckpoint(ctx context.Context, t *testing.T, dsn, slot string) pgx.Tx {
	t.Helper()
	tx, err := pgConnect(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM outbox_cdc.checkpoints WHERE slot = $1 FOR UPDATE", slot); err != nil {
		t.Fatal(err)
	}
	return tx
}
