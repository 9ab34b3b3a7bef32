package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// Exactly-once mode (kafka.delivery exactly_once) against the real broker:
// names of positions topics are per test, so tests never share a position.

func positionsFor(slot string) string { return "positions." + slot + "." + runID }

// eosConfig writes the configuration of an exactly_once connector on slot
// that serves HTTP on addr.
func eosConfig(t *testing.T, dsn, slot, addr string) string {
	return writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %s
  slot: %s
  publication: %s
  status_interval: 100ms
  reconnect_backoff_max: 1s
outbox:
  table: public.outbox
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
  topic_partitions: 3
  delivery: exactly_once
  transaction_interval: 5ms
  positions_topic: %s
http:
  listen: %s
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, positionsFor(slot), addr))
}

// readIsolated reads topics from the start up to their end offsets at the
// time of the call (the last stable offset for read_committed) and returns
// the records, in per-partition offset order.
func readIsolated(t *testing.T, committed bool, topics ...string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	adm := newAdmin(t)
	list := adm.ListEndOffsets
	iso := kgo.ReadUncommitted()
	if committed {
		list, iso = adm.ListCommittedOffsets, kgo.ReadCommitted()
	}
	ends, err := list(ctx, topics...)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	want := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			if want[o.Topic] == nil {
				want[o.Topic] = map[int32]int64{}
			}
			want[o.Topic][o.Partition] = o.Offset - 1
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(iso), kgo.KeepControlRecords(),
		kgo.FetchMaxBytes(64<<20))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	left := func() int {
		n := 0
		for _, ps := range want {
			n += len(ps)
		}
		return n
	}
	for left() > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %v: %v; %d partitions not read to their end", topics, ctx.Err(), left())
		}
		fs.EachRecord(func(r *kgo.Record) {
			last, ok := want[r.Topic][r.Partition]
			if !ok || r.Offset > last {
				return // beyond the end read at the start
			}
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
			if r.Offset == last {
				delete(want[r.Topic], r.Partition)
			}
		})
	}
	return recs
}

// eosEvent is what the writers put in each payload: the writer, its
// transaction and the event's place in it.
type eosEvent struct {
	W, Txn, I, N int
}

// checkTransactions checks what a read_committed consumer saw: no event
// twice, per key in order, and with whole every PostgreSQL transaction whole
// or absent. It returns the transactions seen, by writer, and how many were
// seen in part.
func checkTransactions(t *testing.T, recs []*kgo.Record, whole bool) (map[int]map[int]bool, int) {
	t.Helper()
	count := map[[2]int]int{}
	size := map[[2]int]int{}
	seen := map[eosEvent]bool{}
	lastByKey := map[string]int{}
	for _, r := range recs {
		var e eosEvent
		if err := json.Unmarshal(r.Value, &e); err != nil {
			t.Fatalf("value %s: %v", r.Value, err)
		}
		if seen[e] {
			t.Errorf("duplicate for read_committed: %+v", e)
		}
		seen[e] = true
		k := [2]int{e.W, e.Txn}
		count[k]++
		size[k] = e.N
		key := string(r.Key)
		if prev, ok := lastByKey[key]; ok && e.Txn <= prev {
			t.Errorf("key %s: transaction %d after %d", key, e.Txn, prev)
		}
		lastByKey[key] = e.Txn
	}
	txns := map[int]map[int]bool{}
	partial := 0
	for k, n := range count {
		if n != size[k] {
			partial++
			if whole {
				t.Errorf("writer %d transaction %d: %d of its %d events visible to read_committed", k[0], k[1], n, size[k])
			}
		}
		if txns[k[0]] == nil {
			txns[k[0]] = map[int]bool{}
		}
		txns[k[0]][k[1]] = true
	}
	return txns, partial
}

