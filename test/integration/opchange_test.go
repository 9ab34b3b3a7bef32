package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// opWriter commits one event per transaction into table "outbox" until
// stopped, retrying an event whose insert fails (the table or a column is
// missing while an operator works), so seq is 1, 2, ... per key without gaps.
type opWriter struct {
	dsn, aggType string
	stop         chan struct{}
	done         chan struct{}
	mu           sync.Mutex
	committed    map[string]int // key → last committed seq
	failures     int
	err          error
}

func startOpWriter(t *testing.T, dsn, aggType string) *opWriter {
	w := &opWriter{dsn: dsn, aggType: aggType, stop: make(chan struct{}), done: make(chan struct{}), committed: map[string]int{}}
	go w.run()
	t.Cleanup(w.halt)
	return w
}

func (w *opWriter) run() {
	defer close(w.done)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	seq := map[string]int{}
	for i := 0; ; i++ {
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			w.err = ctx.Err()
			return
		default:
		}
		key := fmt.Sprintf("k%d", i%3)
		next := seq[key] + 1
		for {
			if conn == nil {
				c, err := pgx.Connect(ctx, w.dsn)
				if err != nil {
					w.err = err
					return
				}
				conn = c
			}
			_, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant)
				VALUES ($1, $2, 'E', $3, 't')`, w.aggType, key, fmt.Sprintf(`{"seq": %d}`, next))
			if err == nil {
				break
			}
			w.mu.Lock()
			w.failures++
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond): // retry interval while the operator's change lasts
			}
		}
		seq[key] = next
		w.mu.Lock()
		w.committed[key] = next
		w.mu.Unlock()
		time.Sleep(5 * time.Millisecond) // pacing: a steady stream of small transactions
	}
}

// attempts is how many inserts the writer has finished: committed or failed.
func (w *opWriter) attempts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.failures
	for _, s := range w.committed {
		n += s
	}
	return n
}

// advance waits until the writer has finished n more inserts (committed or,
// while the table is away, failed): the test's next step then happens with
// the writer demonstrably running in the current phase.
func (w *opWriter) advance(t *testing.T, n int, phase string) {
	t.Helper()
	from := w.attempts()
	waitFor(t, time.Minute, fmt.Sprintf("%d more writer inserts %s", n, phase), func() bool {
		select {
		case <-w.done:
			t.Fatalf("writer stopped %s: %v", phase, w.err)
		default:
		}
		return w.attempts() >= from+n
	})
}

func (w *opWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// total stops the writer and returns how many events it committed.
func (w *opWriter) total(t *testing.T) int {
	t.Helper()
	w.halt()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	n := 0
	for _, s := range w.committed {
		n += s
	}
	return n
}

// checkAllDelivered consumes the writer's topic until every committed event
// (and extra events written to the same topic by the test) is there, then
// checks per key that the first copies come in seq order.
func (w *opWriter) checkAllDelivered(t *testing.T, extra int) []*kgo.Record {
	t.Helper()
	want := w.total(t) + extra
	recs := consumeUpTo(t, []string{topicFor(w.aggType)}, want, time.Minute, 2*time.Second)
	seen := map[string]int{} // key → highest seq seen in first copies
	distinct := map[string]bool{}
	for _, rs := range byPartition(recs) {
		for _, r := range rs {
			var v struct{ Seq int }
			if err := json.Unmarshal(r.Value, &v); err != nil {
				t.Fatalf("payload %q: %v", r.Value, err)
			}
			id := fmt.Sprintf("%s/%d", r.Key, v.Seq)
			if distinct[id] {
				continue // a duplicate (at-least-once)
			}
			distinct[id] = true
			if v.Seq != seen[string(r.Key)]+1 {
				t.Errorf("key %s: first copy of seq %d after seq %d", r.Key, v.Seq, seen[string(r.Key)])
			}
			seen[string(r.Key)] = v.Seq
		}
	}
	if len(distinct) != want {
		var missing []string
		for key, last := range w.committed {
			for seq := 1; seq <= last && len(missing) < 20; seq++ {
				if !distinct[fmt.Sprintf("%s/%d", key, seq)] {
					missing = append(missing, fmt.Sprintf("%s/%d", key, seq))
				}
			}
		}
		t.Fatalf("%d distinct events in Kafka, want %d (committed by the writer); missing (first 20): %v",
			len(distinct), want, missing)
	}
	return recs
}

// consumeUpTo is consumeN that returns what it found when fewer arrive.
func consumeUpTo(t *testing.T, topics []string, want int, timeout, quiet time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		fs := cl.PollFetches(ctx)
		cancel()
		n := len(recs)
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) >= want && len(recs) == n {
			break
		}
	}
	return recs
}

// TestPartitionedOutbox: an outbox partitioned by day, as docs/guide.md
// recommends, is published under its root's name; a partition attached
// while running is covered, and detaching and dropping an old partition
// (retention) loses nothing. A publication without publish_via_partition_root
// is refused with the ALTER PUBLICATION to run.
func TestPartitionedOutbox(t *testing.T) {
	dsn := newDatabase(t)
	exec1(t, dsn, `CREATE TABLE outbox (
		id uuid NOT NULL DEFAULT gen_random_uuid(),
		aggregate_type text NOT NULL, aggregate_id text, event_type text NOT NULL, payload jsonb, tenant text,
		created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	exec1(t, dsn, `CREATE TABLE outbox_old PARTITION OF outbox FOR VALUES FROM ('2000-01-01') TO ('2001-01-01')`)
	exec1(t, dsn, `CREATE TABLE outbox_now PARTITION OF outbox FOR VALUES FROM ('2001-01-01') TO ('2100-01-01')`)
	cfg := testConfig(t, dsn, "public.outbox", "partitioned")
	startConnector(t, cfg)
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ('part', 'old', 'E', '{"seq": 1}', '2000-06-01')`)
	conn := pgConnect(t, dsn)
	var viaRoot bool
	if err := conn.QueryRow(context.Background(), "SELECT pubviaroot FROM pg_publication WHERE pubname = 'partitioned'").Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("publication created without publish_via_partition_root (%v, %v)", viaRoot, err)
	}
	w := startOpWriter(t, dsn, "part")
	w.advance(t, 20, "before the partitions change")
	// Attach a partition while the writer runs and write into it.
	exec1(t, dsn, `ALTER TABLE outbox DETACH PARTITION outbox_now`)
	exec1(t, dsn, `CREATE TABLE outbox_later PARTITION OF outbox FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')`)
	exec1(t, dsn, `ALTER TABLE outbox ATTACH PARTITION outbox_now FOR VALUES FROM ('2001-01-01') TO ('2100-01-01')`)
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ('part', 'later', 'E', '{"seq": 1}', '2150-01-01')`)
	// Retention: detach and drop the old partition, then a fresh one.
	exec1(t, dsn, `ALTER TABLE outbox DETACH PARTITION outbox_old`)
	exec1(t, dsn, `DROP TABLE outbox_old`)
	w.advance(t, 20, "after the old partition was dropped")
	recs := w.checkAllDelivered(t, 2)
	found := map[string]bool{}
	for _, r := range recs {
		found[string(r.Key)] = true
	}
	for _, k := range []string{"old", "later"} {
		if !found[k] {
			t.Errorf("the row in partition %s was not published", k)
		}
	}

	// A publication that exists without the option is refused.
	dsn2 := newDatabase(t)
	exec1(t, dsn2, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
		aggregate_id text, event_type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	exec1(t, dsn2, `CREATE PUBLICATION noroot FOR TABLE outbox WITH (publish = 'insert')`)
	code, out := runBinary(t, time.Minute, nil, "run", "--config", writeConfig(t, yamlFor(t, dsn2, "noroot", "")))
	if code != 1 || !strings.Contains(out, `ALTER PUBLICATION \"noroot\" SET (publish_via_partition_root = true)`) {
		t.Fatalf("exit %d, want 1 with the ALTER PUBLICATION to run:\n%s", code, out)
	}
}

