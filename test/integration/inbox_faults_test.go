package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// These tests run the inbox consumer through the faults an application meets
// on its worst day (issue 25): a database restart, a Run cut short, a panic,
// a poison record, a hung handler.

// ibProduceTo produces one ibEvent per id to partition of topic.
func ibProduceTo(ctx context.Context, t *testing.T, topic string, partition int32, ids ...string) {
	t.Helper()
	var recs []*kgo.Record
	for i, id := range ids {
		r := ibEvent(topic, "k", id, i)
		r.Partition = partition
		recs = append(recs, r)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func ibIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// okCount is how many of ids the handler completed.
func (c *ibCalls) okCount(ids []string) int {
	ok, _ := c.snapshot()
	n := 0
	for _, id := range ok {
		if slices.Contains(ids, id) {
			n++
		}
	}
	return n
}

// TestInboxPostgresRestart: an immediate restart of PostgreSQL under a
// running consumer loses its connections; the consumer must get new ones
// and go on (it used to retry "begin: conn closed" for ever on a *pgx.Conn).
func TestInboxPostgresRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn, _ := ibSetup(ctx, t)
	topic := newTopic(t, 2)
	calls := newIBCalls()
	ic := ibStart(t, dsn, topic, "inbox-"+topic, calls.handler(nil))
	before := ibIDs("before", 10)
	ibProduceTo(ctx, t, topic, 0, before...)
	ibWait(t, ctx, "the first 10 events", func() bool { return calls.okCount(before) == 10 })

	if err := pgServer.ImmediateStop(); err != nil {
		t.Fatal(err)
	}
	if err := pgServer.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	after := ibIDs("after", 20)
	ibProduceTo(ctx, t, topic, 0, after[:10]...)
	ibProduceTo(ctx, t, topic, 1, after[10:]...)
	waitCtx, waitCancel := context.WithTimeout(ctx, 90*time.Second)
	defer waitCancel()
	ibWait(t, waitCtx, "the 20 events produced after the restart", func() bool { return calls.okCount(after) == 20 })
	ic.stop(t)

	conn := olConn(ctx, t, dsn)
	if got := ibHandledRows(ctx, t, conn); len(got) != 30 {
		t.Errorf("handled table has %d rows, want 30 (each event once): %v", len(got), got)
	}
	ibCommittedAtEnd(ctx, t, "inbox-"+topic, topic)
}

// TestInboxRunReturnedMidBatch: a Run whose context ends in the middle of a
// batch leaves the rest of the batch to the next Run on the same consumer:
// nothing is skipped.
func TestInboxRunReturnedMidBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	ids := ibIDs("evt", 8)
	ibProduceTo(ctx, t, topic, 0, ids...)

	calls := newIBCalls()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	inner := calls.handler(nil)
	h := func(hctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if inbox.EventID(rec) == "evt-2" {
			stopRun() // Run's context ends while the batch still holds evt-3 … evt-7
		}
		return inner(hctx, tx, rec)
	}
	ic := ibNew(t, dsn, topic, "inbox-"+topic, h)
	defer ic.c.Close()
	if err := ic.c.Run(runCtx); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	if n := calls.okCount(ids); n == len(ids) {
		t.Fatalf("the first Run handled all %d events: the test did not cut a batch short", n)
	}
	second, stopSecond := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ic.c.Run(second) }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	ibWait(t, waitCtx, "all 8 events after Run was called again", func() bool { return calls.okCount(ids) == len(ids) })
	waitCancel()
	stopSecond()
	if err := <-done; err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if got := ibHandledRows(ctx, t, conn); !slices.Equal(got, ids) {
		t.Errorf("handled %v, want %v", got, ids)
	}
	ibCommittedAtEnd(ctx, t, "inbox-"+topic, topic)
}

