package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestExactlyOnceFlapAfterCommittedRepair: exactly_once. The guard stops
// the connector on a publication gap (recorded in the checkpoint); the
// next run's repair commits in Kafka, and the connector is killed before a
// save clears the gap. While it is stopped, the outbox leaves the
// publication and comes back again, with rows written in between. The next
// start finds the old gap's repair committed (the position in Kafka is
// past it) and drops it; the change while stopped must get a repair of its
// own. A chaos run (focused on flaps and restores) lost 249 such rows:
// the start took the old, already repaired gap for the cover of the new
// change.
func TestExactlyOnceFlapAfterCommittedRepair(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "eosgapflap"
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := eosConfig(t, dsn, slot, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("eosgapflap%d", dbCounter.Add(1))
	topic := topicFor(agg)
	row, _ := gapWriters(ctx, t, agg)
	conn := pgConnect(t, dsn)

	// The gap the running guard records.
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
		waitFor(t, time.Minute, "before visible", func() bool { return copiesOf(t, topic, "before") == 1 })
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	// Its repair commits in Kafka; no save clears the gap before the kill.
	ltx := lockCheckpoint(ctx, t, dsn, slot)
	p := startProc(t, cfgPath, addr, false)
	waitFor(t, time.Minute, "the repair committed in Kafka", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return copiesOf(t, topic, "gap") == 1
	})
	p.kill()
	endLockWaiters(ctx, t, conn)
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var gap *string
	if err := conn.QueryRow(ctx, "SELECT gap_since::text FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&gap); err != nil {
		t.Fatal(err)
	}
	if gap == nil {
		t.Fatal("the checkpoint no longer records the first gap: the case is not set up")
	}

	// While stopped: out of the publication and back, rows in between.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	for i := range 3 {
		committed(t, conn, func(tx pgx.Tx) { row(tx, fmt.Sprintf("flap-%d", i)) })
	}
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	p = startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	waitFor(t, time.Minute, "after visible", func() bool { return copiesOf(t, topic, "after") == 1 })
	stopClean(t, p)
	for _, name := range []string{"before", "gap", "flap-0", "flap-1", "flap-2", "after"} {
		if n := copiesOf(t, topic, name); n != 1 {
			t.Errorf("%s: %d copies for read_committed, want 1", name, n)
		}
	}
	if t.Failed() {
		t.Logf("the start after the flap:\n%s", p.output())
	}
}
