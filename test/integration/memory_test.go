package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// churnSQL makes transactions the connector must see but not publish, one
// COMMIT each, server-side: kind message emits a transactional logical
// message under another prefix (sent by pgoutput with messages on, even on
// PostgreSQL 15, which skips transactions with nothing to publish), other
// inserts into a table outside the publication, empty only takes an xid.
const churnSQL = `CREATE PROCEDURE churn(n int, kind text) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		IF kind = 'message' THEN
			PERFORM pg_logical_emit_message(true, 'other-app', 'x');
		ELSIF kind = 'other' THEN
			INSERT INTO other VALUES (i);
		ELSE
			PERFORM pg_current_xact_id();
		END IF;
		COMMIT;
	END LOOP;
END $$`

// TestMemoryBoundedWhileBrokerDown runs the real binary with the broker
// stopped and events in flight, then (1) a million transactions with nothing
// to publish behind them, and (2) rows far larger in total than the queue
// while the producer buffer is full. The process's peak RSS must stay under
// 100 MB, and everything is delivered once the broker returns.
func TestMemoryBoundedWhileBrokerDown(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("needs a broker the test can stop")
	}
	const (
		churn      = 1_000_000 // message transactions
		churnOther = 100_000   // other-table and empty transactions, each
		bigRows    = 60
		bigSize    = 2 << 20
		limitRSS   = 100 << 20
	)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, "CREATE TABLE other (id int)")
	exec1(t, dsn, churnSQL)
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "memory")
	// The other application's messages are part of the churn; from 14 on
	// they are streamed too (messages option) and must be skipped.
	prefix := ""
	if serverMajor(t, dsn) >= 14 {
		prefix = "message_prefix: outbox"
	}
	cfgPath := writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %s
  slot: memory
  publication: memory
  status_interval: 200ms
  queue_bytes: 16777216
outbox:
  table: public.outbox
  %s
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
  max_buffered_records: 50
  request_timeout: 5s
http:
  listen: %s
