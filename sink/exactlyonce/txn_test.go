package exactlyonce_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

const positions = "outbox-cdc.positions"

// newTxn starts a transactional sink for source on c; it is closed before
// the cluster.
func newTxn(ctx context.Context, t *testing.T, c *kfake.Cluster, source string, interval time.Duration, tune ...func(*exactlyonce.Config)) (*exactlyonce.Txn, lsn.LSN, func()) {
	t.Helper()
	cfg := txnConfig(c, source, interval)
	for _, f := range tune {
		f(&cfg)
	}
	tx, err := exactlyonce.New(cfg, testLog())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	closeOnce := sync.OnceFunc(tx.Close)
	t.Cleanup(closeOnce)
	pos, err := tx.Start(ctx)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return tx, pos.LSN, closeOnce
}

// txnConfig is the tests' configuration of a transactional sink for source
// on c.
func txnConfig(c *kfake.Cluster, source string, interval time.Duration) exactlyonce.Config {
	return exactlyonce.Config{
		Sink: sink.Config{Brokers: c.ListenAddrs(), ClientID: "txn-test", DLQTopic: dlq,
			TestOpts: []kgo.Opt{kgo.MetadataMinAge(10 * time.Millisecond),
				kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}},
		Positions: positions, Source: source, Interval: interval,
		FenceCheck: time.Hour, // tests that want the idle check set it
	}
}

// produceTxn hands one PostgreSQL transaction over: a record per value,
// keyed by its value, then its end.
func produceTxn(ctx context.Context, t *testing.T, tx *exactlyonce.Txn, done sink.Done, end lsn.LSN, tp string, values ...string) {
	t.Helper()
	for _, v := range values {
		rec := &router.Record{Topic: tp, Key: []byte(v), Value: []byte(v), Timestamp: time.Now()}
		if err := tx.Produce(ctx, rec, done); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	tx.EndTxn(end)
}

// readCommitted reads topic from the start to its end with read_committed
// (control records kept when markers is set) and returns its records.
func readCommitted(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string, committed, markers bool) []*kgo.Record {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond), kgo.FetchIsolationLevel(iso)}
	if markers {
		opts = append(opts, kgo.KeepControlRecords())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	// Nothing more for 300ms: the end (an absence has no signal).
	for {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := cl.PollFetches(short)
		cancel()
		if ctx.Err() != nil {
			t.Fatalf("read %s: %v", topic, ctx.Err())
		}
		got := fs.Records()
		if len(got) == 0 {
			return recs
		}
		recs = append(recs, got...)
	}
}

func values(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		if !r.Attrs.IsControl() {
			out = append(out, string(r.Value))
		}
	}
	return out
}

func lastPosition(ctx context.Context, t *testing.T, c *kfake.Cluster, source string) lsn.LSN {
	t.Helper()
	var pos exactlyonce.Position
	for _, r := range readCommitted(ctx, t, c, positions, true, false) {
		if string(r.Key) == source {
			if err := json.Unmarshal(r.Value, &pos); err != nil {
				t.Fatalf("position %s: %v", r.Value, err)
			}
		}
	}
	return pos.LSN
}

