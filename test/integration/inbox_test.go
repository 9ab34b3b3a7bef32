package integration

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// These tests run the inbox package (the consumer-side dedupe helper) against
// the real PostgreSQL and Kafka servers.

// ibCalls records what the handler saw. Handlers run on the consumer's
// goroutine; the test goroutine reads through the mutex.
type ibCalls struct {
	mu       sync.Mutex
	ok       []string               // event ids whose handler call returned nil, in order
	attempts map[string]int         // handler calls per event id
	offsets  map[int32][]int64      // offsets of successful calls, per partition
	recs     map[string]*kgo.Record // the record of each successful call
}

func newIBCalls() *ibCalls {
	return &ibCalls{attempts: map[string]int{}, offsets: map[int32][]int64{}, recs: map[string]*kgo.Record{}}
}

// handler returns an inbox.Handler that writes (event id) into the handled
// table in the transaction, then asks fail whether to fail this attempt.
func (c *ibCalls) handler(fail func(id string, attempt int) bool) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		id := inbox.EventID(rec)
		c.mu.Lock()
		c.attempts[id]++
		attempt := c.attempts[id]
		c.mu.Unlock()
		if _, err := tx.Exec(ctx, `INSERT INTO handled (event_id) VALUES ($1)`, id); err != nil {
			return err
		}
		if fail != nil && fail(id, attempt) {
			return fmt.Errorf("injected failure of %s, attempt %d", id, attempt)
		}
		c.mu.Lock()
		c.ok = append(c.ok, id)
		c.offsets[rec.Partition] = append(c.offsets[rec.Partition], rec.Offset)
		c.recs[id] = rec
		c.mu.Unlock()
		return nil
	}
}

func (c *ibCalls) snapshot() (ok []string, attempts map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	attempts = make(map[string]int, len(c.attempts))
	for k, v := range c.attempts {
		attempts[k] = v
	}
	return slices.Clone(c.ok), attempts
}

// ibConsumer runs an inbox.Consumer in the background.
type ibConsumer struct {
	c      *inbox.Consumer
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func ibStart(t *testing.T, dsn, topic, group string, h inbox.Handler, tune ...func(*inbox.Config)) *ibConsumer {
	t.Helper()
	ic := ibNew(t, dsn, topic, group, h, tune...)
	runCtx, stop := context.WithCancel(context.Background())
	ic.cancel = stop
	go func() { ic.done <- ic.c.Run(runCtx) }()
	t.Cleanup(func() { ic.stop(t) })
	return ic
}

// ibNew creates the consumer ibStart runs.
func ibNew(t *testing.T, dsn, topic, group string, h inbox.Handler, tune ...func(*inbox.Config)) *ibConsumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A pool, as the guide says: it replaces connections the server closed.
	conn, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(conn.Close)
	reg := prometheus.NewRegistry()
	cfg := inbox.Config{
		Brokers: kafkaServer.Brokers(), Group: group, Topics: []string{topic}, Consumer: "inventory",
		DB: conn, Handler: h, Registerer: reg,
		RetryBackoff: 20 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(ibLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		KafkaOptions: []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)},
	}
	for _, f := range tune {
		f(&cfg)
	}
	c, err := inbox.New(cfg)
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	return &ibConsumer{c: c, reg: reg, done: make(chan error, 1)}
}

// stop ends Run (which commits what it processed) and leaves the group.
func (ic *ibConsumer) stop(t *testing.T) {
	t.Helper()
	if ic.cancel == nil {
		return
	}
	ic.cancel()
	ic.cancel = nil
	select {
	case err := <-ic.done:
		if err != nil {
			t.Errorf("inbox Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("inbox Run did not return within 30s of cancel")
	}
	ic.c.Close()
}

// metric returns the value of the consumer's counter name.
func (ic *ibConsumer) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := ic.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "consumer" && l.GetValue() == "inventory" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	t.Fatalf("metric %s{consumer=inventory} not registered", name)
	return 0
}

// ibLogWriter sends the consumer's log to the test log.
type ibLogWriter struct{ t *testing.T }

func (w ibLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ibWait polls cond until it holds or the deadline passes.
func ibWait(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond): // poll interval: cond reads the real state again
		}
	}
}