// TestSchemaProblemsBlock: a mapped column dropped while running stops the
// connector (exit 1, naming the column) before anything after it is
// confirmed; after the fix the rows written while it was missing go to the
// dead-letter topic with the reason and everything else is published. An
// unmapped column added while running changes nothing.
func TestSchemaProblemsBlock(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfgPath := writeConfig(t, yamlFor(t, dsn, "schemablock", "outbox: {header_columns: [tenant]}\ndlq: {mode: skip}\n"))
	conn := pgConnect(t, dsn)
	ins := func(seq int, withTenant bool) {
		cols, vals := "aggregate_type, aggregate_id, event_type, payload", fmt.Sprintf(`'sb', 'k', 'E', '{"seq": %d}'`, seq)
		if withTenant {
			cols, vals = cols+", tenant", vals+", 't'"
		}
		if _, err := conn.Exec(context.Background(), "INSERT INTO outbox ("+cols+") VALUES ("+vals+")"); err != nil {
			t.Fatalf("insert: %v", err)
		}
	}
	code, out := runUntilExit(t, cfgPath, time.Minute, func(p *process) {
		ins(1, true)
		exec1(t, dsn, "ALTER TABLE outbox ADD COLUMN note text") // unmapped: keeps flowing
		ins(2, true)
		p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 2)
		exec1(t, dsn, "ALTER TABLE outbox DROP COLUMN tenant")
		ins(3, false)
	})
	if code != 1 || !strings.Contains(out, `column \"tenant\" missing`) || !strings.Contains(out, "ADD COLUMN") {
		t.Fatalf("exit %d, want 1 naming column tenant and the fix:\n%s", code, out)
	}
	// Refused at start while the column is missing.
	if code, out := runBinary(t, time.Minute, nil, "run", "--config", cfgPath); code != 1 || !strings.Contains(out, "tenant") {
		t.Fatalf("start with the column missing: exit %d, want 1 naming it:\n%s", code, out)
	}
	exec1(t, dsn, "ALTER TABLE outbox ADD COLUMN tenant text")
	ins(4, true)
	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	recs := consumeN(t, []string{topicFor("sb")}, 3, time.Minute, 2*time.Second)
	dlq := consumeN(t, []string{dlqFor("schemablock")}, 1, time.Minute, time.Second)
	stopClean(t, p)
	seqs := map[int]bool{}
	for _, r := range recs {
		var v struct{ Seq int }
		_ = json.Unmarshal(r.Value, &v)
		seqs[v.Seq] = true
	}
	if !seqs[1] || !seqs[2] || !seqs[4] || seqs[3] {
		t.Errorf("published seqs %v, want 1, 2 and 4", seqs)
	}
	if len(dlq) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dlq))
	}
	if reason, _ := header(dlq[0], "error"); !strings.Contains(reason, `"tenant"`) || !strings.Contains(string(dlq[0].Value), `"seq": 3`) {
		t.Errorf("dead letter %s with reason %q, want seq 3 and column tenant", dlq[0].Value, reason)
	}
}

