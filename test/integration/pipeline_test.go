package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// committed runs fn in a transaction and returns the wall-clock bounds of
// its COMMIT, which the record timestamps (commit time, in ms) must fall in.
func committed(t *testing.T, conn *pgx.Conn, fn func(tx pgx.Tx)) (before, after time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	fn(tx)
	before = time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return before, time.Now()
}

func insert(t *testing.T, tx pgx.Tx, table, aggType, aggID, evType string, payload any) string {
	t.Helper()
	var id string
	err := tx.QueryRow(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4) RETURNING id::text`, table),
		aggType, aggID, evType, payload).Scan(&id)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return id
}

func checkTimestamp(t *testing.T, r *kgo.Record, before, after time.Time) {
	t.Helper()
	lo, hi := before.Truncate(time.Millisecond), after
	if r.Timestamp.Before(lo) || r.Timestamp.After(hi) {
		t.Errorf("record timestamp %v outside the commit window [%v, %v]", r.Timestamp, lo, hi)
	}
}

// TestPipelineTransactionShapes streams every shape of transaction through
// one connector and checks each record's topic, key, value, headers and
// timestamp, the order per key, and that nothing else is published.
func TestPipelineTransactionShapes(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, "CREATE TABLE other (id serial PRIMARY KEY, v text)")
	cfg := testConfig(t, dsn, "public.outbox", "shapes")
	cfg.Outbox.HeaderColumns = []string{"tenant", "created_at"}
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	ctx := context.Background()
	topic := topicFor

	t.Run("single insert", func(t *testing.T) {
		var id string
		before, after := committed(t, conn, func(tx pgx.Tx) {
			err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant)
				VALUES ('single', 'order-1', 'OrderCreated', '{"total": 42, "b": [1,2]}', 'acme') RETURNING id::text`).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
		})
		recs := consumeN(t, []string{topic("single")}, 1, time.Minute, time.Second)
		if len(recs) != 1 {
			t.Fatalf("got %d records, want 1", len(recs))
		}
		r := recs[0]
		if string(r.Key) != "order-1" {
			t.Errorf("key %q, want order-1", r.Key)
		}
		var v map[string]any
		if err := json.Unmarshal(r.Value, &v); err != nil || v["total"] != float64(42) {
			t.Errorf("value %s: not the payload (%v)", r.Value, err)
		}
		want := map[string]string{"id": id, "event_type": "OrderCreated", "aggregate_type": "single", "tenant": "acme"}
		for k, w := range want {
			if got, ok := header(r, k); !ok || got != w {
				t.Errorf("header %s = %q (present %v), want %q", k, got, ok, w)
			}
		}
		if ca, ok := header(r, "created_at"); !ok || !strings.Contains(ca, "-") {
			t.Errorf("header created_at = %q, want its text form", ca)
		}
		checkTimestamp(t, r, before, after)
	})

	t.Run("many inserts in one transaction keep insert order", func(t *testing.T) {
		const n = 300
		before, after := committed(t, conn, func(tx pgx.Tx) {
			for i := 0; i < n; i++ {
				insert(t, tx, "outbox", "many", "k"+strconv.Itoa(i%7), "E", fmt.Sprintf(`{"seq": %d}`, i))
			}
		})
		recs := consumeN(t, []string{topic("many")}, n, time.Minute, time.Second)
		if len(recs) != n {
			t.Fatalf("got %d records, want %d", len(recs), n)
		}
		checkKeyOrder(t, recs)
		for _, r := range recs {
			checkTimestamp(t, r, before, after)
		}
	})

	t.Run("interleaved transactions arrive in commit order", func(t *testing.T) {
		conn2 := pgConnect(t, dsn)
		tx1, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tx2, err := conn2.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insert(t, tx1, "outbox", "interleaved", "same", "E", `{"seq": 2}`) // began first, commits second
		insert(t, tx2, "outbox", "interleaved", "same", "E", `{"seq": 1}`)
		if err := tx2.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx1.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		recs := consumeN(t, []string{topic("interleaved")}, 2, time.Minute, time.Second)
		if len(recs) != 2 {
			t.Fatalf("got %d records, want 2", len(recs))
		}
		checkKeyOrder(t, recs)
	})

	t.Run("rolled back, other tables, updates and deletes publish nothing", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insert(t, tx, "outbox", "quiet", "a", "RolledBack", `{}`)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		committed(t, conn, func(tx pgx.Tx) {
			if _, err := tx.Exec(ctx, "INSERT INTO other (v) VALUES ('x'), ('y')"); err != nil {
				t.Fatal(err)
			}
			insert(t, tx, "outbox", "quiet", "a", "Kept", `{"seq": 1}`)
		})
		exec1(t, dsn, "UPDATE outbox SET event_type = 'Changed' WHERE aggregate_type = 'quiet'")
		exec1(t, dsn, "DELETE FROM outbox WHERE aggregate_type = 'quiet'")
		committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "quiet", "a", "Marker", `{"seq": 2}`) })
		recs := consumeN(t, []string{topic("quiet")}, 2, time.Minute, 2*time.Second)
		if len(recs) != 2 {
			t.Fatalf("got %d records, want exactly 2 (Kept, Marker)", len(recs))
		}
		for i, want := range []string{"Kept", "Marker"} {
			if et, _ := header(recs[i], "event_type"); et != want {
				t.Errorf("record %d event_type %q, want %q", i, et, want)
			}
		}
	})

	t.Run("prepared transaction publishes at COMMIT PREPARED", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insert(t, tx, "outbox", "prepared", "p", "E", `{"seq": 1}`)
		if _, err := tx.Exec(ctx, "PREPARE TRANSACTION 'outbox_cdc_test'"); err != nil {
			t.Fatal(err)
		}
		// pgx's tx is finished by PREPARE; the connection is idle again.
		_ = tx.Rollback(ctx)
		none := consumeN(t, []string{topic("prepared")}, 0, time.Second, 2*time.Second)
		if len(none) != 0 {
			t.Fatalf("published %d records before COMMIT PREPARED", len(none))
		}
		exec1(t, dsn, "COMMIT PREPARED 'outbox_cdc_test'")
		recs := consumeN(t, []string{topic("prepared")}, 1, time.Minute, time.Second)
		if len(recs) != 1 {
			t.Fatalf("got %d records, want 1", len(recs))
		}
	})

	t.Run("payload shapes", func(t *testing.T) {
		big := `{"blob": "` + strings.Repeat("x", 900*1024) + `"}`
		cases := []struct {
			key     string
			payload any
			want    []byte // nil: tombstone
		}{
			{"utf8", `{"name": "Grüße, 世界 🚀"}`, []byte(`{"name": "Grüße, 世界 🚀"}`)},
			{"null", nil, nil},
			{"big", big, []byte(big)},
		}
		committed(t, conn, func(tx pgx.Tx) {
			for _, c := range cases {
				insert(t, tx, "outbox", "payloads", c.key, "E", c.payload)
			}
		})
		recs := consumeN(t, []string{topic("payloads")}, len(cases), time.Minute, time.Second)
		got := map[string]*kgo.Record{}
		for _, r := range recs {
			got[string(r.Key)] = r
		}
		for _, c := range cases {
			r := got[c.key]
			if r == nil {
				t.Errorf("no record for %s", c.key)
				continue
			}
			if c.want == nil {
				if r.Value != nil {
					t.Errorf("%s: value %q, want a tombstone (nil)", c.key, r.Value)
				}
				continue
			}
			if !jsonEqual(r.Value, c.want) {
				t.Errorf("%s: value of %d bytes differs from the payload (%d bytes)", c.key, len(r.Value), len(c.want))
			}
		}
	})

	t.Run("100k rows in one transaction", func(t *testing.T) {
		const n = 100_000
		committed(t, conn, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'bulk', 'k' || (g % 10), 'E', jsonb_build_object('seq', g) FROM generate_series(1, $1) g`, n)
			if err != nil {
				t.Fatal(err)
			}
		})
		recs := consumeN(t, []string{topic("bulk")}, n, 5*time.Minute, 2*time.Second)
		if len(recs) != n {
			t.Fatalf("got %d records, want %d", len(recs), n)
		}
		checkKeyOrder(t, recs)
	})
}

// jsonEqual compares JSON documents; jsonb normalises whitespace.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// checkKeyOrder asserts that per key, in partition order, the payload's seq
// increases, and that each key stays in one partition.
func checkKeyOrder(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	part := map[string]int32{}
	for p, rs := range byPartition(recs) {
		last := map[string]float64{}
		for _, r := range rs {
			k := string(r.Key)
			if q, ok := part[k]; ok && q != p {
				t.Fatalf("key %s in partitions %d and %d", k, q, p)
			}
			part[k] = p
			var v struct{ Seq float64 }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("value %s: %v", r.Value, err)
			}
			if prev, ok := last[k]; ok && v.Seq <= prev {
				t.Fatalf("key %s: seq %v after %v in partition %d", k, v.Seq, prev, p)
			}
			last[k] = v.Seq
		}
	}
}

// TestPipelinePayloadTypes checks json, text and bytea payload columns.
func TestPipelinePayloadTypes(t *testing.T) {
	dsn := newDatabase(t)
	cases := []struct {
		typ     string
		payload any
		want    []byte
	}{
		{"json", `{"a":  1}`, []byte(`{"a":  1}`)}, // json keeps the text as written
		{"text", "plain text ✓", []byte("plain text ✓")},
		{"bytea", []byte{0, 1, 2, 0xff, '\\', 'x'}, []byte{0, 1, 2, 0xff, '\\', 'x'}},
	}
	for _, c := range cases {
		t.Run(c.typ, func(t *testing.T) {
			table := "outbox_" + c.typ
			createOutbox(t, dsn, table, c.typ)
			startConnector(t, testConfig(t, dsn, "public."+table, "types_"+c.typ))
			conn := pgConnect(t, dsn)
			committed(t, conn, func(tx pgx.Tx) { insert(t, tx, table, "type"+c.typ, "k", "E", c.payload) })
			recs := consumeN(t, []string{topicFor("type" + c.typ)}, 1, time.Minute, time.Second)
			if len(recs) != 1 || !bytes.Equal(recs[0].Value, c.want) {
				t.Fatalf("got %d records, value %q, want %q", len(recs), recs[0].Value, c.want)
			}
		})
	}
}

// TestWatermarkHoldsWhileBrokerDown stops Kafka, writes events, and checks
// that the slot's confirmed_flush_lsn does not pass them; after the broker
// returns everything is delivered and the slot catches up.
func TestWatermarkHoldsWhileBrokerDown(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("needs a broker the test can stop")
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "watermark")
	cfg.Kafka.RequestTimeout = 5 * time.Second
	// Tiny buffers so the stall reaches the replication stream, and a short
	// wal_sender_timeout: the stream must keep the walsender alive while it
	// cannot read (no reconnect may happen).
	cfg.Kafka.MaxBufferedRecords = 3
	exec1(t, dsn, "ALTER SYSTEM SET wal_sender_timeout = '2s'")
	exec1(t, dsn, "SELECT pg_reload_conf()")
	t.Cleanup(func() {
		exec1(t, dsn, "ALTER SYSTEM RESET wal_sender_timeout")
		exec1(t, dsn, "SELECT pg_reload_conf()")
	})
	c := startConnector(t, cfg, func(pc *pipeline.Config) { pc.QueueSize = 2 })
	conn := pgConnect(t, dsn)

	// Make sure the topic exists before the broker goes away.
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "wm", "k", "E", `{"seq": 0}`) })
	consumeN(t, []string{topicFor("wm")}, 1, time.Minute, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaServer.Stop(ctx); err != nil {
		t.Fatalf("stop kafka: %v", err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = kafkaServer.Restart(context.Background())
		}
	}()
	const n = 20
	for i := 1; i <= n; i++ {
		committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "wm", "k", "E", fmt.Sprintf(`{"seq": %d}`, i)) })
	}
	// The first unacknowledged transaction ends after this position.
	afterFirst := currentLSN(t, conn)
	held := time.Now().Add(6 * time.Second) // three wal_sender_timeouts
	for time.Now().Before(held) {
		if c := slotConfirmed(t, dsn, "watermark"); c >= afterFirst {
			t.Fatalf("slot confirmed %v while events up to %v were unacknowledged", c, afterFirst)
		}
		time.Sleep(250 * time.Millisecond) // sampling interval of the 6 s observation window under test
	}

	if n := testutil.ToFloat64(c.m.Reconnects); n != 0 {
		t.Errorf("%v replication reconnects while Kafka was down: the stalled stream let the walsender time out", n)
	}
	if err := kafkaServer.Restart(ctx); err != nil {
		t.Fatalf("restart kafka: %v", err)
	}
	restarted = true
	recs := consumeN(t, []string{topicFor("wm")}, n+1, 2*time.Minute, time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(seen) != n+1 {
		t.Fatalf("%d distinct events after the broker returned, want %d", len(seen), n+1)
	}
	end := currentLSN(t, conn)
	waitFor(t, time.Minute, "slot to catch up", func() bool { return slotConfirmed(t, dsn, "watermark") >= end })
}

// TestCleanRestartPublishesNothingTwice stops the connector cleanly and
// starts it again: no event is published twice.
func TestCleanRestartPublishesNothingTwice(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "restart")
	conn := pgConnect(t, dsn)
	write := func(from, to int) {
		for i := from; i < to; i++ {
			committed(t, conn, func(tx pgx.Tx) {
				insert(t, tx, "outbox", "restart", "k"+strconv.Itoa(i%3), "E", fmt.Sprintf(`{"seq": %d}`, i))
			})
		}
	}
	c := startConnector(t, cfg)
	write(0, 200)
	consumeN(t, []string{topicFor("restart")}, 200, time.Minute, 0)
	c.stop(t)

	write(200, 300) // while stopped
	startConnector(t, cfg)
	write(300, 400)
	recs := consumeN(t, []string{topicFor("restart")}, 400, time.Minute, 2*time.Second)
	if len(recs) != 400 {
		t.Fatalf("got %d records after a clean restart, want exactly 400", len(recs))
	}
	checkKeyOrder(t, recs)
}

// TestReconnectAfterWalsenderKilled terminates the walsender while events
// are written: the connector reconnects by itself and loses nothing.
func TestReconnectAfterWalsenderKilled(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	c := startConnector(t, testConfig(t, dsn, "public.outbox", "reconnect"))
	conn := pgConnect(t, dsn)
	const n = 300
	for i := 1; i <= n; i++ {
		committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "reconnect", "k", "E", fmt.Sprintf(`{"seq": %d}`, i)) })
		if i%100 == 0 {
			exec1(t, dsn, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'reconnect' AND active_pid IS NOT NULL")
		}
	}
	recs := consumeN(t, []string{topicFor("reconnect")}, n, 2*time.Minute, time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events after walsender kills, want %d", len(seen), n)
	}
	if got := testutil.ToFloat64(c.m.Reconnects); got < 1 {
		t.Errorf("reconnects = %v, want at least 1", got)
	}
	t.Logf("%d records for %d events over %v reconnects", len(recs), n, testutil.ToFloat64(c.m.Reconnects))
	end := currentLSN(t, conn)
	waitFor(t, time.Minute, "slot to catch up", func() bool { return slotConfirmed(t, dsn, "reconnect") >= end })
}
