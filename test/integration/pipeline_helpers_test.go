package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// createOutbox creates an outbox table named table whose payload column has
// type payloadType.
func createOutbox(t *testing.T, dsn, table, payloadType string) {
	t.Helper()
	exec1(t, dsn, fmt.Sprintf(`CREATE TABLE %s (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregate_type text NOT NULL,
		aggregate_id text,
		event_type text NOT NULL,
		payload %s,
		tenant text,
		created_at timestamptz NOT NULL DEFAULT now())`, table, payloadType))
}

func exec1(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func pgConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// runID makes this run's topic names unique, so the suite can run again
// against the same broker (OUTBOX_CDC_TEST_KAFKA_BROKERS, or -count=2).
var runID = fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)

// slotCleanups remembers which (test, slot) pairs have a cleanup.
var slotCleanups sync.Map

// topicTemplate is kafka.topic for every connector the tests start.
var topicTemplate = "outbox.event.{aggregate_type}." + runID

// topicFor is the topic events of aggType go to.
func topicFor(aggType string) string { return "outbox.event." + aggType + "." + runID }

// dlqFor is the dead-letter topic of the connector using slot.
func dlqFor(slot string) string { return "dlq." + slot + "." + runID }

// dropSlotAtEnd drops the slot when the test ends (slots are cluster-wide
// and would outlive the test's database). Only the first registration per
// test counts: cleanups run last-in first-out, so it runs after the
// connectors started later in the test have stopped.
func dropSlotAtEnd(t *testing.T, dsn, slot string) {
	if _, dup := slotCleanups.LoadOrStore(t.Name()+"\x00"+slot, true); dup {
		return
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return // the server was replaced by the test itself
		}
		defer conn.Close(context.Background())
		if err := cdctest.DropSlot(ctx, conn, slot); err != nil {
			t.Errorf("slot %s still exists at the end of the test: %v", slot, err)
		}
	})
}

// testConfig is a valid configuration for the shared servers.
func testConfig(t *testing.T, dsn, table, slot string) *config.Config {
	dropSlotAtEnd(t, dsn, slot)
	c := config.Default()
	c.Postgres.DSN = config.DSN(dsn)
	c.Postgres.Slot = slot
	c.Postgres.Publication = slot
	c.Postgres.StatusInterval = 200 * time.Millisecond
	c.Postgres.ReconnectBackoffMax = time.Second
	c.Outbox.Table = table
	c.Kafka.Brokers = kafkaServer.Brokers()
	c.Kafka.DLQTopic = dlqFor(slot)
	c.Kafka.Topic = topicTemplate
	c.HTTP.Listen = ""
	return &c
}

// connector runs the pipeline in-process.
type connector struct {
	cancel context.CancelFunc
	done   chan error
	p      *pipeline.Pipeline
	m      *metrics.Metrics
	log    *logLines
}

// logLines keeps the lines a connector logged, for tests that wait for one.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

// logged reports whether some line logged so far contains every one of parts.
func (c *connector) logged(parts ...string) bool {
	c.log.mu.Lock()
	defer c.log.mu.Unlock()
	for _, line := range c.log.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func startConnector(t *testing.T, cfg *config.Config, tune ...func(*pipeline.Config)) *connector {
	t.Helper()
	pc, err := cli.PipelineConfig(cfg)
	if err != nil {
		t.Fatalf("pipeline config: %v", err)
	}
	for _, f := range tune {
		f(&pc)
	}
	m := metrics.New()
	lines := &logLines{}
	log := slog.New(slog.NewTextHandler(testWriter{t, lines}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := pipeline.New(pc, m, log)
	if err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &connector{cancel: cancel, done: make(chan error, 1), p: p, m: m, log: lines}
	go func() { c.done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-c.done:
		cancel()
		t.Fatalf("connector stopped at start: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatal("connector not ready after 1m")
	}
	// Ready means set up; wait until the stream is connected too.
	waitFor(t, 30*time.Second, "replication stream connected", p.Streaming)
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop cancels the connector and waits for a clean exit.
func (c *connector) stop(t *testing.T) {
	t.Helper()
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("connector stopped with error: %v", err)
		}
	case <-time.After(time.Minute):
		t.Errorf("connector did not stop within 1m")
	}
}

// testWriter sends log lines to t.Log, and drops them after the test ends;
// with lines set it keeps them there too.
type testWriter struct {
	t     *testing.T
	lines *logLines
}

func (w testWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	if w.lines != nil {
		w.lines.add(line)
	}
	defer func() { _ = recover() }() // logging after the test finished panics
	w.t.Log(line)
	return len(p), nil
}

// waitFor polls cond, which reads a real state, until it holds; it fails the
// test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // poll interval: cond reads the real state again
	}
}

// consumeN reads topics from the beginning until want records arrived, then
// keeps reading for quiet to catch anything extra. Records come back in
// per-partition offset order.
func consumeN(t *testing.T, topics []string, want int, timeout, quiet time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(timeout)
	var quietUntil time.Time
	for {
		now := time.Now()
		if len(recs) >= want && quietUntil.IsZero() {
			quietUntil = now.Add(quiet)
		}
		end := deadline
		if !quietUntil.IsZero() {
			end = quietUntil
		}
		if now.After(end) {
			break
		}
		ctx, cancel := context.WithDeadline(context.Background(), end)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Logf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) < want {
		t.Fatalf("consumed %d records from %v, want %d", len(recs), topics, want)
	}
	return recs
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// slotConfirmed reads confirmed_flush_lsn of slot.
func slotConfirmed(t *testing.T, dsn, slot string) lsn.LSN {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := replication.Slot(ctx, dsn, slot)
	if err != nil {
		t.Fatalf("read slot: %v", err)
	}
	return info.Confirmed
}

func currentLSN(t *testing.T, conn *pgx.Conn) lsn.LSN {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		t.Fatalf("current lsn: %v", err)
	}
	l, err := lsn.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// seqsByKey groups a header value per record key, in partition order.
func byPartition(recs []*kgo.Record) map[int32][]*kgo.Record {
	m := map[int32][]*kgo.Record{}
	for _, r := range recs {
		m[r.Partition] = append(m[r.Partition], r)
	}
	for _, rs := range m {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
	}
	return m
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// connectorBinary returns the outbox-cdc binary: $OUTBOX_CDC_BIN (make
// integration builds it) or one built here.
func connectorBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binPath = os.Getenv(cdctest.EnvBin); binPath != "" {
			return
		}
		dir, err := os.MkdirTemp("", "outbox-cdc-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "outbox-cdc")
		binErr = cdctest.Build(context.Background(), "go", binPath)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// freeAddr returns a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// writeConfig writes cfg-like YAML text to a temp file.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "outbox-cdc.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runBinary runs the connector binary to completion and returns its exit
// code and combined output.
func runBinary(t *testing.T, timeout time.Duration, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	code, out, err := cdctest.Run(ctx, connectorBinary(t), env, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return code, out
}

// dropReleasedSlot drops slot once no walsender holds it: the walsender
// outlives the connector's exit for a moment.
func dropReleasedSlot(t *testing.T, dsn, slot string) {
	t.Helper()
	conn := pgConnect(t, dsn)
	waitFor(t, time.Minute, "slot "+slot+" released by its walsender", func() bool {
		var active bool
		err := conn.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		return err == nil && !active
	})
	exec1(t, dsn, "SELECT pg_drop_replication_slot($1)", slot)
}