func ibProduce(ctx context.Context, t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func ibEvent(topic, key, id string, n int) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte(key), Value: fmt.Appendf(nil, `{"n":%d}`, n),
		Headers: []kgo.RecordHeader{{Key: "event_type", Value: []byte("OrderPlaced")}, {Key: "aggregate_type", Value: []byte("order")}}}
	if id != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "id", Value: []byte(id)})
	}
	return r
}

// ibSetup creates a database with the inbox and a handled table.
func ibSetup(ctx context.Context, t *testing.T) (dsn string, conn *pgx.Conn) {
	t.Helper()
	dsn = newDatabase(t)
	conn = olConn(ctx, t, dsn)
	if err := inbox.CreateTable(ctx, conn, inbox.DefaultTable); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE handled (seq serial PRIMARY KEY, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return dsn, conn
}

func ibHandledRows(ctx context.Context, t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `SELECT event_id FROM handled ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// ibCommittedAtEnd checks that the group's committed offset of every
// partition of topic is the partition's end offset.
func ibCommittedAtEnd(ctx context.Context, t *testing.T, group, topic string) {
	t.Helper()
	adm := newAdmin(t)
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, e.Partition)
		if e.Offset == 0 && !ok {
			return
		}
		if !ok || c.Err != nil || c.At != e.Offset {
			t.Errorf("partition %d: committed %d (found %v, err %v), end offset %d", e.Partition, c.At, ok, c.Err, e.Offset)
		}
	})
}

func TestInboxDedupeAndCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 3)
	group := "inbox-" + topic

	// Nine events over three keys, and one record without an id header.
	var recs []*kgo.Record
	for i := range 9 {
		recs = append(recs, ibEvent(topic, fmt.Sprintf("order-%d", i%3), fmt.Sprintf("evt-%d", i), i))
	}
	recs = append(recs, ibEvent(topic, "order-0", "", 99))
	ibProduce(ctx, t, recs...)

	calls := newIBCalls()
	ic := ibStart(t, dsn, topic, group, calls.handler(nil))
	ibWait(t, ctx, "10 events processed", func() bool { ok, _ := calls.snapshot(); return len(ok) == 10 })

	// Inject duplicates: a new record carrying an id already processed, and an
	// exact copy of a consumed record produced again.
	calls.mu.Lock()
	orig := calls.recs["evt-2"]
	calls.mu.Unlock()
	again := &kgo.Record{Topic: orig.Topic, Key: orig.Key, Value: orig.Value, Headers: orig.Headers}
	ibProduce(ctx, t, ibEvent(topic, "order-1", "evt-4", 1000), again)
	ibWait(t, ctx, "2 duplicates counted", func() bool { return ic.metric(t, inbox.MetricDuplicates) == 2 })
	ic.stop(t)

	ok, attempts := calls.snapshot()
	if len(ok) != 10 {
		t.Fatalf("handler succeeded %d times, want 10 (one per event id): %v", len(ok), ok)
	}
	for id, n := range attempts {
		if n != 1 {
			t.Errorf("handler ran %d times for %s, want 1", n, id)
		}
	}
	fallback := fmt.Sprintf("%s/%d/%d", topic, recs[9].Partition, recs[9].Offset)
	if attempts[fallback] != 1 {
		t.Errorf("record without id: want event id %s, attempts %v", fallback, attempts)
	}
	calls.mu.Lock()
	for p, offs := range calls.offsets {
		if !slices.IsSorted(offs) {
			t.Errorf("partition %d handled out of order: %v", p, offs)
		}
	}
	calls.mu.Unlock()
	if got := ibHandledRows(ctx, t, conn); len(got) != 10 {
		t.Errorf("handled table has %d rows, want 10: %v", len(got), got)
	}
	var inboxRows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE consumer_name = 'inventory'`).Scan(&inboxRows); err != nil {
		t.Fatal(err)
	}
	if inboxRows != 10 {
		t.Errorf("inbox has %d rows, want 10", inboxRows)
	}
	if p, d, f := ic.metric(t, inbox.MetricProcessed), ic.metric(t, inbox.MetricDuplicates), ic.metric(t, inbox.MetricFailed); p != 10 || d != 2 || f != 0 {
		t.Errorf("metrics processed=%v duplicates=%v failed=%v, want 10, 2, 0", p, d, f)
	}
	ibCommittedAtEnd(ctx, t, group, topic)

	// A new consumer in the same group starts after everything committed: it
	// sees only the event produced now.
	calls2 := newIBCalls()
	ic2 := ibStart(t, dsn, topic, group, calls2.handler(nil))
	ibProduce(ctx, t, ibEvent(topic, "order-2", "evt-new", 2000))
	ibWait(t, ctx, "the new event processed", func() bool { ok, _ := calls2.snapshot(); return len(ok) == 1 })
	ic2.stop(t)
	if ok, _ := calls2.snapshot(); !slices.Equal(ok, []string{"evt-new"}) {
		t.Errorf("second consumer handled %v, want only evt-new", ok)
	}
	if d := ic2.metric(t, inbox.MetricDuplicates); d != 0 {
		t.Errorf("second consumer saw %v duplicates, want 0 (offsets were committed)", d)
	}

	// Cleanup keeps rows younger than the retention and deletes older ones.
	if n, err := inbox.Cleanup(ctx, conn, "inventory", time.Hour); err != nil || n != 0 {
		t.Fatalf("Cleanup(1h) = %d, %v; want 0 rows", n, err)
	}
	if _, err := conn.Exec(ctx, `UPDATE inbox SET processed_at = now() - interval '8 days' WHERE event_id LIKE 'evt-%'`); err != nil {
		t.Fatal(err)
	}
	if n, err := inbox.Cleanup(ctx, conn, "inventory", 7*24*time.Hour); err != nil || n != 10 {
		t.Fatalf("Cleanup(7d) = %d, %v; want 10 rows", n, err)
	}
	if _, err := inbox.Cleanup(ctx, conn, "inventory", 0); err == nil {
		t.Fatal("Cleanup(0) accepted")
	}
}

func TestInboxRetryKeepsOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	group := "inbox-" + topic

	var recs []*kgo.Record
	var want []string
	for i := range 6 {
		id := fmt.Sprintf("evt-%d", i)
		want = append(want, id)
		recs = append(recs, ibEvent(topic, "order-1", id, i))
	}
	ibProduce(ctx, t, recs...)

	// First consumer: evt-1 fails twice, then succeeds; evt-3 always fails.
	calls := newIBCalls()
	ic := ibStart(t, dsn, topic, group, calls.handler(func(id string, attempt int) bool {
		return (id == "evt-1" && attempt <= 2) || id == "evt-3"
	}))
	ibWait(t, ctx, "evt-3 retried", func() bool { _, a := calls.snapshot(); return a["evt-3"] >= 3 })
	if ok, _ := calls.snapshot(); !slices.Equal(ok, want[:3]) {
		t.Fatalf("while evt-3 fails: handled %v, want %v (nothing after evt-3)", ok, want[:3])
	}
	// The records before the failing one were committed before waiting.
	adm := newAdmin(t)
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if c, found := committed.Lookup(topic, 0); !found || c.At != recs[3].Offset {
		t.Errorf("committed offset while evt-3 fails = %d (found %v), want %d", c.At, found, recs[3].Offset)
	}
	ic.stop(t) // stops while evt-3 is still failing: it stays uncommitted
	_, attempts := calls.snapshot()
	if f := ic.metric(t, inbox.MetricFailed); f != float64(2+attempts["evt-3"]) && f != float64(1+attempts["evt-3"]) {
		// The last evt-3 attempt may have been cut short by the stop.
		t.Errorf("failed = %v, want %d", f, 2+attempts["evt-3"])
	}
	if p := ic.metric(t, inbox.MetricProcessed); p != 3 {
		t.Errorf("processed = %v, want 3", p)
	}

	// Second consumer, same group, healthy handler: resumes at evt-3.
	ic2 := ibStart(t, dsn, topic, group, calls.handler(nil))
	ibWait(t, ctx, "all 6 events", func() bool { ok, _ := calls.snapshot(); return len(ok) == 6 })
	ic2.stop(t)

	ok, attempts := calls.snapshot()
	if !slices.Equal(ok, want) {
		t.Fatalf("handled %v, want %v (no loss, no reordering)", ok, want)
	}
	if attempts["evt-1"] != 3 || attempts["evt-0"] != 1 || attempts["evt-5"] != 1 {
		t.Errorf("attempts %v: want evt-1 3, the others once (evt-3 several)", attempts)
	}
	// Failed attempts were rolled back: the handled table has each event once,
	// in order.
	if got := ibHandledRows(ctx, t, conn); !slices.Equal(got, want) {
		t.Errorf("handled table %v, want %v", got, want)
	}
	if d := ic2.metric(t, inbox.MetricDuplicates); d != 0 {
		t.Errorf("duplicates after resume = %v, want 0", d)
	}
	ibCommittedAtEnd(ctx, t, group, topic)
}

