package integration

import (
	"context"
	"encoding/json"
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
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "stopordereos"
	dropSlotAtEnd(t, dsn, slot)
	okType, heldType := slot+"ok"+runID, slot+"held"+runID
	createTopic(t, topicFor(okType), 1)
	cfgPath := writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 100ms, reconnect_backoff_max: 1s}
outbox: {table: public.outbox}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, auto_create_topics: false, unknown_topic_timeout: 10m,
  delivery: exactly_once, transaction_interval: 5ms, positions_topic: %s}
http: {listen: ''}
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, positionsFor(slot)))
	conn := pgConnect(t, dsn)
	row, _ := gapWriters(ctx, t, okType)
	values := func() []string {
		var out []string
		for _, r := range readIsolated(t, true, topicFor(okType)) {
			var v struct{ N string }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("record %s: %v", r.Value, err)
			}
			out = append(out, v.N)
		}
		return out
	}
	seen := func(n string) bool { return strings.Contains(","+strings.Join(values(), ",")+",", ","+n+",") }

	p := startRetention(t, cfgPath)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "1") })
	waitFor(t, time.Minute, "1 delivered", func() bool { return seen("1") })

	// An event whose topic does not exist holds the Kafka transaction
	// (kafka.unknown_topic_timeout); 2 is decoded behind it.
	committed(t, conn, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'h', 'E', '{}')`, heldType); err != nil {
			t.Fatalf("insert held: %v", err)
		}
	})
	var xid2 uint64
	committed(t, conn, func(tx pgx.Tx) {
		row(tx, "2")
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&xid2); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, 30*time.Second, "a checkpoint with a bound above 2", func() bool {
		var state string
		if err := conn.QueryRow(ctx, "SELECT coalesce(stream_state, '') FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&state); err != nil {
			return false
		}
		var st []struct{ Xmin uint64 }
		return json.Unmarshal([]byte(state), &st) == nil && len(st) == 1 && st[0].Xmin > xid2
	})
	if seen("2") {
		t.Fatal("2 was committed to Kafka behind an event whose topic does not exist: this test cannot show the order")
	}
	p.kill()

	// While stopped: a migration takes the outbox out and puts it back.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "3") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	createTopic(t, topicFor(heldType), 1)

	p = startRetention(t, cfgPath)
	defer func() {
		if t.Failed() {
			t.Logf("after the change:\n%s", p.output())
		}
	}()
	committed(t, conn, func(tx pgx.Tx) { row(tx, "4") })
	waitFor(t, time.Minute, "4 delivered", func() bool { return seen("4") })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Fatalf("the restart did not repair the gap:\n%s", p.output())
	}
	if got := strings.Join(values(), " "); got != "1 2 3 4" {
		t.Fatalf("aggregate g on %s (read_committed): %s, want 1 2 3 4, each once in the original order", topicFor(okType), got)
	}
}