// TestInboxHandlerPanic: a panicking handler is a failed attempt (rolled
// back, counted, retried); the member keeps consuming and a member that
// joins gets its share (the rebalance is not left blocked).
func TestInboxHandlerPanic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 2)
	group := "inbox-" + topic
	calls := newIBCalls()
	inner := calls.handler(nil)
	var panics atomic.Int32
	h := func(hctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if _, err := tx.Exec(hctx, `INSERT INTO handled (event_id) VALUES ('before-panic')`); err != nil {
			return err
		}
		if inbox.EventID(rec) == "p0-1" && panics.Add(1) <= 2 {
			panic("injected panic")
		}
		return inner(hctx, tx, rec)
	}
	ibProduceTo(ctx, t, topic, 0, "p0-0", "p0-1", "p0-2")
	first := ibStart(t, dsn, topic, group, h)
	ibWait(t, ctx, "p0-0 … p0-2", func() bool { return calls.okCount([]string{"p0-0", "p0-1", "p0-2"}) == 3 })
	if f := first.metric(t, inbox.MetricFailed); f != 2 {
		t.Errorf("failed = %v, want 2 (one per panic)", f)
	}

	second := ibStart(t, dsn, topic, group, h) // the group must rebalance
	ibProduceTo(ctx, t, topic, 1, "p1-0")
	ibProduceTo(ctx, t, topic, 0, "p0-3")
	waitCtx, waitCancel := context.WithTimeout(ctx, 60*time.Second)
	ibWait(t, waitCtx, "p0-3 and p1-0 after the second member joined", func() bool {
		return calls.okCount([]string{"p0-3", "p1-0"}) == 2
	})
	waitCancel()
	first.stop(t)
	second.stop(t)
	var extra int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM handled WHERE event_id = 'before-panic'`).Scan(&extra); err != nil {
		t.Fatal(err)
	}
	if extra != 5 {
		t.Errorf("%d rows written before a panic survived, want 5 (the panicking attempts rolled back)", extra)
	}
	if ok, _ := calls.snapshot(); len(ok) != 5 {
		t.Errorf("handled %v, want 5 events once each", ok)
	}
	ibCommittedAtEnd(ctx, t, group, topic)
}

// TestInboxPoisonPartitionOthersFlow: a record that always fails holds up
// its own partition only; the member's other partitions go on.
func TestInboxPoisonPartitionOthersFlow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, _ := ibSetup(ctx, t)
	topic := newTopic(t, 3)
	calls := newIBCalls()
	ibProduceTo(ctx, t, topic, 0, "poison", "p0-after")
	ibStart(t, dsn, topic, "inbox-"+topic, calls.handler(func(id string, _ int) bool { return id == "poison" }))
	ibWait(t, ctx, "poison retried", func() bool { _, a := calls.snapshot(); return a["poison"] >= 2 })

	p1, p2 := ibIDs("p1", 40), ibIDs("p2", 60)
	ibProduceTo(ctx, t, topic, 1, p1...)
	ibProduceTo(ctx, t, topic, 2, p2...)
	waitCtx, waitCancel := context.WithTimeout(ctx, 60*time.Second)
	defer waitCancel()
	ibWait(t, waitCtx, "partitions 1 and 2 while partition 0 is stuck", func() bool {
		return calls.okCount(p1) == len(p1) && calls.okCount(p2) == len(p2)
	})
	if n := calls.okCount([]string{"poison", "p0-after"}); n != 0 {
		t.Errorf("%d of partition 0's records handled past the poison record", n)
	}
}

// TestInboxHungHandler: a handler that blocks (on its context) is cut off by
// the handler deadline, which defaults to half the group's rebalance
// timeout; the attempt fails and is retried instead of holding the member,
// and the group, for ever.
func TestInboxHungHandler(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, _ := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	calls := newIBCalls()
	inner := calls.handler(nil)
	var hung atomic.Int32
	h := func(hctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if inbox.EventID(rec) == "evt-0" && hung.Add(1) == 1 {
			<-hctx.Done() // hangs until its deadline
			return hctx.Err()
		}
		return inner(hctx, tx, rec)
	}
	ibProduceTo(ctx, t, topic, 0, "evt-0", "evt-1")
	ic := ibStart(t, dsn, topic, "inbox-"+topic, h, func(c *inbox.Config) {
		c.KafkaOptions = append(c.KafkaOptions, kgo.RebalanceTimeout(6*time.Second))
	})
	waitCtx, waitCancel := context.WithTimeout(ctx, 45*time.Second)
	defer waitCancel()
	ibWait(t, waitCtx, "both events after the hung attempt", func() bool { return calls.okCount([]string{"evt-0", "evt-1"}) == 2 })
	if f := ic.metric(t, inbox.MetricFailed); f != 1 {
		t.Errorf("failed = %v, want 1 (the hung attempt)", f)
	}
}

// ibDeadRow is a row of the dead-letter table.
type ibDeadRow struct {
	EventID  string
	Attempts int
	Error    string
}

func ibDeadRows(ctx context.Context, t *testing.T, conn *pgx.Conn) []ibDeadRow {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT event_id, attempts, error_message FROM inbox_dead ORDER BY kafka_offset`)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ibDeadRow])
	if err != nil {
		t.Fatal(err)
	}
	return dead
}