// TestInboxRebalanceWhileRetrying: a member stuck retrying one record does
// not hold a rebalance up until the group's rebalance timeout (60s): it lets
// the rebalance go ahead and fetches the record again, so the other
// partition moves on; no event is lost or handled twice.
func TestInboxRebalanceWhileRetrying(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 2)
	group := "inbox-" + topic

	producer, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	produceTo := func(partition int32, ids ...string) {
		t.Helper()
		for _, id := range ids {
			r := ibEvent(topic, "k", id, 0)
			r.Partition = partition
			if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
		}
	}
	produceTo(0, "p0-0", "p0-1")
	produceTo(1, "p1-0", "p1-1")

	var stuck atomic.Bool
	stuck.Store(true)
	calls := newIBCalls()
	h := calls.handler(func(id string, _ int) bool { return id == "p0-0" && stuck.Load() })
	first := ibStart(t, dsn, topic, group, h)
	ibWait(t, ctx, "p0-0 failing", func() bool { _, a := calls.snapshot(); return a["p0-0"] >= 2 })

	start := time.Now()
	second := ibStart(t, dsn, topic, group, h) // joins: the group must rebalance
	produceTo(1, "p1-2")
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	ibWait(t, waitCtx, "p1-2 handled while p0-0 still fails", func() bool {
		ok, _ := calls.snapshot()
		return slices.Contains(ok, "p1-2")
	})
	waitCancel()
	t.Logf("p1-2 handled %v after the second member started", time.Since(start).Round(time.Millisecond))

	stuck.Store(false)
	ibWait(t, ctx, "all 5 events", func() bool { ok, _ := calls.snapshot(); return len(ok) == 5 })
	// A wrongly repeated delivery would come from a member still running:
	// once both have stopped (Run returned after its last commit) the
	// handler calls are final, and offsets committed at the end leave
	// nothing for a later member to fetch again.
	first.stop(t)
	second.stop(t)
	ok, _ := calls.snapshot()
	var p0, p1 []string
	for _, id := range ok {
		if strings.HasPrefix(id, "p0-") {
			p0 = append(p0, id)
		} else {
			p1 = append(p1, id)
		}
	}
	if !slices.Equal(p0, []string{"p0-0", "p0-1"}) || !slices.Equal(p1, []string{"p1-0", "p1-1", "p1-2"}) {
		t.Fatalf("handled %v: want each event once, in partition order", ok)
	}
	if got := ibHandledRows(ctx, t, conn); len(got) != 5 {
		t.Errorf("handled table %v, want 5 rows", got)
	}
	ibCommittedAtEnd(ctx, t, group, topic)
}