// TestTxnGroupsWholeTransactions: PostgreSQL transactions handed over within
// the interval share one Kafka transaction with their position; nothing is
// acknowledged or visible to read_committed before the commit, and a
// transaction not ended is never part of one.
func TestTxnGroupsWholeTransactions(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	tx, start, _ := newTxn(ctx, t, c, "sys/db/slot", 300*time.Millisecond)
	if start != 0 {
		t.Fatalf("start position %v on a new cluster", start)
	}
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1", "a2", "a3")
	produceTxn(ctx, t, tx, done, 200, "one", "b1", "b2")
	// Handed over, not ended: must not travel with them.
	for _, v := range []string{"c1", "c2"} {
		if err := tx.Produce(ctx, &router.Record{Topic: "one", Key: []byte(v), Value: []byte(v)}, done); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	select {
	case o := <-done.C():
		t.Fatalf("outcome %+v before the interval passed", o)
	case <-time.After(100 * time.Millisecond): // well inside the 300ms interval
	}
	for range 5 {
		if o := done.Wait(ctx, t); o.Err != nil || o.DeadLettered {
			t.Fatalf("outcome %+v", o)
		}
	}
	done.None(t, 100*time.Millisecond)
	if got := tx.Committed(); got != 200 {
		t.Fatalf("Committed() = %v, want 200", got)
	}
	recs := readCommitted(ctx, t, c, "one", true, true)
	markers := 0
	for _, r := range recs {
		if r.Attrs.IsControl() {
			markers++
		}
	}
	if got := fmt.Sprint(values(recs)); got != "[a1 a2 a3 b1 b2]" || markers != 1 {
		t.Fatalf("read_committed sees %s with %d transaction markers, want [a1 a2 a3 b1 b2] in one transaction", got, markers)
	}
	if pos := lastPosition(ctx, t, c, "sys/db/slot"); pos != 200 {
		t.Fatalf("committed position %v, want 200", pos)
	}
}

// TestTxnFencing: a second sink of the same source reads the committed
// position and fences the first, whose next commit fails for good with the
// fencing error; a sink of another source is not affected.
func TestTxnFencing(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	first, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	other, _, _ := newTxn(ctx, t, c, "sys/db/other", time.Millisecond)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, first, done, 100, topic, "x1")
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("first commit: %+v", o)
	}

	second, pos, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	if pos != 100 {
		t.Fatalf("second instance starts at %v, want the committed 100", pos)
	}
	produceTxn(ctx, t, first, done, 200, topic, "zombie")
	o := done.Wait(ctx, t)
	var fenced *kafka.FencedError
	if !errors.As(o.Err, &fenced) || kafka.Classify(o.Err) == kafka.ClassShutdown {
		t.Fatalf("fenced instance's outcome %+v, want a fatal FencedError", o)
	}
	// Never commits again, whatever it is given.
	produceTxn(ctx, t, first, done, 300, topic, "zombie2")
	if o := done.Wait(ctx, t); !errors.As(o.Err, &fenced) {
		t.Fatalf("after fencing: %+v", o)
	}
	produceTxn(ctx, t, second, done, 200, topic, "x2")
	produceTxn(ctx, t, other, done, 500, topic, "y1")
	for range 2 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("commit after takeover: %+v", o)
		}
	}
	got := values(readCommitted(ctx, t, c, topic, true, false))
	for _, v := range got {
		if v == "zombie" || v == "zombie2" {
			t.Fatalf("read_committed sees the fenced instance's %s: %v", v, got)
		}
	}
	if len(got) != 3 {
		t.Fatalf("read_committed sees %v, want x1, x2, y1", got)
	}
	if a, b := lastPosition(ctx, t, c, "sys/db/slot"), lastPosition(ctx, t, c, "sys/db/other"); a != 200 || b != 500 {
		t.Fatalf("positions %v and %v, want 200 and 500", a, b)
	}
}

// TestTxnFencedIdleStops: a fenced instance with nothing to publish learns
// it from its idle check and reports the fatal error once.
func TestTxnFencedIdleStops(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	fatal := make(chan error, 4) // more than one report overflows into a failure below
	first, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.FenceCheck = 50 * time.Millisecond
		cfg.Fail = func(err error) { fatal <- err }
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, first, done, 100, topic, "x1")
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("commit: %+v", o)
	}
	select {
	case err := <-fatal:
		t.Fatalf("fatal error %v before any other instance started", err)
	case <-time.After(200 * time.Millisecond): // several idle checks pass unfenced
	}
	newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	var fenced *kafka.FencedError
	select {
	case err := <-fatal:
		if !errors.As(err, &fenced) {
			t.Fatalf("fatal error %v, want a FencedError", err)
		}
	case <-ctx.Done():
		t.Fatal("the fenced idle instance never reported it")
	}
	select {
	case err := <-fatal:
		t.Fatalf("second report %v", err)
	case <-time.After(200 * time.Millisecond): // further idle checks report nothing more
	}
	if pos := lastPosition(ctx, t, c, "sys/db/slot"); pos != 100 {
		t.Fatalf("committed position %v, want 100", pos)
	}
}