// TestInboxHandlerNilAfterFailedStatement: a handler that "records the
// poison record and returns nil" after one of its statements failed cannot
// commit its transaction; the record is parked with the reason instead of
// being retried for ever, and the partition goes on.
func TestInboxHandlerNilAfterFailedStatement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	calls := newIBCalls()
	inner := calls.handler(nil)
	h := func(hctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if inbox.EventID(rec) == "bad" {
			if _, err := tx.Exec(hctx, `SELECT 1/0`); err == nil {
				return fmt.Errorf("1/0 succeeded")
			}
			return nil // "recorded" (logged), skipped
		}
		return inner(hctx, tx, rec)
	}
	ibProduceTo(ctx, t, topic, 0, "evt-0", "bad", "evt-2")
	ic := ibStart(t, dsn, topic, "inbox-"+topic, h)
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	defer waitCancel()
	ibWait(t, waitCtx, "evt-2 after the bad record", func() bool { return calls.okCount([]string{"evt-0", "evt-2"}) == 2 })
	ic.stop(t)
	dead := ibDeadRows(ctx, t, conn)
	if len(dead) != 1 || dead[0].EventID != "bad" || !strings.Contains(dead[0].Error, "a statement in its transaction had failed") {
		t.Fatalf("dead-letter rows %+v, want the bad record with its reason", dead)
	}
	if d := ic.metric(t, inbox.MetricDead); d != 1 {
		t.Errorf("dead = %v, want 1", d)
	}
	ibCommittedAtEnd(ctx, t, "inbox-"+topic, topic)
}

