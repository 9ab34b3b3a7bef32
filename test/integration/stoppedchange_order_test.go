package integration

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStoppedChangeCopiesInOrder: at_least_once. A checkpoint can record
// a position below a delivered transaction (its acknowledgement waits
// behind an earlier event, here one whose topic does not exist yet) with
// the guard's bound from after that transaction. The outbox then leaves
// the publication and comes back while the connector is stopped. The
// restart's repair read only the rows at or above the saved bound and
// published them at its start; the stream then sent the delivered
// transaction below the bound again, after the repair's later rows of the
// same aggregate: a copy out of the original order (chaos seed
// 17343685729726893500: "seq 17 after 13"). The repair's bound must cover
// every transaction committing after its position.
func TestStoppedChangeCopiesInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newStoppedEnv(ctx, t, "stoporder", "", false)
	conn := e.conn

	p := startRetention(t, e.cfgPath)
	e.write(t, "1")
	waitFor(t, time.Minute, "1 delivered", func() bool { return e.seen(t, "1") })
	waitFor(t, 30*time.Second, "a checkpoint with a floor", func() bool { // it passed a guard reading
		return queryInt(t, conn, "SELECT count(*) FROM outbox_cdc.checkpoints WHERE slot = $1 AND floor_xid IS NOT NULL", e.slot) == 1
	})

	// An event whose topic does not exist holds the acknowledged position
	// (kafka.unknown_topic_timeout); 2 is delivered behind it.
	e.hold(t)
	var xid2 uint64
	committed(t, conn, func(tx pgx.Tx) {
		e.row(tx, "2")
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid2); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, time.Minute, "2 delivered", func() bool { return e.seen(t, "2") })
	waitFor(t, 30*time.Second, "a checkpoint below 2 with a bound above it", func() bool {
		_, st := e.savedStream()
		return len(st) == 1 && st[0].Xmin > xid2
	})
	p.kill()

	// While stopped: a migration takes the outbox out and puts it back.
	e.flapWhileStopped(t, "3")

	p = startRetention(t, e.cfgPath)
	e.write(t, "4")
	waitFor(t, time.Minute, "4 delivered", func() bool { return e.seen(t, "4") })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Fatalf("the restart did not repair the gap:\n%s", p.output())
	}
	checkCopiesInOrder(t, e.values(t), 4, p.output())
}

// checkCopiesInOrder: each record is the next one, or a copy restarting at
// one already delivered (then going on from there), and the last is n.
func checkCopiesInOrder(t *testing.T, got []string, n int, output string) {
	t.Helper()
	last := 0
	for i, v := range got {
		k, err := strconv.Atoi(v)
		if err != nil || k > last+1 {
			t.Fatalf("aggregate g: %v: record %d (%s) is out of the original order\n%s", got, i, v, output)
		}
		last = k
	}
	if last != n { // a copy restarting below goes on to the highest
		t.Fatalf("aggregate g: %v: a copy out of the original order at the end, want it to end with %d", got, n)
	}
}
