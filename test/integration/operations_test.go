package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

func writeEvents(t *testing.T, conn *pgx.Conn, aggType string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		committed(t, conn, func(tx pgx.Tx) {
			insert(t, tx, "outbox", aggType, fmt.Sprintf("k%d", i%4), "E", fmt.Sprintf(`{"seq": %d}`, i))
		})
	}
}

func checkpointLSN(t *testing.T, conn *pgx.Conn, slot string) lsn.LSN {
	t.Helper()
	var s string
	err := conn.QueryRow(context.Background(), "SELECT lsn::text FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&s)
	if err != nil {
		return 0
	}
	l, _ := lsn.Parse(s)
	return l
}

// yamlFor is a config file for the binary on the shared servers.
func yamlFor(t *testing.T, dsn, slot, extra string) string {
	dropSlotAtEnd(t, dsn, slot)
	return fmt.Sprintf("postgres: {dsn: %q, slot: %s, publication: %s}\nkafka: {brokers: [%s], dlq_topic: %s, topic: %q}\nhttp: {listen: ''}\n%s",
		dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, extra)
}

// TestCheckpointSkipsAfterPostgresCrash: a PostgreSQL crash moves the slot
// back to the position it last saved; the checkpoint keeps the connector from
// publishing again what was acknowledged after that.
func TestCheckpointSkipsAfterPostgresCrash(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs a PostgreSQL the test can crash")
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "ckpt")
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	if _, err := conn.Exec(context.Background(), "CHECKPOINT"); err != nil { // the slot's state on disk is from here
		t.Fatal(err)
	}
	// Whether PostgreSQL writes the slot to disk again before the crash
	// depends on its own timing (a confirmation that also moves restart_lsn
	// saves it at once). A copy of the slot as it is now stands in for the
	// state on disk when the crash alone does not take the slot back.
	exec1(t, dsn, "SELECT pg_copy_logical_replication_slot('ckpt', 'ckpt_early')")
	dropSlotAtEnd(t, dsn, "ckpt_early")
	writeEvents(t, conn, "ckpt", 0, 100)
	consumeN(t, []string{topicFor("ckpt")}, 100, time.Minute, 0)
	end := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "checkpoint saved", func() bool { return checkpointLSN(t, conn, "ckpt") >= end })
	c.stop(t)
	before := slotConfirmed(t, dsn, "ckpt")

	if err := pgServer.Crash(); err != nil {
		t.Fatalf("crash: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pgServer.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	after := slotConfirmed(t, dsn, "ckpt")
	t.Logf("slot confirmed %v before the crash, %v after", before, after)
	if after >= before {
		t.Logf("the crash did not take the slot back; putting back the copy made before the events")
		dropReleasedSlot(t, dsn, "ckpt")
		exec1(t, dsn, "SELECT pg_copy_logical_replication_slot('ckpt_early', 'ckpt')")
		after = slotConfirmed(t, dsn, "ckpt")
	}
	if after >= before {
		t.Fatalf("the slot did not move back (%v -> %v): this test cannot show the checkpoint at work", before, after)
	}

	startConnector(t, cfg)
	conn = pgConnect(t, dsn)
	writeEvents(t, conn, "ckpt", 100, 150)
	recs := consumeN(t, []string{topicFor("ckpt")}, 150, time.Minute, 2*time.Second)
	if len(recs) != 150 {
		t.Fatalf("%d records after the crash, want exactly 150 (nothing republished)", len(recs))
	}
	checkKeyOrder(t, recs)
}

// TestReplayRange republishes an exact range to prefixed topics while the
// connector runs, and refuses an LSN the slot no longer retains.
func TestReplayRange(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "replay")
	cfg.Postgres.Retain = "1GB"
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)

	writeEvents(t, conn, "replayed", 0, 10) // before the range
	from := currentLSN(t, conn)
	writeEvents(t, conn, "replayed", 10, 50)
	to := currentLSN(t, conn)
	writeEvents(t, conn, "replayed", 50, 70) // after the range
	orig := consumeN(t, []string{topicFor("replayed")}, 70, time.Minute, 0)
	want := map[string]bool{}
	for _, r := range orig {
		var v struct{ Seq int }
		_ = json.Unmarshal(r.Value, &v)
		if v.Seq >= 10 && v.Seq < 50 {
			id, _ := header(r, "id")
			want[id] = true
		}
	}

	cfgPath := writeConfig(t, yamlFor(t, dsn, "replay", ""))
	code, out := runBinary(t, 2*time.Minute, nil, "replay", "--config", cfgPath,
		"--from-lsn", from.String(), "--to-lsn", to.String(), "--topic-prefix", "again.")
	if code != 0 || !strings.Contains(out, "replay done: 40 events") {
		t.Fatalf("replay: exit %d, want 0 and 40 events:\n%s", code, out)
	}
	recs := consumeN(t, []string{"again." + topicFor("replayed")}, 40, time.Minute, 2*time.Second)
	if len(recs) != 40 {
		t.Fatalf("%d replayed records, want exactly 40", len(recs))
	}
	for _, r := range recs {
		if id, _ := header(r, "id"); !want[id] {
			t.Errorf("replayed event %s is outside the range", id)
		}
	}
	checkKeyOrder(t, recs)

	code, out = runBinary(t, time.Minute, nil, "replay", "--config", cfgPath, "--from-lsn", "0/10")
	if code != 1 || !strings.Contains(out, "oldest replayable LSN") {
		t.Fatalf("replay below the window: exit %d, want 1 naming the oldest replayable LSN:\n%s", code, out)
	}
}