// TestInboxPoisonParked: Poison parks a record at once, MaxAttempts after so
// many failures; both land in the dead-letter table with their error, and
// the records after them are handled in order.
func TestInboxPoisonParked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	calls := newIBCalls()
	inner := calls.handler(func(id string, _ int) bool { return id == "always-fails" })
	h := func(hctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if inbox.EventID(rec) == "malformed" {
			return inbox.Poison(fmt.Errorf("payload is not an order"))
		}
		return inner(hctx, tx, rec)
	}
	ibProduceTo(ctx, t, topic, 0, "evt-0", "malformed", "evt-2", "always-fails", "evt-4")
	ic := ibStart(t, dsn, topic, "inbox-"+topic, h, func(c *inbox.Config) { c.MaxAttempts = 3 })
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	defer waitCancel()
	ibWait(t, waitCtx, "evt-4", func() bool { return calls.okCount([]string{"evt-4"}) == 1 })
	ic.stop(t)
	if ok, _ := calls.snapshot(); !slices.Equal(ok, []string{"evt-0", "evt-2", "evt-4"}) {
		t.Errorf("handled %v, want evt-0, evt-2, evt-4 in order", ok)
	}
	dead := ibDeadRows(ctx, t, conn)
	if len(dead) != 2 || dead[0].EventID != "malformed" || dead[0].Attempts != 1 || !strings.Contains(dead[0].Error, "payload is not an order") ||
		dead[1].EventID != "always-fails" || dead[1].Attempts != 3 || !strings.Contains(dead[1].Error, "injected failure of always-fails, attempt 3") {
		t.Fatalf("dead-letter rows %+v", dead)
	}
	if _, a := calls.snapshot(); a["always-fails"] != 3 {
		t.Errorf("always-fails attempted %d times, want 3 (MaxAttempts)", a["always-fails"])
	}
	// Parked events are in the inbox: a redelivery is a duplicate.
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id IN ('malformed', 'always-fails')`).Scan(&n); err != nil || n != 2 {
		t.Errorf("inbox rows of the parked events: %d (%v), want 2", n, err)
	}
	if d := ic.metric(t, inbox.MetricDead); d != 2 {
		t.Errorf("dead = %v, want 2", d)
	}
	ibCommittedAtEnd(ctx, t, "inbox-"+topic, topic)
}

// TestInboxCleanupSharedTable: two services share an inbox table with
// different retentions; each one's cleanup deletes only its own rows.
func TestInboxCleanupSharedTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, conn := ibSetup(ctx, t)
	if _, err := conn.Exec(ctx, `INSERT INTO inbox (event_id, consumer_name, topic, kafka_partition, kafka_offset, processed_at)
		SELECT 'evt-' || i, c, 't', 0, i, now() - interval '3 days'
		FROM generate_series(1, 5) i, (VALUES ('billing'), ('shipping')) v(c)`); err != nil {
		t.Fatal(err)
	}
	// shipping keeps 1 day, billing 30 days.
	if n, err := inbox.Cleanup(ctx, conn, "shipping", 24*time.Hour); err != nil || n != 5 {
		t.Fatalf("Cleanup(shipping, 1d) = %d, %v; want 5 rows", n, err)
	}
	if n, err := inbox.CleanupTable(ctx, conn, inbox.DefaultTable, "billing", 30*24*time.Hour); err != nil || n != 0 {
		t.Fatalf("CleanupTable(billing, 30d) = %d, %v; want 0 rows", n, err)
	}
	var billing, shipping int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE consumer_name = 'billing'), count(*) FILTER (WHERE consumer_name = 'shipping') FROM inbox`).Scan(&billing, &shipping); err != nil {
		t.Fatal(err)
	}
	if billing != 5 || shipping != 0 {
		t.Errorf("after cleanup: billing %d rows (want 5, its retention is 30 days), shipping %d (want 0)", billing, shipping)
	}
	if _, err := inbox.Cleanup(ctx, conn, "", time.Hour); err == nil {
		t.Error("Cleanup without a consumer name accepted")
	}
}

// TestInboxCrashBeforeOffsetCommit: a consumer that died after its database
// commits and before its offset commits (simulated by moving the group's
// offsets back to the start, where a lost commit leaves them) redelivers
// everything to the next member; the inbox turns each into a duplicate and
// no handler runs twice.
func TestInboxCrashBeforeOffsetCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	group := "inbox-" + topic
	ids := ibIDs("evt", 6)
	ibProduceTo(ctx, t, topic, 0, ids...)
	calls := newIBCalls()
	first := ibStart(t, dsn, topic, group, calls.handler(nil))
	ibWait(t, ctx, "6 events", func() bool { return calls.okCount(ids) == 6 })
	first.stop(t)

	adm := newAdmin(t)
	var lost kadm.Offsets
	lost.Add(kadm.Offset{Topic: topic, Partition: 0, At: 0})
	if _, err := adm.CommitOffsets(ctx, group, lost); err != nil {
		t.Fatal(err)
	}
	second := ibStart(t, dsn, topic, group, calls.handler(nil))
	ibWait(t, ctx, "6 duplicates", func() bool { return second.metric(t, inbox.MetricDuplicates) == 6 })
	second.stop(t)
	_, attempts := calls.snapshot()
	for _, id := range ids {
		if attempts[id] != 1 {
			t.Errorf("handler ran %d times for %s, want 1", attempts[id], id)
		}
	}
	if got := ibHandledRows(ctx, t, conn); !slices.Equal(got, ids) {
		t.Errorf("handled table %v, want %v", got, ids)
	}
	ibCommittedAtEnd(ctx, t, group, topic)
}
