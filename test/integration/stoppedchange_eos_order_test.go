package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStoppedChangeExactlyOnceInOrder: exactly_once. A Kafka transaction
// that cannot commit (an event whose topic does not exist yet) keeps the
// committed position and the checkpoint below transaction 2, while the
// guard vouches past it and the checkpoint records its bound from after 2.
// The outbox leaves the publication and comes back while the connector is
// stopped, and 3 is written meanwhile. The restart's repair read the rows
// at or above the saved bound (3) and published them where the committed
// position was; the stream then published 2, never committed before,
// after 3 (chaos seed 8825403953442955520: "seq 543 after 395, then 396
// after 990" on billing.invoice). No transaction below the saved bound
// commits past the position the guard had vouched for when it was saved:
// the repair goes there.
func TestStoppedChangeExactlyOnceInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const slot = "stopordereos"
	e := newStoppedEnv(ctx, t, slot, fmt.Sprintf(`,
  delivery: exactly_once, transaction_interval: 5ms, positions_topic: %s`, positionsFor(slot)), true)

	p := startRetention(t, e.cfgPath)
	e.write(t, "1")
	waitFor(t, time.Minute, "1 delivered", func() bool { return e.seen(t, "1") })

	// An event whose topic does not exist holds the Kafka transaction
	// (kafka.unknown_topic_timeout); 2 is decoded behind it.
	e.hold(t)
	var xid2 uint64
	committed(t, e.conn, func(tx pgx.Tx) {
		e.row(tx, "2")
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid2); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, 30*time.Second, "a checkpoint with a bound above 2", func() bool {
		_, st := e.savedStream()
		return len(st) == 1 && st[0].Xmin > xid2
	})
	if e.seen(t, "2") {
		t.Fatal("2 was committed to Kafka behind an event whose topic does not exist: this test cannot show the order")
	}
	p.kill()

	// While stopped: a migration takes the outbox out and puts it back.
	e.flapWhileStopped(t, "3")

	p = startRetention(t, e.cfgPath)
	defer func() {
		if t.Failed() {
			t.Logf("after the change:\n%s", p.output())
		}
	}()
	e.write(t, "4")
	waitFor(t, time.Minute, "4 delivered", func() bool { return e.seen(t, "4") })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Fatalf("the restart did not repair the gap:\n%s", p.output())
	}
	if got := strings.Join(e.values(t), " "); got != "1 2 3 4" {
		t.Fatalf("aggregate g on %s (read_committed): %s, want 1 2 3 4, each once in the original order", topicFor(e.okType), got)
	}
}