// TestQuietOutboxBoundedRetention: with no outbox inserts and heavy writes to
// another table, the slot's retained WAL stays bounded.
func TestQuietOutboxBoundedRetention(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, "CREATE TABLE busy (id int, pad text)")
	cfg := testConfig(t, dsn, "public.outbox", "quiet")
	cfg.Postgres.HeartbeatInterval = 200 * time.Millisecond
	c := startConnector(t, cfg, func(pc *pipeline.Config) { pc.MonitorInterval = 500 * time.Millisecond })
	conn := pgConnect(t, dsn)
	ctx := context.Background()

	start := currentLSN(t, conn)
	for i := 0; i < 16; i++ {
		if _, err := conn.Exec(ctx, "INSERT INTO busy SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g"); err != nil {
			t.Fatal(err)
		}
	}
	written := int64(currentLSN(t, conn) - start)
	const bound = 16 << 20
	var retained int64
	waitFor(t, 60*time.Second, "retained WAL to fall below 16 MiB", func() bool {
		// A checkpoint logs the running transactions, which lets the slot's
		// restart_lsn move once the confirmed position passes them.
		_, _ = conn.Exec(ctx, "CHECKPOINT")
		var r int64
		if err := conn.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots
			WHERE slot_name = 'quiet'`).Scan(&r); err != nil {
			t.Fatal(err)
		}
		retained = r
		return r < bound
	})
	t.Logf("wrote %d MiB of WAL with a quiet outbox; the slot retains %d KiB", written>>20, retained>>10)
	if written < 4*bound {
		t.Fatalf("only %d bytes of WAL written; the test needs more to mean anything", written)
	}
	waitFor(t, 10*time.Second, "retained WAL metric", func() bool {
		v := testutil.ToFloat64(c.m.RetainedWAL)
		return v > 0 && v < bound
	})
}

// TestSnapshotModes: none publishes only what is committed after the slot
// is created; pending first publishes the matching rows already there, with
// no gap and no duplicate at the cut-over, and never again after a restart.
func TestSnapshotModes(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "snapnone", 0, 5) // before the slot exists
		startConnector(t, testConfig(t, dsn, "public.outbox", "snapnone"))
		writeEvents(t, conn, "snapnone", 5, 8)
		recs := consumeN(t, []string{topicFor("snapnone")}, 3, time.Minute, 2*time.Second)
		if len(recs) != 3 {
			t.Fatalf("%d records, want exactly the 3 written after the start", len(recs))
		}
	})
	t.Run("pending with a filter", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		exec1(t, dsn, "ALTER TABLE outbox ADD COLUMN status text NOT NULL DEFAULT 'PENDING'")
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "snappending", 0, 5)
		exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status)
			VALUES ('snappending', 'old', 'E', '{"seq": -1}', 'SENT'), ('snappending', 'old', 'E', '{"seq": -2}', 'SENT')`)
		cfg := testConfig(t, dsn, "public.outbox", "snappending")
		cfg.Snapshot.Mode, cfg.Snapshot.Filter = "pending", "status = 'PENDING'"

		// Writers run while the slot is created: each row must come exactly once.
		// The writer stops between inserts, never inside one: a cancelled
		// INSERT may still commit after the count below was taken.
		var (
			written atomic.Int64
			stop    atomic.Bool
			werr    error // read after writerDone is closed
		)
		cancel := func() { stop.Store(true) }
		defer cancel()
		writerDone := make(chan struct{})
		go func() {
			defer close(writerDone)
			ctx, done := context.WithTimeout(context.Background(), 2*time.Minute)
			defer done()
			w, err := pgx.Connect(ctx, dsn)
			if err != nil {
				werr = err
				return
			}
			defer w.Close(context.Background())
			for !stop.Load() {
				if _, err := w.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('snappending', 'live', 'E', jsonb_build_object('seq', $1::int))`, 1000+written.Load()); err != nil {
					werr = err
					return
				}
				written.Add(1)
				time.Sleep(2 * time.Millisecond) // pacing: a steady trickle of inserts
			}
		}()
		writing := func(n int64) func() bool {
			return func() bool {
				select {
				case <-writerDone: // failed: reported below
					return true
				default:
				}
				return written.Load() >= n
			}
		}
		// The writer is under way before the slot is created and goes on
		// after the stream started, so its rows span the cut-over.
		waitFor(t, 30*time.Second, "the concurrent writer's first insert", writing(1))
		c := startConnector(t, cfg)
		waitFor(t, 30*time.Second, "20 inserts after the stream started", writing(written.Load()+20))
		cancel()
		<-writerDone
		if werr != nil {
			t.Fatalf("concurrent writer: %v", werr)
		}
		if written.Load() == 0 {
			t.Fatal("the concurrent writer wrote nothing")
		}
		// Count what committed.
		var live int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE aggregate_id = 'live'").Scan(&live); err != nil {
			t.Fatal(err)
		}
		want := 5 + live
		recs := consumeN(t, []string{topicFor("snappending")}, want, time.Minute, 2*time.Second)
		seen := map[string]int{}
		for _, r := range recs {
			seen[string(r.Value)]++
		}
		if len(recs) != want || len(seen) != want {
			t.Fatalf("%d records (%d distinct), want exactly %d: 5 pending rows and %d written during the start",
				len(recs), len(seen), want, live)
		}
		for v := range seen {
			if strings.Contains(v, "-1") || strings.Contains(v, "-2") {
				t.Errorf("a SENT row was published: %s", v)
			}
		}
		if got := testutil.ToFloat64(c.m.SnapshotEvents); got < 5 {
			t.Errorf("snapshot_events_total = %v, want at least 5", got)
		}
		var done2 bool
		if err := conn.QueryRow(context.Background(), "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = 'snappending'").Scan(&done2); err != nil || !done2 {
			t.Fatalf("snapshot_done = %v (%v), want true", done2, err)
		}
		c.stop(t)
		startConnector(t, cfg) // must not take the snapshot again
		writeEvents(t, conn, "snappending", 100, 101)
		recs = consumeN(t, []string{topicFor("snappending")}, want+1, time.Minute, 2*time.Second)
		if len(recs) != want+1 {
			t.Fatalf("%d records after a restart, want %d (no second snapshot)", len(recs), want+1)
		}
	})
}

// TestStatusCommand checks `outbox-cdc status --json`.
func TestStatusCommand(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "status")
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "status", 0, 3)
	consumeN(t, []string{topicFor("status")}, 3, time.Minute, 0)
	end := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "checkpoint", func() bool { return checkpointLSN(t, conn, "status") >= end })

	cfgPath := writeConfig(t, yamlFor(t, dsn, "status", ""))
	code, out := runBinary(t, time.Minute, nil, "status", "--config", cfgPath, "--json", "--lsn", end.String())
	if code != 0 {
		t.Fatalf("status: exit %d:\n%s", code, out)
	}
	var st struct {
		Slot         string   `json:"slot"`
		Exists       bool     `json:"exists"`
		Active       bool     `json:"active"`
		ActivePID    int      `json:"active_pid"`
		Confirmed    lsn.LSN  `json:"confirmed_lsn"`
		Restart      lsn.LSN  `json:"restart_lsn"`
		Current      lsn.LSN  `json:"current_wal_lsn"`
		Retained     int64    `json:"retained_wal_bytes"`
		Checkpoint   *lsn.LSN `json:"checkpoint_lsn"`
		WALStatus    string   `json:"wal_status"`
		Covers       *bool    `json:"replay_window_covers"`
		OldestReplay lsn.LSN  `json:"oldest_replayable_lsn"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if !st.Exists || !st.Active || st.ActivePID == 0 || st.Slot != "status" || st.WALStatus != "reserved" {
		t.Errorf("status %+v: want an existing, active slot", st)
	}
	if st.Confirmed == 0 || st.Restart == 0 || st.Current < st.Confirmed || st.Retained <= 0 {
		t.Errorf("positions %+v look wrong", st)
	}
	if st.Checkpoint == nil || *st.Checkpoint < end {
		t.Errorf("checkpoint %v, want at least %v", st.Checkpoint, end)
	}
	if st.Covers == nil || *st.Covers != (end >= st.OldestReplay) {
		t.Errorf("replay_window_covers = %v for %v with oldest %v", st.Covers, end, st.OldestReplay)
	}
	code, out = runBinary(t, time.Minute, nil, "status", "--config", writeConfig(t, yamlFor(t, dsn, "nosuchslot", "")))
	if code != 1 || !strings.Contains(out, "does not exist") {
		t.Errorf("status of a missing slot: exit %d:\n%s", code, out)
	}
}

// TestTablelessOutbox: transactional logical messages with the configured
// prefix are events; rolled-back ones are not; malformed ones go to the DLQ.
func TestTablelessOutbox(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	if major := serverMajor(t, dsn); major < 14 {
		// pgoutput sends messages from 14 on: the connector refuses at start.
		code, out := runBinary(t, time.Minute, nil, "run", "--config",
			writeConfig(t, yamlFor(t, dsn, "tableless", "outbox: {table: public.outbox, message_prefix: outbox}")))
		if code != 1 || !strings.Contains(out, "outbox.message_prefix needs PostgreSQL 14 or later") {
			t.Fatalf("message_prefix on PostgreSQL %d: exit %d, want 1 with the version prerequisite:\n%s", major, code, out)
		}
		return
	}
	cfg := testConfig(t, dsn, "public.outbox", "tableless")
	cfg.Outbox.MessagePrefix = "outbox"
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	ctx := context.Background()
	emit := func(tx pgx.Tx, prefix, content string) {
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", prefix, content); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	emit(tx, "outbox", `{"id": "rolled-back", "aggregate_type": "msg", "aggregate_id": "a1", "event_type": "E", "payload": {}}`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	committed(t, conn, func(tx pgx.Tx) {
		emit(tx, "other-app", `{"id": "not-ours"}`)
		emit(tx, "outbox", `{"id": "e1", "aggregate_type": "msg", "aggregate_id": "a1", "event_type": "Created",
			"payload": {"x": 1}, "headers": {"tenant": "acme"}}`)
		emit(tx, "outbox", `{"id": "e2", "aggregate_type": "msg", "aggregate_id": "a1", "event_type": "Raw", "payload_base64": "AAH/"}`)
		emit(tx, "outbox", `not json`)
	})
	recs := consumeN(t, []string{topicFor("msg")}, 2, time.Minute, 2*time.Second)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	if id, _ := header(recs[0], "id"); id != "e1" || string(recs[0].Key) != "a1" || string(recs[0].Value) != `{"x": 1}` {
		t.Errorf("first record: id %s key %s value %s", id, recs[0].Key, recs[0].Value)
	}
	if tn, _ := header(recs[0], "tenant"); tn != "acme" {
		t.Errorf("tenant header %q", tn)
	}
	if string(recs[1].Value) != "\x00\x01\xff" {
		t.Errorf("base64 payload decoded to %q", recs[1].Value)
	}
	dlq := consumeN(t, []string{dlqFor("tableless")}, 1, time.Minute, time.Second)
	if e, _ := header(dlq[0], "error"); len(dlq) != 1 || !strings.Contains(e, "not an outbox event") {
		t.Fatalf("dead-letter records %d, error %q", len(dlq), e)
	}
}

// serverMajor is the test server's major version.
func serverMajor(t *testing.T, dsn string) int {
	var num int
	if err := pgConnect(t, dsn).QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		t.Fatal(err)
	}
	return num / 10000
}