// eosWriters writes multi-row transactions (n rows, one aggregate each,
// spread over the partitions) until stop is closed, at least min each; it
// returns the last transaction each writer committed.
func eosWriters(ctx context.Context, t *testing.T, dsn, aggType string, writers, min, n int, stop <-chan struct{}, written *atomic.Int64) func() []int {
	var wg sync.WaitGroup
	last := make([]int, writers)
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for txn := 1; ; txn++ {
				if txn > min {
					select {
					case <-stop:
						return
					default:
					}
				}
				b := &pgx.Batch{}
				for i := range n {
					v, _ := json.Marshal(eosEvent{W: w, Txn: txn, I: i, N: n})
					b.Queue(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'E', $3)`,
						aggType, fmt.Sprintf("w%d-%d", w, i), string(v))
				}
				tx, err := conn.Begin(ctx)
				if err == nil {
					err = tx.SendBatch(ctx, b).Close()
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
				last[w] = txn
				written.Add(1)
				time.Sleep(3 * time.Millisecond) // pacing: a steady stream of transactions
			}
		})
	}
	return func() []int {
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("writer: %v", err)
		}
		return last
	}
}

// checkAllOnce waits until read_committed sees as many records as the
// writers committed events (last: each writer's last transaction, of rows
// events each), then checks every transaction is there once and whole. It
// returns the transactions written and the records seen.
func checkAllOnce(t *testing.T, topic string, last []int, rows int) (total, seen int) {
	t.Helper()
	for _, n := range last {
		total += n
	}
	waitFor(t, 2*time.Minute, "every transaction visible to read_committed", func() bool {
		return len(readIsolated(t, true, topic)) >= total*rows
	})
	recs := readIsolated(t, true, topic)
	txns, _ := checkTransactions(t, recs, true)
	for w, n := range last {
		for txn := 1; txn <= n; txn++ {
			if !txns[w][txn] {
				t.Errorf("writer %d transaction %d lost", w, txn)
			}
		}
	}
	if len(recs) != total*rows {
		t.Errorf("read_committed sees %d records, want exactly %d", len(recs), total*rows)
	}
	return total, len(recs)
}

// TestExactlyOnceKill9 kills the connector with SIGKILL three times, each
// time after it committed some events, while writers commit multi-row
// transactions. While it is down, read_committed sees no event twice; at the
// end it sees every transaction once, whole, per key in order, and the last
// process started from the position committed to Kafka.
func TestExactlyOnceKill9(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "eoskill")
	cfgPath := eosConfig(t, dsn, "eoskill", addr)
	p := startProcess(t, cfgPath, addr)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const writers, min, rows = 3, 150, 4
	var written atomic.Int64
	stop := make(chan struct{})
	// An aggregate type (a topic) of its own: -count=N runs share runID.
	agg := fmt.Sprintf("eoskill%d", dbCounter.Add(1))
	wait := eosWriters(ctx, t, dsn, agg, writers, min, rows, stop, &written)
	topic := topicFor(agg)
	for k := 1; k <= 3; k++ {
		at := int64(k * writers * min / 4)
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d transactions written before kill %d", at, k), func() bool { return written.Load() >= at })
		// Killed after it committed some: the next one starts from there.
		p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 40)
		p.kill()
		// Down: what read_committed sees is never seen twice. Each
		// partition shows a transaction once its commit marker is written
		// there, so across partitions a transaction may show in part for a
		// moment (the final check requires every one whole).
		if _, partial := checkTransactions(t, readIsolated(t, true, topic), false); partial > 0 {
			t.Logf("kill %d: %d transactions visible in part across partitions while the connector is down", k, partial)
		}
		p = startProcess(t, cfgPath, addr)
	}
	close(stop)
	total, committed := checkAllOnce(t, topic, wait(), rows)
	t.Logf("%d transactions (%d events) written; read_committed sees %d records, read_uncommitted %d, over 3 kills",
		total, total*rows, committed, len(readIsolated(t, false, topic)))
	stopClean(t, p)
	// The log is complete once the process exited.
	if out := p.output(); !strings.Contains(out, "last committed position") {
		t.Errorf("the last restart did not read the committed position (%s, %d bytes, err %v):\n%s", p.log, len(out), p.err, out)
	}
}

// TestExactlyOnceFencing: standby takeover under load. A second instance
// waits while the first streams; the first freezes (a zombie: SIGSTOP) and
// loses its replication connection, the second takes the slot and the
// transactional id over, which fences the first: once it runs again it
// exits 1 with the fencing message and commits nothing more. Every
// transaction is delivered once, whole, as read_committed sees it.
func TestExactlyOnceFencing(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, "eosfence")
	conf := func(addr string) string { return eosConfig(t, dsn, "eosfence", addr) }
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := startProcess(t, conf(addrA), addrA)
	b := startProc(t, conf(addrB), addrB, false)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const writers, min, rows = 2, 300, 3
	var written atomic.Int64
	stop := make(chan struct{})
	agg := fmt.Sprintf("eosfence%d", dbCounter.Add(1))
	wait := eosWriters(ctx, t, dsn, agg, writers, min, rows, stop, &written)
	a.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 60)

	// The standby waits, without fencing the active instance.
	select {
	case <-a.done:
		t.Fatalf("the active instance stopped while the standby waited: %v\n%s", a.err, a.output())
	case <-time.After(3 * time.Second): // several of the standby's slot checks pass
	}
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	exec1(t, dsn, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'eosfence' AND active")
	b.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 30)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatalf("the fenced instance did not stop:\n%s", a.output())
	}
	var ee interface{ ExitCode() int }
	if !errors.As(a.err, &ee) || ee.ExitCode() != 1 || !strings.Contains(a.output(), "fenced: another outbox-cdc instance") {
		t.Fatalf("first instance: %v, want exit 1 with the fencing message:\n%s", a.err, a.output())
	}
	for _, line := range strings.Split(a.output(), "\n") {
		if strings.Contains(line, "connector failed") {
			t.Logf("first instance: %s", line)
		}
	}
	close(stop)
	total, committed := checkAllOnce(t, topicFor(agg), wait(), rows)
	t.Logf("%d transactions over the takeover; read_committed %d records, read_uncommitted %d",
		total, committed, len(readIsolated(t, false, topicFor(agg))))
	stopClean(t, b)
}

// TestExactlyOnceRefusedRecord: the broker refuses a record the size check
// let through (the topic's limit was lowered after it was read): the Kafka
// transaction is aborted and done again with the record dead-lettered in
// it. read_committed sees each other event once and the dead letter;
// read_uncommitted also sees the aborted attempt's copies, which is why
// consumers must read committed.
func TestExactlyOnceRefusedRecord(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "text")
	cfg := testConfig(t, dsn, "public.outbox", "eosrefused")
	cfg.Kafka.Delivery, cfg.Kafka.PositionsTopic = "exactly_once", positionsFor("eosrefused")
	topic := topicFor("refused")
	createTopic(t, topic, 4)
	c := startConnector(t, cfg)

	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('refused', 'first', 'E', 'small')`)
	waitFor(t, time.Minute, "first event committed", func() bool { return len(readIsolated(t, true, topic)) == 1 })

	// The sink read the 1 MB default; the broker now refuses more than 2 KB.
	adm := newAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limit := "2048"
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, topic); err != nil {
		t.Fatalf("alter %s: %v", topic, err)
	}
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'refused', 'k' || i, 'E', CASE WHEN i = 5 THEN repeat('x', 10000) ELSE 'small' END FROM generate_series(1, 9) i`)

	waitFor(t, time.Minute, "the transaction committed", func() bool { return len(readIsolated(t, true, topic)) >= 9 })
	committed := readIsolated(t, true, topic)
	if len(committed) != 9 {
		t.Fatalf("read_committed sees %d records in %s, want 9", len(committed), topic)
	}
	for _, r := range committed {
		if len(r.Value) > 100 {
			t.Fatalf("the refused record reached %s", topic)
		}
	}
	dead := readIsolated(t, true, dlqFor("eosrefused"))
	if len(dead) != 1 || len(dead[0].Value) != 10000 {
		t.Fatalf("dead-letter topic holds %d records, want the refused one", len(dead))
	}
	if v, _ := header(dead[0], "error"); !strings.Contains(v, "max.message.bytes 2048") {
		t.Errorf("dead letter's error header %q", v)
	}
	all := readIsolated(t, false, topic)
	t.Logf("read_committed %d, read_uncommitted %d records", len(committed), len(all))
	if len(all) <= len(committed) {
		t.Errorf("read_uncommitted sees %d records, read_committed %d: the aborted attempt should be in the log", len(all), len(committed))
	}
	waitFor(t, 30*time.Second, "refusal logged", func() bool { return c.logged("kafka transaction") || c.logged("dead-lettering") })
}

// TestExactlyOncePositionsTopicPolicy: a positions topic that deletes old
// records is a prerequisite error naming the fix.
func TestExactlyOncePositionsTopicPolicy(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "eospolicy")
	cfg.Kafka.Delivery, cfg.Kafka.PositionsTopic = "exactly_once", positionsFor("eospolicy")
	createTopic(t, cfg.Kafka.PositionsTopic, 1) // cleanup.policy delete, the broker default
	err := runOnce(t, cfg)
	var pre *fault.PrerequisiteError
	if !errors.As(err, &pre) || !strings.Contains(pre.Error(), "cleanup.policy=compact") {
		t.Fatalf("run: %v, want a prerequisite error naming cleanup.policy=compact", err)
	}
}

// runOnce runs the pipeline in-process until it returns (an error at start
// is expected), at most a minute.
func runOnce(t *testing.T, cfg *config.Config) error {
	t.Helper()
	pc, err := cli.PipelineConfig(cfg)
	if err != nil {
		t.Fatalf("pipeline config: %v", err)
	}
	p, err := pipeline.New(pc, metrics.New(), slog.New(slog.NewTextHandler(testWriter{t, nil}, nil)))
	if err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("the pipeline ran until the deadline: %v", err)
	}
	return err
}