// TestTxnRefusedRecordRedone: a record the broker refuses in a batch with
// others aborts the transaction; it is sent alone, refused again and
// dead-lettered in the redone transaction, with the rest exactly once and
// in order for read_committed. read_uncommitted sees the aborted copies.
func TestTxnRefusedRecordRedone(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 50*time.Millisecond)
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), "one")
	refused, _ := sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == "one" && bytes.Contains(b, []byte("poison")) {
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "e1", "poison", "e2")
	produceTxn(ctx, t, tx, done, 200, "one", "e3")
	var dead int
	for range 4 {
		o := done.Wait(ctx, t)
		if o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
		if o.DeadLettered {
			dead++
		}
	}
	done.None(t, 100*time.Millisecond)
	if dead != 1 || refused.Load() < 2 {
		t.Fatalf("%d dead-lettered, %d refusals; want 1 and at least 2 (with others, then alone)", dead, refused.Load())
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[e1 e2 e3]" {
		t.Fatalf("read_committed sees %s, want [e1 e2 e3]", got)
	}
	dl := readCommitted(ctx, t, c, dlq, true, false)
	if len(dl) != 1 || string(dl[0].Value) != "poison" {
		t.Fatalf("dead-letter topic holds %v, want the poison record", values(dl))
	}
	if v, _ := sinktest.Header(dl[0], "topic"); v != "one" {
		t.Fatalf("dead letter's topic header %q", v)
	}
	// The aborted attempt's copies are in the log: only isolation hides them.
	if n := len(values(readCommitted(ctx, t, c, "one", false, false))); n <= 3 {
		t.Fatalf("read_uncommitted sees %d records; the aborted attempt left none?", n)
	}
	if pos := lastPosition(ctx, t, c, "sys/db/slot"); pos != 200 {
		t.Fatalf("committed position %v, want 200", pos)
	}
}

// TestTxnTooLargeDeadLettered: a record over its topic's limit is
// dead-lettered before it is sent, inside the transaction.
func TestTxnTooLargeDeadLettered(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), "small", map[string]string{"max.message.bytes": "1024"})
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	big := string(bytes.Repeat([]byte("y"), 4<<10))
	produceTxn(ctx, t, tx, done, 100, "small", "ok", big)
	var dead []sink.Outcome
	for range 2 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		} else if o.DeadLettered {
			dead = append(dead, o)
		}
	}
	want := fmt.Sprintf("exceeds max.message.bytes 1024 of topic small")
	if len(dead) != 1 || !bytes.Contains([]byte(dead[0].Reason), []byte(want)) {
		t.Fatalf("dead letters %+v, want one %q", dead, want)
	}
	if got := values(readCommitted(ctx, t, c, dlq, true, false)); len(got) != 1 || got[0] != big {
		t.Fatalf("dead-letter topic holds %d records", len(got))
	}
}

// TestTxnPositionsTopicChecked: a positions topic that deletes is a
// prerequisite error naming the fix; a missing one is created compacted.
func TestTxnPositionsTopicChecked(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), positions, map[string]string{"cleanup.policy": "delete"})
	tx, err := exactlyonce.New(exactlyonce.Config{Sink: sink.Config{Brokers: c.ListenAddrs(), DLQTopic: dlq},
		Positions: positions, Source: "s"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer tx.Close()
	_, err = tx.Start(ctx)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("cleanup.policy=compact")) {
		t.Fatalf("Start = %v, want the cleanup policy named with its fix", err)
	}
}