`, dsn, prefix, strings.Join(kafkaServer.Brokers(), ", "), dlqFor("memory"), topicTemplate, addr))
	p := startProcess(t, cfgPath, addr)
	conn := pgConnect(t, dsn)
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "mem", "k", "E", fmt.Sprintf(`{"seq": %d}`, i)) })
		}
	}
	write(0, 1)
	consumeN(t, []string{topicFor("mem")}, 1, time.Minute, 0)

	ensureKafkaRunning(t)
	if err := kafkaServer.Stop(ctx); err != nil {
		t.Fatalf("stop kafka: %v", err)
	}
	// Phase 1: a few events in flight hold the watermark; behind them a
	// million transactions with nothing to publish.
	write(1, 6)
	waitFor(t, time.Minute, "5 events in flight", func() bool { return scrape(t, addr, "outbox_cdc_inflight_events") == 5 })
	before := scrape(t, addr, "outbox_cdc_transactions_total")
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, job := range []struct {
		kind string
		n    int
	}{{"message", churn / 2}, {"message", churn / 2}, {"other", churnOther}, {"empty", churnOther}} {
		wg.Go(func() {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(context.Background())
			if _, err := c.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				errs <- err
				return
			}
			if _, err := c.Exec(ctx, "CALL churn($1, $2)", job.n, job.kind); err != nil {
				errs <- fmt.Errorf("churn %s: %w", job.kind, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	generated := time.Since(start)
	end := currentLSN(t, conn)
	// Every message transaction reaches the processor (a Begin each); on
	// PostgreSQL 15+ the other-table and empty ones are skipped by pgoutput.
	waitFor(t, 10*time.Minute, "the connector to read the churn", func() bool {
		return scrape(t, addr, "outbox_cdc_transactions_total")-before >= churn &&
			lsn.LSN(scrape(t, addr, "outbox_cdc_received_lsn")) >= end
	})
	seen := scrape(t, addr, "outbox_cdc_transactions_total") - before
	if c := slotConfirmed(t, dsn, "memory"); c >= end {
		t.Fatalf("slot confirmed %v past the churn while events were unacknowledged", c)
	}
	rss1 := peakRSS(t, p)
	t.Logf("phase 1: %d transactions generated in %v, %.0f reached the connector in %v; peak RSS %d MiB",
		churn+2*churnOther, generated.Round(time.Second), seen, time.Since(start).Round(time.Second), rss1>>20)

	// Phase 2: the producer buffer fills (max_buffered_records) and the
	// processor blocks; rows far larger than queue_bytes in total follow.
	write(6, 60)
	for i := 0; i < bigRows; i++ {
		exec1(t, dsn, "SELECT pg_logical_emit_message(true, 'other-app', repeat('x', $1))", bigSize)
	}
	end2 := currentLSN(t, conn)
	// The stream either reads everything (the queue holds it all) or stops
	// when the queue is full: wait until it reached the end or stood still.
	// Nothing signals "stalled": it is received_lsn not moving over 3 s, so
	// the sleep below is the sampling interval of that observation.
	var last float64
	still := 0
	waitFor(t, 5*time.Minute, "the stream to stall or finish", func() bool {
		time.Sleep(500 * time.Millisecond) // sampling interval of the stillness check, not a wait for an event
		r := scrape(t, addr, "outbox_cdc_received_lsn")
		if r == last {
			still++
		} else {
			still = 0
		}
		last = r
		return lsn.LSN(r) >= end2 || still >= 6
	})
	rss2 := peakRSS(t, p)
	t.Logf("phase 2: %d rows of %d MiB behind a full producer buffer; stream read %v of %v; peak RSS %d MiB",
		bigRows, bigSize>>20, lsn.LSN(last), end2, rss2>>20)

	if err := kafkaServer.Restart(ctx); err != nil {
		t.Fatalf("restart kafka: %v", err)
	}
	recs := consumeN(t, []string{topicFor("mem")}, 60, 3*time.Minute, time.Second)
	distinct := map[string]bool{}
	for _, r := range recs {
		distinct[string(r.Value)] = true
	}
	if len(distinct) != 60 {
		t.Fatalf("%d distinct events after the broker returned, want 60", len(distinct))
	}
	final := currentLSN(t, conn)
	waitFor(t, 2*time.Minute, "slot to catch up", func() bool { return slotConfirmed(t, dsn, "memory") >= final })
	stopClean(t, p)
	if rss2 > limitRSS {
		t.Fatalf("connector peak RSS %d MiB, want under %d MiB (after phase 1: %d MiB)", rss2>>20, limitRSS>>20, rss1>>20)
	}
}

// TestReplicationReceiveTimeout puts a TCP proxy between the connector and
// PostgreSQL. An idle but healthy replication connection is kept (the
// server answers the stream's pings); once the proxy stalls it (a half-open
// connection: open, nothing passes), the stream gives it up after
// postgres.receive_timeout and reconnects by itself.
func TestReplicationReceiveTimeout(t *testing.T) {
	if pgServer.External() {
		t.Skip("the proxy needs the harness's own server")
	}
	const timeout = 2 * time.Second
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	// The server drops the stalled walsender, which still holds the slot,
	// soon after it stops hearing from us.
	exec1(t, dsn, "ALTER SYSTEM SET wal_sender_timeout = '5s'")
	exec1(t, dsn, "SELECT pg_reload_conf()")
	t.Cleanup(func() {
		exec1(t, dsn, "ALTER SYSTEM RESET wal_sender_timeout")
		exec1(t, dsn, "SELECT pg_reload_conf()")
	})
	px := newStallProxy(t, fmt.Sprintf("127.0.0.1:%d", pgServer.Port()))
	cfg := testConfig(t, dsn, "public.outbox", "silent")
	cfg.Postgres.DSN = config.DSN(px.rewrite(t, dsn))
	cfg.Postgres.ReceiveTimeout = timeout
	cfg.Postgres.HeartbeatInterval = 0 // an idle server says nothing unless asked
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)

	// Idle for five timeouts: pings keep the connection. The idle period is
	// what is under test (no reconnect during it), not a wait for an event.
	time.Sleep(5 * timeout)
	if n := testutil.ToFloat64(c.m.Reconnects); n != 0 {
		t.Fatalf("%v reconnects on an idle, healthy connection", n)
	}
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "silent", "k", "E", `{"seq": 1}`) })
	consumeN(t, []string{topicFor("silent")}, 1, time.Minute, 0)

	px.stall()
	waitFor(t, time.Minute, "a reconnect after the stall", func() bool { return testutil.ToFloat64(c.m.Reconnects) >= 1 })
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "silent", "k", "E", `{"seq": 2}`) })
	recs := consumeN(t, []string{topicFor("silent")}, 2, 2*time.Minute, time.Second)
	distinct := map[string]bool{}
	for _, r := range recs {
		distinct[string(r.Value)] = true
	}
	if len(distinct) != 2 {
		t.Fatalf("%d distinct events, want 2", len(distinct))
	}
}

// stallProxy forwards TCP connections to a target; stall freezes the
// replication connections open at that moment (nothing passes either way,
// nothing is closed), as a dead peer behind a half-open TCP connection
// looks. Other and later connections are unaffected.
type stallProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	links  []*proxyLink
	wg     sync.WaitGroup
}

type proxyLink struct {
	client, server net.Conn
	replication    bool          // the startup message asked for replication
	frozen         chan struct{} // closed by stall: stop passing bytes
	once           sync.Once
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, l := range p.links {
			l.client.Close()
			l.server.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// rewrite points a URL DSN at the proxy.
func (p *stallProxy) rewrite(t *testing.T, dsn string) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(p.ln.Addr().String())
	old := fmt.Sprintf(":%d/", pgServer.Port())
	if !strings.Contains(dsn, old) {
		t.Fatalf("DSN %q does not name port %d", dsn, pgServer.Port())
	}
	return strings.Replace(dsn, old, ":"+port+"/", 1)
}

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &proxyLink{client: c, server: s, frozen: make(chan struct{})}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(l, c, s, true) })
		p.wg.Go(func() { p.pump(l, s, c, false) })
	}
}

// pump copies src to dst until either closes; once the link is frozen it
// holds what it read and copies nothing more.
func (p *stallProxy) pump(l *proxyLink, src, dst net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	first := fromClient
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if first {
				// The startup message carries replication=database.
				p.mu.Lock()
				l.replication = bytes.Contains(buf[:n], []byte("replication\x00database"))
				p.mu.Unlock()
				first = false
			}
			select {
			case <-l.frozen:
				// Keep the connection open and say nothing until the end.
				_, _ = io.Copy(io.Discard, src)
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				dst.Close()
			}
			return
		}
	}
}

// stall freezes the replication connections open now.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		if l.replication {
			l.once.Do(func() { close(l.frozen) })
		}
	}
}
