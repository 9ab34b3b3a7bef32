package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// These smoke tests prove the harness gives tests real servers that behave
// like production ones: logical decoding works, the broker honours acks=all
// with an idempotent producer, and data survives restarts and crashes.
//
// The restart tests must not call t.Parallel: they take a shared server down
// for a moment, which is only safe while no other test runs.

func TestHarnessPostgresLogicalDecoding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(ctx, t, newDatabase(t))

	mustExec(ctx, t, conn, `CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL)`)
	mustExec(ctx, t, conn, `CREATE PUBLICATION pub FOR TABLE outbox`)
	slot := newSlot(ctx, t, conn)
	mustExec(ctx, t, conn, `INSERT INTO outbox VALUES (1, 'hello')`)

	msgs := peekChanges(ctx, t, conn, slot)
	var ins *pglogrepl.InsertMessage
	for _, m := range msgs {
		if m, ok := m.(*pglogrepl.InsertMessage); ok {
			ins = m
		}
	}
	if ins == nil {
		t.Fatalf("no Insert message among %d decoded messages", len(msgs))
	}
	got := []string{string(ins.Tuple.Columns[0].Data), string(ins.Tuple.Columns[1].Data)}
	if want := []string{"1", "hello"}; !slices.Equal(got, want) {
		t.Fatalf("inserted tuple = %q, want %q", got, want)
	}
}

func TestHarnessKafkaProduceConsume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := newTopic(t, 3)

	want := testRecords(topic, 5, 40)
	produce(ctx, t, want)
	got := consume(ctx, t, topic, len(want))
	compareRecords(t, got, want)
}

func TestHarnessPostgresRestart(t *testing.T) {
	if pgServer.External() {
		t.Skip("PostgreSQL is external (OUTBOX_CDC_TEST_PG_DSN): cannot restart it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ensurePostgresRunning(t)
	dsn := newDatabase(t)

	conn := connect(ctx, t, dsn)
	mustExec(ctx, t, conn, `CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL)`)
	mustExec(ctx, t, conn, `CREATE PUBLICATION pub FOR TABLE outbox`)
	slot := newSlot(ctx, t, conn)
	mustExec(ctx, t, conn, `INSERT INTO outbox VALUES (1, 'before fast stop')`)
	conn.Close(ctx)

	if err := pgServer.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := pgServer.Restart(ctx); err != nil {
		t.Fatalf("restart after stop: %v", err)
	}
	conn = connect(ctx, t, dsn)
	assertRows(ctx, t, conn, 1)
	assertSlot(ctx, t, conn, slot)
	mustExec(ctx, t, conn, `INSERT INTO outbox VALUES (2, 'before crash')`)
	conn.Close(ctx)

	if err := pgServer.Crash(); err != nil {
		t.Fatalf("crash: %v", err)
	}
	if err := pgServer.Restart(ctx); err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	conn = connect(ctx, t, dsn)
	assertRows(ctx, t, conn, 2)
	assertSlot(ctx, t, conn, slot)

	// The slot still holds both inserts: nothing was consumed from it.
	var inserts int
	for _, m := range peekChanges(ctx, t, conn, slot) {
		if _, ok := m.(*pglogrepl.InsertMessage); ok {
			inserts++
		}
	}
	if inserts != 2 {
		t.Fatalf("slot has %d inserts after restarts, want 2", inserts)
	}
}

func TestHarnessKafkaKillRestart(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("Kafka is external (OUTBOX_CDC_TEST_KAFKA_BROKERS): cannot kill it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ensureKafkaRunning(t)
	topic := newTopic(t, 1)

	want := testRecords(topic, 3, 10)
	produce(ctx, t, want)
	if err := kafkaServer.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := kafkaServer.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	got := consume(ctx, t, topic, len(want))
	compareRecords(t, got, want)
}

// ensurePostgresRunning brings the shared server back after a failed
// restart test, so one failure does not cascade into every later test.
func ensurePostgresRunning(t *testing.T) {
	t.Cleanup(func() {
		if pgServer.Running() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pgServer.Restart(ctx); err != nil {
			t.Errorf("bring postgres back: %v", err)
		}
	})
}

func ensureKafkaRunning(t *testing.T) {
	t.Cleanup(func() {
		if kafkaServer.Running() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := kafkaServer.Restart(ctx); err != nil {
			t.Errorf("bring kafka back: %v", err)
		}
	})
}

func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// newSlot creates a pgoutput slot with a unique name (slots are cluster-wide)
// and drops it at the end of the test, so it does not pin WAL for the rest of
// the run.
func newSlot(ctx context.Context, t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	slot := "it_" + hex.EncodeToString(b)
	mustExec(ctx, t, conn, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	dsn := conn.Config().ConnString()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("drop slot %s: %v", slot, err)
			return
		}
		defer c.Close(ctx)
		if err := cdctest.DropSlot(ctx, c, slot); err != nil {
			t.Logf("%v", err)
		}
	})
	return slot
}

// peekChanges decodes the pgoutput messages pending in slot without
// consuming them.
func peekChanges(ctx context.Context, t *testing.T, conn *pgx.Conn, slot string) []pglogrepl.Message {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'pub')`, slot)
	if err != nil {
		t.Fatalf("peek changes: %v", err)
	}
	raw, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatalf("peek changes: %v", err)
	}
	msgs := make([]pglogrepl.Message, 0, len(raw))
	for _, data := range raw {
		m, err := pglogrepl.Parse(data)
		if err != nil {
			t.Fatalf("parse pgoutput message %q: %v", data[:1], err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

func assertRows(ctx context.Context, t *testing.T, conn *pgx.Conn, want int) {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatalf("count rows: %v", err)
	}
	if n != want {
		t.Fatalf("outbox has %d rows, want %d", n, want)
	}
}

func assertSlot(ctx context.Context, t *testing.T, conn *pgx.Conn, slot string) {
	t.Helper()
	var plugin string
	err := conn.QueryRow(ctx, `SELECT plugin FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&plugin)
	if err != nil {
		t.Fatalf("slot %s: %v", slot, err)
	}
	if plugin != "pgoutput" {
		t.Fatalf("slot %s has plugin %q, want pgoutput", slot, plugin)
	}
}