// cutEndTxn is a dialer for the transactional client: once armed, the
// connection that carries an EndTxn request is cut before the answer (with
// the request delivered, or lost when lose is set) and new connections are
// refused for a while, so the client gives up on the commit without knowing
// its outcome, as a network cut at the wrong moment does.
type cutEndTxn struct {
	lose    bool
	armed   atomic.Bool
	cut     atomic.Bool
	refuse  atomic.Int64 // unix nanoseconds until which dials fail
	refusal time.Duration
}

func (d *cutEndTxn) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if time.Now().UnixNano() < d.refuse.Load() {
		return nil, errors.New("test: connection refused")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, d: d}, nil
}

type cutConn struct {
	net.Conn
	d     *cutEndTxn
	dying atomic.Bool
}

// Write sees whole requests: size (4 bytes), then the API key (2); EndTxn is 26.
func (c *cutConn) Write(b []byte) (int, error) {
	if c.d.armed.Load() && len(b) >= 6 && binary.BigEndian.Uint16(b[4:6]) == 26 && c.d.cut.CompareAndSwap(false, true) {
		c.dying.Store(true)
		c.d.refuse.Store(time.Now().Add(c.d.refusal).UnixNano())
		if c.d.lose {
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	if c.dying.Load() {
		time.Sleep(100 * time.Millisecond) // the broker handles the request meanwhile
		c.Conn.Close()
		return 0, errors.New("test: connection cut before the answer")
	}
	return c.Conn.Read(b)
}

// TestTxnUnconfirmedCommit: a commit whose outcome the client cannot know
// (the connection is cut before the answer) is settled before anything is
// produced again: when the broker committed it, the sink learns so from the
// positions topic and does not produce it again; when the request was lost,
// the transaction is aborted and produced again. Either way read_committed
// sees each event once and every outcome is a success.
func TestTxnUnconfirmedCommit(t *testing.T) {
	for _, tt := range []struct {
		name string
		lose bool
	}{
		{"the broker committed, the answer was lost", false},
		{"the request was lost", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
			d := &cutEndTxn{lose: tt.lose, refusal: time.Second}
			tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
				cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(d.dial))
			})
			done := sinktest.NewOutcomes()
			ok := func(n int) {
				t.Helper()
				for range n {
					if o := done.Wait(ctx, t); o.Err != nil {
						t.Fatalf("outcome %+v", o)
					}
				}
			}
			produceTxn(ctx, t, tx, done, 100, "one", "a1", "a2")
			ok(2)
			d.armed.Store(true)
			produceTxn(ctx, t, tx, done, 200, "one", "b1", "b2", "b3")
			ok(3)
			if !d.cut.Load() {
				t.Fatal("no EndTxn was cut: the test tested nothing")
			}
			produceTxn(ctx, t, tx, done, 300, "one", "c1")
			ok(1)
			if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 b1 b2 b3 c1]" {
				t.Fatalf("read_committed sees %s, want [a1 a2 b1 b2 b3 c1]: each event once", got)
			}
			if got := tx.Committed(); got != 300 {
				t.Fatalf("Committed() = %v, want 300", got)
			}
		})
	}
}

// TestTxnPositionsTopicCompactListAccepted: "delete,compact" with an
// infinite retention keeps every position; the start accepts it.
func TestTxnPositionsTopicCompactListAccepted(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), positions, map[string]string{"cleanup.policy": "delete,compact", "retention.ms": "-1"})
	tx, err := exactlyonce.New(exactlyonce.Config{Sink: sink.Config{Brokers: c.ListenAddrs(), DLQTopic: dlq},
		Positions: positions, Source: "s"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer tx.Close()
	if _, err := tx.Start(ctx); err != nil {
		t.Fatalf("Start = %v, want the compacted positions topic accepted", err)
	}
}

func testLog() *slog.Logger {
	if os.Getenv("TXN_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}