// TestStopHonoursDrainTimeout: a stop while the broker is down and the
// producer buffer is full ends after kafka.drain_timeout, confirming nothing
// that was not acknowledged.
func TestStopHonoursDrainTimeout(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("needs a broker the test can stop")
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "drainstop")
	cfg.Kafka.RequestTimeout = 5 * time.Second
	cfg.Kafka.MaxBufferedRecords = 3
	cfg.Kafka.DrainTimeout = 2 * time.Second
	c := startConnector(t, cfg, func(pc *pipeline.Config) { pc.QueueSize = 2 })
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "ds", "k", "E", `{"seq": 0}`) })
	consumeN(t, []string{topicFor("ds")}, 1, time.Minute, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaServer.Stop(ctx); err != nil {
		t.Fatalf("stop kafka: %v", err)
	}
	defer func() {
		if err := kafkaServer.Restart(context.Background()); err != nil {
			t.Errorf("restart kafka: %v", err)
		}
	}()
	before := currentLSN(t, conn)
	for i := 1; i <= 50; i++ {
		committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "ds", "k", "E", fmt.Sprintf(`{"seq": %d}`, i)) })
	}
	// The processor is blocked in Produce once the buffer (3) is full.
	waitFor(t, 30*time.Second, "the producer buffer full", func() bool { return testutil.ToFloat64(c.m.InFlight) >= 3 })
	c.cancel()
	c.cancel = nil
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("stop: %v", err)
		}
	case <-time.After(cfg.Kafka.DrainTimeout + 20*time.Second):
		t.Fatalf("connector still draining %v after the stop (drain_timeout %v)", cfg.Kafka.DrainTimeout+20*time.Second, cfg.Kafka.DrainTimeout)
	}
	if got := slotConfirmed(t, dsn, "drainstop"); got > before {
		t.Errorf("slot confirmed %v past %v, where the unacknowledged events begin", got, before)
	}
}

