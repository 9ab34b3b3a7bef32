package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestBadRowsGoToDeadLetter: rows that can never be published end in the
// dead-letter topic with an error header and their fields, and the stream
// goes on: a good event after each one is delivered.
func TestBadRowsGoToDeadLetter(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A topic whose max.message.bytes is smaller than the broker's.
	adm, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	small := "small.bad." + runID
	maxBytes := "2048"
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, small); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	cfg := testConfig(t, dsn, "public.outbox", "badrows")
	cfg.DLQ.Mode = config.DLQSkip // later events of the aggregate overtake its dead letter
	cfg.Kafka.Topics = map[string]string{"small": small}
	cfg.Outbox.HeaderColumns = []string{"tenant"}
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	good := 0
	goodEvent := func() {
		good++
		committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "good", "g", "Good", fmt.Sprintf(`{"seq": %d}`, good)) })
	}

	committed(t, conn, func(tx pgx.Tx) {
		_, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ('order', NULL, 'NullKey', '{}', 't')`)
		if err != nil {
			t.Fatal(err)
		}
	})
	goodEvent()
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "bad type!", "k", "IllegalTopic", `{}`) })
	goodEvent()
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "small", "k", "TooLarge", `{"blob": "`+strings.Repeat("x", 10_000)+`"}`)
	})
	goodEvent()
	// A mapped column dropped while running is a schema problem, not a bad
	// row: TestSchemaProblemsBlock.

	dlq := consumeN(t, []string{dlqFor("badrows")}, 3, time.Minute, 2*time.Second)
	if len(dlq) != 3 {
		t.Fatalf("%d dead-lettered records, want 3", len(dlq))
	}
	// The dead-letter topic has several partitions: find each by its reason.
	byReason := map[string]*kgo.Record{}
	for _, want := range []string{"aggregate_id is NULL", "not a legal Kafka topic name", "MESSAGE_TOO_LARGE"} {
		for _, r := range dlq {
			if reason, _ := header(r, "error"); strings.Contains(reason, want) {
				byReason[want] = r
			}
		}
		r := byReason[want]
		if r == nil {
			t.Errorf("no dead letter with an error header containing %q", want)
			continue
		}
		if _, ok := header(r, "id"); !ok {
			t.Errorf("dead letter %q lacks the id header", want)
		}
	}
	if big := byReason["MESSAGE_TOO_LARGE"]; big != nil {
		if v, _ := header(big, "topic"); v != small {
			t.Errorf("oversize record's topic header %q, want %q", v, small)
		}
		if len(big.Value) < 10_000 {
			t.Errorf("oversize record's payload not kept in the dead letter (%d bytes)", len(big.Value))
		}
	}
	recs := consumeN(t, []string{topicFor("good")}, good, time.Minute, time.Second)
	if len(recs) != good {
		t.Fatalf("%d good events after the bad rows, want %d", len(recs), good)
	}
	checkKeyOrder(t, recs)
	waitFor(t, 10*time.Second, "dead-letter counter", func() bool { return counterValue(c, "dead_lettered") == 3 })
}

// TestUnknownTopicWithAutoCreateOff: with auto-creation off, an event for a
// topic that does not exist is dead-lettered; the stream goes on.
func TestUnknownTopicWithAutoCreateOff(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("needs its own broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := testenv.StartKafka(ctx, testenv.KafkaOptions{Properties: map[string]string{"auto.create.topics.enable": "false"}})
	if err != nil {
		t.Fatalf("start kafka: %v", err)
	}
	defer k.Close()
	adm, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopics(ctx, 1, 1, nil, topicFor("exists"), dlqFor("noauto")); err != nil {
		t.Fatal(err)
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "noauto")
	cfg.DLQ.Mode = config.DLQSkip // later events of the aggregate overtake its dead letter
	cfg.Kafka.Brokers = k.Brokers()
	cfg.Kafka.UnknownTopicTimeout = 5 * time.Second // the topic never appears: no need to wait the default 2m
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "missing", "k", "E", `{}`) })
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "exists", "k", "E", `{}`) })

	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.ConsumeTopics(dlqFor("noauto"), topicFor("exists")),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]*kgo.Record{}
	for len(got) < 2 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[r.Topic] = r })
	}
	d := got[dlqFor("noauto")]
	if d == nil || got[topicFor("exists")] == nil {
		t.Fatalf("records by topic: %v; want one dead letter and the next event delivered", got)
	}
	if e, _ := header(d, "error"); !strings.Contains(e, "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Errorf("error header %q", e)
	}
}

func counterValue(c *connector, which string) float64 {
	mfs, _ := c.m.Registry.Gather()
	for _, mf := range mfs {
		if strings.Contains(mf.GetName(), which) && len(mf.GetMetric()) > 0 && mf.GetMetric()[0].GetCounter() != nil {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// runUntilExit starts the binary and waits for it to exit by itself.
func runUntilExit(t *testing.T, cfgPath string, timeout time.Duration, whileRunning func(p *process)) (int, string) {
	t.Helper()
	addr := freeAddr(t)
	extra := fmt.Sprintf("OUTBOX_CDC_HTTP_LISTEN=%s", addr)
	p := startProc(t, cfgPath, addr, true, extra)
	whileRunning(p)
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("connector still running %v after the fault:\n%s", timeout, p.output())
	}
	code := 0
	if p.cmd.ProcessState != nil {
		code = p.cmd.ProcessState.ExitCode()
	}
	return code, p.output()
}

// TestSlotProblemsAreLoud: a dropped publication, a dropped slot and an
// invalidated slot each stop the connector with exit 1 and a message that
// says what happened and what to do.
func TestSlotProblemsAreLoud(t *testing.T) {
	t.Run("publication dropped", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		code, out := runUntilExit(t, writeConfig(t, yamlFor(t, dsn, "pubdrop", "")), time.Minute, func(*process) {
			exec1(t, dsn, "DROP PUBLICATION pubdrop")
			exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('x', 'k', 'E', '{}')`)
		})
		// Up to 17 the walsender fails on the missing publication when it
		// decodes the insert, unless the guard (which reads the publication
		// every 100 ms) saw it first; from 18 on pgoutput only warns and
		// sends nothing, and the guard stops the connector (recording the
		// gap) with its own fix. Either stop names the publication and a fix.
		walsender := strings.Contains(out, `publication \"pubdrop\" does not exist`) && strings.Contains(out, "drop the slot, restart")
		guard := strings.Contains(out, "publication pubdrop was dropped") && strings.Contains(out, "ALTER PUBLICATION")
		if serverMajor(t, dsn) >= 18 {
			walsender = false
		}
		if code != 1 || !walsender && !guard {
			t.Fatalf("exit %d, want 1 naming the publication and the fix (the walsender's, or from 18 only the guard's):\n%s", code, out)
		}
	})
	t.Run("slot dropped", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		cfgPath := writeConfig(t, yamlFor(t, dsn, "slotdrop", ""))
		code, out := runUntilExit(t, cfgPath, time.Minute, func(p *process) {
			// One event delivered and checkpointed: the runbook names when
			// the last delivered transaction committed.
			exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('x', 'k', 'E', '{}')`)
			p.waitMetric(t, time.Minute, "outbox_cdc_checkpoint_lsn", 1)
			// A slot can only be dropped while no walsender holds it: cut the
			// connection and drop it before the connector reconnects.
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				exec1(t, dsn, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'slotdrop' AND active_pid IS NOT NULL")
				var dropped bool
				_ = pgConnect(t, dsn).QueryRow(context.Background(), `SELECT count(*) = 1 FROM (SELECT pg_drop_replication_slot(slot_name)
					FROM pg_replication_slots WHERE slot_name = 'slotdrop' AND NOT active) d`).Scan(&dropped)
				if dropped {
					return
				}
				time.Sleep(5 * time.Millisecond) // retry interval: the loop races the reconnect, with a deadline
			}
			t.Fatal("could not drop the slot")
		})
		if code != 1 || !strings.Contains(out, "slotdrop") || !strings.Contains(out, "does not exist") && !strings.Contains(out, "was dropped") {
			t.Fatalf("exit %d, want 1 saying the slot is gone:\n%s", code, out)
		}
		if want := "outbox-cdc verify --config " + cfgPath + " --repair --since "; !strings.Contains(out, want) {
			t.Fatalf("the slot-loss error does not give the repair command %q:\n%s", want, out)
		}
	})
	t.Run("slot invalidated", func(t *testing.T) {
		if pgServer.External() {
			t.Skip("needs its own PostgreSQL")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "32MB"}})
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		dsn := pg.DSN("postgres")
		createOutbox(t, dsn, "outbox", "jsonb")
		exec1(t, dsn, "CREATE TABLE busy (id int, pad text)")
		// Kafka that never answers: the event stays in flight, so the slot
		// cannot be confirmed past it while WAL piles up.
		yaml := fmt.Sprintf("postgres: {dsn: %q, slot: lost, publication: lost, heartbeat_interval: 0s}\nkafka: {brokers: [%s]}\nhttp: {listen: ''}\n",
			dsn, freeAddr(t))
		code, out := runUntilExit(t, writeConfig(t, yaml), 2*time.Minute, func(p *process) {
			exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('x', 'k', 'E', '{}')`)
			p.waitMetric(t, time.Minute, "outbox_cdc_inflight_events", 1) // the event is held, unacknowledged
			for i := 0; i < 12; i++ {
				exec1(t, dsn, "INSERT INTO busy SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
			}
			exec1(t, dsn, "CHECKPOINT")
		})
		if code != 1 || !strings.Contains(out, "invalidated") {
			t.Fatalf("exit %d, want 1 saying the slot was invalidated:\n%s", code, out)
		}
	})
}

