package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestReview3SplitThenAtLeastOnceThenExactlyOnce (review3, HANG /
// misleading fatal error: a restart loop until an operator tombstones the
// position).
//
// Path:
//  1. exactly_once, kafka.max_buffered_records 500: a 30,000-row
//     transaction T is committed in parts; the connector is killed with
//     some parts visible. The position record is {LSN: the warm-up's end,
//     Part: T}.
//  2. The operator runs at_least_once for a while (a config change between
//     runs): it streams from the slot, publishes T (duplicates are allowed
//     there) and confirms the slot past T. The positions topic is untouched.
//  3. exactly_once again: the position's LSN is below the slot, so
//     decideStart ignores it ("decides nothing") and the stream starts at
//     the slot, past T. But exactlyonce.Start armed the resume of T
//     (split.resume, started=true) from the position alone, so the first
//     transaction the stream sends (a new row, or a history mark) makes
//     BeginTxn fail the run: "the PostgreSQL transaction ... was not decoded
//     again: the stream is past it", exit 1, on every restart.
//
// Before the split the same switch back to exactly_once just worked (a
// position behind the slot decides nothing). Expected: the run goes on and
// publishes the new row. Observed at 898faad: the connector exits with the
// split error.
func TestReview3SplitThenAtLeastOnceThenExactlyOnce(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot, rows, max = "r3modesw", 30_000, 500
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	eos := strings.Replace(string(base), "kafka:\n", fmt.Sprintf("kafka:\n  max_buffered_records: %d\n", max), 1)
	eosPath := writeConfig(t, eos)
	aloPath := writeConfig(t, strings.Replace(eos, "delivery: exactly_once", "delivery: at_least_once", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("r3modesw%d", dbCounter.Add(1))
	topic := topicFor(agg)
	conn := pgConnect(t, dsn)

	p := startProcess(t, eosPath, addr)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'warm', 'E', '{"W": 0, "Txn": 1, "I": 0, "N": 1}')`, agg); err != nil {
		t.Fatal(err)
	}
	p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 1)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'big' || (i / 1000), 'E', jsonb_build_object('W', 1, 'Txn', i + 1, 'I', 0, 'N', $2::int)
		FROM generate_series(0, $2::int - 1) i`, agg, rows); err != nil {
		t.Fatal(err)
	}
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", float64(1+2*max))
	p.kill()
	if n := len(readIsolated(t, true, topic)); n >= 1+rows {
		t.Skipf("the whole transaction was committed before the kill (%d records): no part left to resume", n)
	}

	// at_least_once drains the slot past the large transaction.
	p = startProcess(t, aloPath, addr)
	p.waitMetric(t, 3*time.Minute, "outbox_cdc_events_published_total", float64(rows))
	stopClean(t, p)

	// exactly_once again, and a new row.
	p = startProcess(t, eosPath, addr)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'after', 'E', '{"W": 3, "Txn": 1, "I": 0, "N": 1}')`, agg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "the row written after the switch back to exactly_once, published", func() bool {
		if p.proc.Exited() {
			t.Fatalf("the exactly_once run after an at_least_once run exited: %v\n%s", p.proc.Err(), p.output())
		}
		for _, r := range readIsolated(t, true, topic) {
			if strings.Contains(string(r.Value), `"W": 3`) {
				return true
			}
		}
		return false
	})
	stopClean(t, p)
}