// TestOutboxLeavesStream: with a writer running, the outbox is removed from
// the publication, dropped and created again, or renamed. Each stops the
// connector (exit 1, saying what happened) before it confirms past an insert
// it could not decode; after the fix a restart publishes every committed
// event, also those PostgreSQL never decoded (read back from the table).
func TestOutboxLeavesStream(t *testing.T) {
	tests := []struct {
		name, say string
		break_    func(t *testing.T, dsn, pub string)
		fix       func(t *testing.T, dsn, pub string)
	}{
		{"removed from publication", "was removed from publication",
			func(t *testing.T, dsn, pub string) { exec1(t, dsn, "ALTER PUBLICATION "+pub+" DROP TABLE outbox") },
			func(t *testing.T, dsn, pub string) { exec1(t, dsn, "ALTER PUBLICATION "+pub+" ADD TABLE outbox") }},
		{"dropped and created again", "was dropped",
			func(t *testing.T, dsn, pub string) {
				exec1(t, dsn, "DROP TABLE outbox")
				createOutbox(t, dsn, "outbox", "jsonb")
			},
			func(t *testing.T, dsn, pub string) { exec1(t, dsn, "ALTER PUBLICATION "+pub+" ADD TABLE outbox") }},
		{"renamed", "was renamed to public.outbox_v2",
			func(t *testing.T, dsn, pub string) { exec1(t, dsn, "ALTER TABLE outbox RENAME TO outbox_v2") },
			func(t *testing.T, dsn, pub string) { exec1(t, dsn, "ALTER TABLE outbox_v2 RENAME TO outbox") }},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dsn := newDatabase(t)
			createOutbox(t, dsn, "outbox", "jsonb")
			slot := fmt.Sprintf("leaves%d", i)
			cfgPath := writeConfig(t, yamlFor(t, dsn, slot, ""))
			var w *opWriter
			code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
				w = startOpWriter(t, dsn, slot) // the slot exists now
				w.advance(t, 20, "before the outbox leaves the stream")
				tc.break_(t, dsn, slot)
			})
			if code != 1 || !strings.Contains(out, tc.say) {
				t.Fatalf("exit %d, want 1 saying %q:\n%s", code, tc.say, out)
			}
			w.advance(t, 10, "in the gap") // the writer goes on into the gap
			tc.fix(t, dsn, slot)
			w.advance(t, 10, "after the fix")
			addr := freeAddr(t)
			p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
			defer func() {
				if t.Failed() {
					t.Logf("first run:\n%s\nafter the fix:\n%s", out, p.output())
				}
			}()
			w.advance(t, 10, "while the connector runs again")
			w.checkAllDelivered(t, 0)
			stopClean(t, p)
		})
	}
}
