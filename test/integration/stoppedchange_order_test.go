package integration

import (
	"context"
	"encoding/json"
	"fmt"
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
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "stoporder"
	dropSlotAtEnd(t, dsn, slot)
	okType, heldType := slot+"ok"+runID, slot+"held"+runID
	createTopic(t, topicFor(okType), 1)
	cfgPath := writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 100ms, reconnect_backoff_max: 1s}
outbox: {table: public.outbox}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, auto_create_topics: false, unknown_topic_timeout: 10m}
http: {listen: ''}
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate))
	conn := pgConnect(t, dsn)
	row, _ := gapWriters(ctx, t, okType)
	values := func() []string {
		var out []string
		for _, r := range readIsolated(t, false, topicFor(okType)) {
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
	waitFor(t, 30*time.Second, "a checkpoint with a floor", func() bool { // it passed a guard reading
		return queryInt(t, conn, "SELECT count(*) FROM outbox_cdc.checkpoints WHERE slot = $1 AND floor_xid IS NOT NULL", slot) == 1
	})

	// An event whose topic does not exist holds the acknowledged position
	// (kafka.unknown_topic_timeout); 2 is delivered behind it.
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
	waitFor(t, time.Minute, "2 delivered", func() bool { return seen("2") })
	waitFor(t, 30*time.Second, "a checkpoint below 2 with a bound above it", func() bool {
		var state string
		if err := conn.QueryRow(ctx, "SELECT coalesce(stream_state, '') FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&state); err != nil {
			return false
		}
		var st []struct{ Xmin uint64 }
		return json.Unmarshal([]byte(state), &st) == nil && len(st) == 1 && st[0].Xmin > xid2
	})
	p.kill()

	// While stopped: a migration takes the outbox out and puts it back.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "3") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	createTopic(t, topicFor(heldType), 1)

	p = startRetention(t, cfgPath)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "4") })
	waitFor(t, time.Minute, "4 delivered", func() bool { return seen("4") })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Fatalf("the restart did not repair the gap:\n%s", p.output())
	}
	// Each record is the next one, or a copy restarting at one already
	// delivered (then going on from there).
	got := values()
	last := 0
	for i, v := range got {
		n, err := strconv.Atoi(v)
		if err != nil || n > last+1 {
			t.Fatalf("aggregate g on %s: %v: record %d (%s) is out of the original order", topicFor(okType), got, i, v)
		}
		last = n
	}
	if last != 4 { // a copy restarting below goes on to the highest
		t.Fatalf("aggregate g on %s: %v: a copy out of the original order at the end, want it to end with 4", topicFor(okType), got)
	}
}
