package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

// retentionTable creates an outbox table with the index retention deletes
// on, and a trigger that records each deleted row, in the same transaction,
// with the time it was deleted (deleted_rows).
func retentionTable(t *testing.T, dsn, table string) {
	t.Helper()
	createOutbox(t, dsn, table, "jsonb")
	exec1(t, dsn, "CREATE INDEX ON "+table+" (created_at)")
	exec1(t, dsn, `CREATE TABLE IF NOT EXISTS deleted_rows (id uuid PRIMARY KEY, tbl text NOT NULL,
		created_at timestamptz NOT NULL, deleted_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	exec1(t, dsn, `CREATE OR REPLACE FUNCTION record_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO deleted_rows (id, tbl, created_at) VALUES (OLD.id, TG_TABLE_NAME, OLD.created_at); RETURN OLD; END $$`)
	exec1(t, dsn, "CREATE TRIGGER record_delete AFTER DELETE ON "+table+" FOR EACH ROW EXECUTE FUNCTION record_delete()")
}

// appendTimeTopic creates topic with the broker's append time as record
// timestamps: a record's timestamp is then before its acknowledgement.
func appendTimeTopic(t *testing.T, topic string) {
	t.Helper()
	adm := newAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"message.timestamp.type": kadm.StringPtr("LogAppendTime")}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
}

func queryInt(t *testing.T, conn *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// insertRows commits n rows of aggType into table, one transaction each,
// and returns their ids.
func insertRows(t *testing.T, conn *pgx.Conn, table, aggType string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		var id string
		if err := conn.QueryRow(context.Background(), "INSERT INTO "+table+` (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'a', 'E', '{}') RETURNING id::text`, aggType).Scan(&id); err != nil {
			t.Fatalf("insert: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}

// writer commits one row of aggType every few milliseconds until stopped;
// only the test goroutine fails the test (errors come back from stop).
type writer struct {
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
	ids      []string
	created  map[string]time.Time // id → created_at; read after stop
	err      error
}

func startWriter(t *testing.T, dsn, table, aggType string) *writer {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{quit: make(chan struct{}), done: make(chan struct{}), created: map[string]time.Time{}}
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		for {
			select {
			case <-w.quit:
				return
			case <-time.After(5 * time.Millisecond): // the writers' pace: ~150 rows/s with the insert
			}
			var id string
			var at time.Time
			if w.err = conn.QueryRow(context.Background(), "INSERT INTO "+table+` (aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, 'w', 'E', '{}') RETURNING id::text, created_at`, aggType).Scan(&id, &at); w.err != nil {
				return
			}
			w.ids = append(w.ids, id)
			w.created[id] = at
		}
	}()
	t.Cleanup(func() { w.stop(t) })
	return w
}

func (w *writer) stop(t *testing.T) []string {
	t.Helper()
	w.stopOnce.Do(func() { close(w.quit) })
	<-w.done
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	return w.ids
}

// checkDeletedAfterAck checks that every id has its event in recs, and that
// every deleted row was deleted after its event was appended (the topics
// use LogAppendTime, so a record's timestamp precedes its acknowledgement).
// It returns how many rows were deleted.
func checkDeletedAfterAck(t *testing.T, conn *pgx.Conn, recs []*kgo.Record, ids []string) int {
	t.Helper()
	appended := map[string]time.Time{}
	for _, r := range recs {
		if id, ok := header(r, "id"); ok {
			if at, seen := appended[id]; !seen || r.Timestamp.Before(at) {
				appended[id] = r.Timestamp
			}
		}
	}
	lost := 0
	for _, id := range ids {
		if _, ok := appended[id]; !ok {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d events not in Kafka", lost, len(ids))
	}
	rows, err := conn.Query(context.Background(), "SELECT id::text, deleted_at FROM deleted_rows")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n, early := 0, 0
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		n++
		if app, ok := appended[id]; !ok || at.Before(app) {
			early++
			if early <= 5 {
				t.Errorf("row %s deleted at %v, its event appended at %v (found %v)", id, at, app, ok)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if early > 0 {
		t.Errorf("%d rows deleted before their event was acknowledged", early)
	}
	return n
}

// retentionConfig is testConfig with a short retention, topics that are
// not created on demand (a missing one holds its events unacknowledged).
func retentionConfig(t *testing.T, dsn, slot string, retain time.Duration) *config.Config {
	cfg := testConfig(t, dsn, "public.outbox", slot)
	cfg.Kafka.AutoCreateTopics = false
	cfg.Kafka.UnknownTopicTimeout = 10 * time.Minute
	cfg.Outbox.Retention = retain
	cfg.Outbox.RetentionInterval = 200 * time.Millisecond
	cfg.Outbox.RetentionBatchSize = 50
	cfg.Outbox.RetentionDutyCycle = 0.5
	return cfg
}

// TestRetentionUnderSteadyWriters: with writers committing all along, rows
// past the retention are deleted once acknowledged; an event that cannot
// be delivered (its topic missing) holds back the deletion of every row
// committed after it, and itself, past the retention; once its topic
// exists everything is delivered and deleted. 0 lost, 0 deleted before
// the ack.
func TestRetentionUnderSteadyWriters(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	okType, heldType := "retok"+runID, "retheld"+runID
	appendTimeTopic(t, topicFor(okType))
	const retain = 2 * time.Second
	c := startConnector(t, retentionConfig(t, dsn, "retsteady", retain))
	conn := pgConnect(t, dsn)
	w := startWriter(t, dsn, "outbox", okType)
	waitFor(t, time.Minute, "rows deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") > 0 })

	held := insertRows(t, conn, "outbox", heldType, 1)
	afterHeld := time.Now()
	time.Sleep(2 * retain)
	if n := queryInt(t, conn, "SELECT count(*) FROM outbox WHERE id = $1", held[0]); n != 1 {
		t.Fatal("the undelivered row was deleted")
	}
	if n := queryInt(t, conn, "SELECT count(*) FROM deleted_rows WHERE created_at > $1", afterHeld); n != 0 {
		t.Fatalf("%d rows committed after an undelivered one were deleted", n)
	}
	if age := testutil.ToFloat64(c.m.Retention.OldestUnacked); age < retain.Seconds() {
		t.Errorf("oldest unacknowledged event age %v while one waits for %v", age, 2*retain)
	}

	appendTimeTopic(t, topicFor(heldType))
	waitFor(t, time.Minute, "the held row deleted once delivered", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox WHERE id = $1", held[0]) == 0
	})
	ids := append(w.stop(t), held...)
	waitFor(t, time.Minute, "every row deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0 })
	recs := consumeN(t, []string{topicFor(okType), topicFor(heldType)}, len(ids), time.Minute, 0)
	if n := checkDeletedAfterAck(t, conn, recs, ids); n != len(ids) {
		t.Errorf("%d rows deleted, want %d", n, len(ids))
	}
	if got := testutil.ToFloat64(c.m.Retention.Deleted.WithLabelValues("public.outbox")); got != float64(len(ids)) {
		t.Errorf("outbox_cdc_outbox_rows_deleted_total %v, want %d", got, len(ids))
	}
	waitFor(t, 10*time.Second, "no unacknowledged event", func() bool { return testutil.ToFloat64(c.m.Retention.OldestUnacked) == 0 })
	if b := testutil.ToFloat64(c.m.Retention.TableBytes.WithLabelValues("public.outbox")); b <= 0 {
		t.Errorf("outbox_cdc_outbox_table_bytes %v", b)
	}
	t.Logf("%d rows written, delivered and deleted", len(ids))
}

// TestRetentionAfterLongStop: rows committed while the connector was
// stopped for longer than the retention are not deleted at start; they go
// once delivered.
func TestRetentionAfterLongStop(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	okType, heldType := "retstopok"+runID, "retstopheld"+runID
	appendTimeTopic(t, topicFor(okType))
	const retain = time.Second
	cfg := retentionConfig(t, dsn, "retstop", retain)
	conn := pgConnect(t, dsn)
	c := startConnector(t, cfg)
	ids := insertRows(t, conn, "outbox", okType, 20)
	waitFor(t, time.Minute, "the first rows deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == 20 })
	c.stop(t)

	ids = append(ids, insertRows(t, conn, "outbox", heldType, 30)...)
	ids = append(ids, insertRows(t, conn, "outbox", okType, 10)...)
	time.Sleep(3 * retain)
	startConnector(t, cfg)
	time.Sleep(3 * retain) // rounds run; nothing committed while stopped is acknowledged
	if n := queryInt(t, conn, "SELECT count(*) FROM deleted_rows"); n != 20 {
		t.Fatalf("%d rows deleted, want the 20 delivered before the stop", n)
	}
	appendTimeTopic(t, topicFor(heldType))
	waitFor(t, time.Minute, "every row deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0 })
	recs := consumeN(t, []string{topicFor(okType), topicFor(heldType)}, len(ids), time.Minute, 0)
	if n := checkDeletedAfterAck(t, conn, recs, ids); n != len(ids) {
		t.Errorf("%d rows deleted, want %d", n, len(ids))
	}
}

// TestRetentionTwoTables: each table of outbox.tables has its delivered
// rows deleted, and its own series.
func TestRetentionTwoTables(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	retentionTable(t, dsn, "billing")
	aggType := "rettwo" + runID
	appendTimeTopic(t, topicFor(aggType))
	cfg := retentionConfig(t, dsn, "rettwo", time.Second)
	cfg.Outbox.Table = ""
	cfg.Outbox.Tables = []config.OutboxTable{{Table: "public.outbox"}, {Table: "public.billing"}}
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	ids := append(insertRows(t, conn, "outbox", aggType, 15), insertRows(t, conn, "billing", aggType, 25)...)
	waitFor(t, time.Minute, "both tables emptied", func() bool {
		return queryInt(t, conn, "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM billing)") == 0
	})
	recs := consumeN(t, []string{topicFor(aggType)}, len(ids), time.Minute, 0)
	checkDeletedAfterAck(t, conn, recs, ids)
	for table, want := range map[string]int{"outbox": 15, "billing": 25} {
		if n := queryInt(t, conn, "SELECT count(*) FROM deleted_rows WHERE tbl = $1", table); n != want {
			t.Errorf("%s: %d rows deleted, want %d", table, n, want)
		}
		if got := testutil.ToFloat64(c.m.Retention.Deleted.WithLabelValues("public." + table)); got != float64(want) {
			t.Errorf("%s: counter %v, want %d", table, got, want)
		}
	}
}
