package testenv

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStandby: a standby made by StartStandby replays the primary's
// writes, synchronizes a failover slot (17+), and after the primary is
// killed and the standby promoted, accepts writes with the slot usable.
func TestStandby(t *testing.T) {
	if os.Getenv(EnvPGDSN) != "" {
		t.Skip("a standby needs a managed primary; " + EnvPGDSN + " is set")
	}
	if testing.Short() {
		t.Skip("starts two servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	pc := mustConnect(ctx, t, primary.DSN("postgres"))
	if _, err := pc.Exec(ctx, "CREATE TABLE t (n int)"); err != nil {
		t.Fatal(err)
	}
	failover := primary.Major() >= 17
	if failover {
		if _, err := pc.Exec(ctx, "SELECT pg_create_logical_replication_slot('fs', 'pgoutput', false, false, true)"); err != nil {
			t.Fatal(err)
		}
	}
	standby, err := StartStandby(ctx, primary, StandbyOptions{Slot: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	if _, err := pc.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	sc := mustConnect(ctx, t, standby.DSN("postgres"))
	poll(ctx, t, "the insert replayed on the standby", func() bool {
		var n int
		return sc.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n) == nil && n == 1
	})
	if failover {
		var setting string
		if err := pc.QueryRow(ctx, "SHOW synchronized_standby_slots").Scan(&setting); err != nil || setting != "sb" {
			t.Fatalf("primary synchronized_standby_slots = %q (%v), want sb", setting, err)
		}
		// A synced slot stays temporary until the primary's slot passes the
		// position the standby reserved for it (PG docs 47.2.3), so move it.
		poll(ctx, t, "slot fs synced to the standby", func() bool {
			_, _ = pc.Exec(ctx, "SELECT pg_replication_slot_advance('fs', pg_current_wal_lsn())")
			var synced bool
			err := sc.QueryRow(ctx, "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'fs'").Scan(&synced)
			return err == nil && synced
		})
	}
	sc.Close(ctx)
	if err := primary.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	nc := mustConnect(ctx, t, standby.DSN("postgres"))
	if _, err := nc.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("write after promotion: %v", err)
	}
	if failover {
		// Advancing decodes: refused for a synced slot while in recovery.
		if _, err := nc.Exec(ctx, "SELECT pg_replication_slot_advance('fs', pg_current_wal_lsn())"); err != nil {
			t.Fatalf("use the synced slot after promotion: %v", err)
		}
	}
}

// TestCutReplication: a standby cut off by CutReplication lacks what the
// primary commits afterwards, and once promoted holds only what it had:
// what an asynchronous standby that was behind loses.
func TestCutReplication(t *testing.T) {
	if os.Getenv(EnvPGDSN) != "" {
		t.Skip("a standby needs a managed primary; " + EnvPGDSN + " is set")
	}
	if testing.Short() {
		t.Skip("starts two servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	pc := mustConnect(ctx, t, primary.DSN("postgres"))
	if _, err := pc.Exec(ctx, "CREATE TABLE t (n int)"); err != nil {
		t.Fatal(err)
	}
	standby, err := StartStandby(ctx, primary, StandbyOptions{NoSyncStandbySlots: true})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Close()
	if _, err := pc.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	sc := mustConnect(ctx, t, standby.DSN("postgres"))
	poll(ctx, t, "the insert replayed on the standby", func() bool {
		var n int
		return sc.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n) == nil && n == 1
	})
	if err := standby.CutReplication(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	// Give a walreceiver that was still running the time to bring it.
	time.Sleep(500 * time.Millisecond) // the window in which a live walreceiver would replay the insert
	var active bool
	if err := pc.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_replication").Scan(&active); err != nil || active {
		t.Fatalf("primary still streams to a walreceiver after the cut (%v)", err)
	}
	if err := primary.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var got []int
	rows, err := sc.Query(ctx, "SELECT n FROM t ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(got) != 1 || got[0] != 1 {
		t.Fatalf("promoted standby holds %v (%v), want [1]: the insert after the cut must be lost", got, err)
	}
}

func mustConnect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// poll reads a real state until cond holds, failing the test when ctx ends.
func poll(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if sleepCtx(ctx, 50*time.Millisecond) != nil { // poll interval: cond reads the server again
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