// TestOutboxTableRenamed: renaming the outbox table while running stops the
// connector with the fix; restarting with the old name is refused.
func TestOutboxTableRenamed(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfgPath := writeConfig(t, yamlFor(t, dsn, "renamed", ""))
	code, out := runUntilExit(t, cfgPath, time.Minute, func(p *process) {
		exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('r', 'k', 'E', '{}')`)
		p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 1) // delivered under the old name
		exec1(t, dsn, "ALTER TABLE outbox RENAME TO outbox_v2")
		exec1(t, dsn, `INSERT INTO outbox_v2 (aggregate_type, aggregate_id, event_type, payload) VALUES ('r', 'k', 'E', '{}')`)
	})
	if code != 1 || !strings.Contains(out, "renamed") || !strings.Contains(out, "outbox.table") {
		t.Fatalf("exit %d, want 1 saying the table was renamed and what to set:\n%s", code, out)
	}
	code, out = runBinary(t, time.Minute, nil, "run", "--config", cfgPath)
	if code != 1 || !strings.Contains(out, "does not exist") {
		t.Fatalf("restart: exit %d, want 1 saying the table is missing:\n%s", code, out)
	}
}

// TestActiveStandby: two connectors on one slot; the second waits and takes
// over when the first is killed; nothing is lost.
func TestActiveStandby(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, "standby")
	cfgPath := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: standby, publication: standby, reconnect_backoff_max: 1s}\nkafka: {brokers: [%s], topic: %q}\nhttp: {listen: ''}\n",
		dsn, strings.Join(kafkaServer.Brokers(), ", "), topicTemplate))
	addrA := freeAddr(t)
	a := startProc(t, cfgPath, addrA, true, "OUTBOX_CDC_HTTP_LISTEN="+addrA)
	addrB := freeAddr(t)
	b := startProc(t, cfgPath, addrB, false, "OUTBOX_CDC_HTTP_LISTEN="+addrB)
	waitFor(t, 30*time.Second, "standby's HTTP endpoint", func() bool { return healthy(addrB) })
	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "standby", 0, 50)
	consumeN(t, []string{topicFor("standby")}, 50, time.Minute, 0)
	if ready(addrB) {
		t.Fatal("the standby reports ready while the active connector streams")
	}
	killed := time.Now()
	a.kill()
	waitFor(t, 30*time.Second, "standby takes over", func() bool { return ready(addrB) })
	t.Logf("standby took over %v after the kill", time.Since(killed).Round(time.Millisecond))
	writeEvents(t, conn, "standby", 50, 100)
	recs := consumeN(t, []string{topicFor("standby")}, 100, time.Minute, time.Second)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Value)] = true
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct events, want 100", len(seen))
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
}

func ready(addr string) bool { return get200(addr, "/readyz") }

func healthy(addr string) bool { return get200(addr, "/healthz") }

func get200(addr, path string) bool {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
