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

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestStoppedChangeLongTransactionCopiesInOrder: at_least_once. A
// transaction elsewhere in the cluster stays open (L), so the guard's bound
// stays at or below L's id. Row 1 (id above L) is delivered and the
// checkpoint passes it. An event whose topic does not exist holds the
// acknowledged position; row 2 is delivered behind it, and the guard
// vouches past 2. The checkpoint is saved below 2, with the bound (<= L)
// and verified past 2. While stopped, the outbox leaves the publication and
// comes back, and 3 is written. With the repair placed at verified
// (f99436c) the restart's stream sent 2 again first, then the repair read
// every row at or above the bound; 1, below the checkpoint, not decoded by
// this run, went again after 2: 1 2 2 1 3 4 (review11). At the start, the
// repair's copies lead the replayed tail: 1 2 1 2 3 4.
func TestStoppedChangeLongTransactionCopiesInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "r11alo"
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
	walNow := func() lsn.LSN {
		var s string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, err := lsn.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	type state struct {
		Xmin     uint64
		Verified lsn.LSN
	}
	ckpt := func() (lsn.LSN, []state) {
		var pos, st string
		if err := conn.QueryRow(ctx, "SELECT lsn::text, coalesce(stream_state, '') FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&pos, &st); err != nil {
			return 0, nil
		}
		l, _ := lsn.Parse(pos)
		var out []state
		_ = json.Unmarshal([]byte(st), &out)
		return l, out
	}

	// The slot is created before L opens (creating it waits for running transactions).
	p := startRetention(t, cfgPath)
	// L: a long transaction elsewhere; the guard's bound stays at or below it.
	long := pgConnect(t, dsn)
	ltx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xidL uint64
	if err := ltx.QueryRow(ctx, "SELECT txid_current()").Scan(&xidL); err != nil {
		t.Fatal(err)
	}

	before1 := walNow()
	committed(t, conn, func(tx pgx.Tx) { row(tx, "1") })
	after1 := walNow()
	waitFor(t, time.Minute, "1 delivered", func() bool { return seen("1") })
	waitFor(t, time.Minute, "a checkpoint past 1", func() bool { l, _ := ckpt(); return l > before1 })

	committed(t, conn, func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'h', 'E', '{}')`, heldType); err != nil {
			t.Fatalf("insert held: %v", err)
		}
	})
	committed(t, conn, func(tx pgx.Tx) { row(tx, "2") })
	after2 := walNow()
	waitFor(t, time.Minute, "2 delivered", func() bool { return seen("2") })
	waitFor(t, 30*time.Second, "a checkpoint below 2 that records verified past 2", func() bool {
		l, st := ckpt()
		return l < after2 && len(st) == 1 && st[0].Verified >= after2
	})
	l, st := ckpt()
	t.Logf("checkpoint %v, state %+v, L %d, after1 %v after2 %v", l, st, xidL, after1, after2)
	p.kill()
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

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
	got := values()
	last := 0
	for i, v := range got {
		n, err := strconv.Atoi(v)
		if err != nil || n > last+1 {
			t.Fatalf("aggregate g: %v: record %d (%s) is out of the original order\n%s", got, i, v, p.output())
		}
		last = n
	}
	if last != 4 {
		t.Fatalf("aggregate g: %v: a copy out of the original order at the end", got)
	}
	t.Logf("aggregate g: %v", got)
}