// testRecords returns perKey records for each of keys keys, interleaved, so
// per-key order (the guarantee Kafka gives for keyed records) is testable.
func testRecords(topic string, keys, perKey int) []*kgo.Record {
	var recs []*kgo.Record
	for i := range perKey {
		for k := range keys {
			recs = append(recs, &kgo.Record{
				Topic: topic,
				Key:   fmt.Appendf(nil, "key-%d", k),
				Value: fmt.Appendf(nil, "value-%d-%d", k, i),
			})
		}
	}
	return recs
}

// produce writes recs with the settings outbox-cdc relies on: an idempotent
// producer (franz-go's default) waiting for all in-sync replicas.
func produce(ctx context.Context, t *testing.T, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(kafkaServer.Brokers()...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// consume reads n records of topic from the beginning without a group.
func consume(ctx context.Context, t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(kafkaServer.Brokers()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var got []*kgo.Record
	for len(got) < n {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(got), n, err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			t.Fatalf("fetch: %v", errs[0].Err)
		}
		got = append(got, fetches.Records()...)
	}
	return got
}

// compareRecords checks that got holds exactly want, in order per key.
func compareRecords(t *testing.T, got, want []*kgo.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	byKey := func(recs []*kgo.Record) map[string][]string {
		m := map[string][]string{}
		for _, r := range recs {
			m[string(r.Key)] = append(m[string(r.Key)], string(r.Value))
		}
		return m
	}
	g, w := byKey(got), byKey(want)
	if len(g) != len(w) {
		t.Fatalf("got %d keys, want %d", len(g), len(w))
	}
	for k, wv := range w {
		if gv := g[k]; !slices.Equal(gv, wv) {
			t.Fatalf("key %s: values %q, want %q", k, gv, wv)
		}
	}
}

// TestCleanerWaitsForTheWalsender checks the environment cleaner the suites
// share: a slot a connector still streams from is not dropped (a short wait
// fails saying so), and once the connector stops the same call drops it; a
// topic is deleted, and deleting one that is not there is an error naming it.
func TestCleanerWaitsForTheWalsender(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	c := startConnector(t, testConfig(t, dsn, "public.outbox", "cleaner"))
	conn := pgConnect(t, dsn)
	exists := func() bool {
		var ok bool
		if err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'cleaner')`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := cdctest.DropSlot(short, conn, "cleaner")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "still active") || !exists() {
		t.Fatalf("DropSlot of a streaming slot: %v (slot there: %v)", err, exists())
	}

	dropConn := pgConnect(t, dsn) // DropSlot owns its connection while it polls
	dropped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dropped <- cdctest.DropSlot(ctx, dropConn, "cleaner")
	}()
	select {
	case err := <-dropped:
		t.Fatalf("DropSlot returned while the connector streamed: %v", err)
	case <-time.After(300 * time.Millisecond): // the connector still holds the slot meanwhile
	}
	c.stop(t)
	if err := <-dropped; err != nil || exists() {
		t.Fatalf("DropSlot after the connector stopped: %v (slot there: %v)", err, exists())
	}
	if err := cdctest.DropSlot(context.Background(), conn, "cleaner"); err != nil {
		t.Fatalf("DropSlot of a slot that is gone: %v", err)
	}

	adm := newAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := "it-cleaner-" + runID
	if resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	if err := cdctest.DeleteTopics(ctx, adm, topic); err != nil {
		t.Fatalf("DeleteTopics: %v", err)
	}
	missing := "it-cleaner-missing-" + runID
	if err := cdctest.DeleteTopics(ctx, adm, missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("DeleteTopics of a missing topic: %v", err)
	}
}
