package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TestRetentionPartitions: on an outbox partitioned by created_at, the
// connector makes partitions ahead (the writers never find none, over many
// two-second partitions: a simulated week of daily ones) and drops them
// behind, only once every row in them is delivered: an undelivered event
// keeps its partition and every later one past the retention. A partition
// made by hand is left alone.
// partitionedOutbox creates public.outbox partitioned by range on
// created_at, with no partition (the connector makes them), the index
// retention needs, and an event trigger that records each table dropped,
// with the time, in dropped.
func partitionedOutbox(t *testing.T, dsn string) {
	t.Helper()
	exec1(t, dsn, `CREATE TABLE outbox (
		id uuid NOT NULL DEFAULT gen_random_uuid(),
		aggregate_type text NOT NULL, aggregate_id text, event_type text NOT NULL, payload jsonb, tenant text,
		created_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	exec1(t, dsn, `CREATE INDEX ON outbox (created_at)`)
	exec1(t, dsn, `CREATE TABLE dropped (name text, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	exec1(t, dsn, `CREATE TABLE deleted_rows (id uuid, deleted_at timestamptz)`) // stays empty: partitions are dropped, no row deleted
	exec1(t, dsn, `CREATE FUNCTION record_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO dropped (name) SELECT object_name FROM pg_event_trigger_dropped_objects() WHERE object_type = 'table'; END $$`)
	exec1(t, dsn, `CREATE EVENT TRIGGER record_drop ON sql_drop EXECUTE FUNCTION record_drop()`)
}

// droppedTables returns each table dropped (partitionedOutbox) and when.
func droppedTables(t *testing.T, conn *pgx.Conn) map[string]time.Time {
	t.Helper()
	dropAt := map[string]time.Time{}
	q, err := conn.Query(context.Background(), "SELECT name, at FROM dropped")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for q.Next() {
		var n string
		var at time.Time
		if err := q.Scan(&n, &at); err != nil {
			t.Fatal(err)
		}
		dropAt[n] = at
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	return dropAt
}

// checkDroppedAfterAck checks that every dropped partition (of width, by
// name) went after the events of all its rows (created: id → created_at)
// were appended (the topics use LogAppendTime).
func checkDroppedAfterAck(t *testing.T, recs []*kgo.Record, created map[string]time.Time, dropAt map[string]time.Time, width time.Duration) {
	t.Helper()
	appended := map[string]time.Time{}
	for _, r := range recs {
		if id, ok := header(r, "id"); ok {
			appended[id] = r.Timestamp
		}
	}
	early := 0
	for id, c := range created {
		if at, ok := dropAt[replication.PartitionName("outbox", c.Truncate(width))]; ok {
			if app, ok := appended[id]; !ok || at.Before(app) {
				early++
			}
		}
	}
	if early > 0 {
		t.Errorf("%d rows' partitions dropped before their event was appended", early)
	}
}

func TestRetentionPartitions(t *testing.T) {
	dsn := newDatabase(t)
	partitionedOutbox(t, dsn)
	exec1(t, dsn, `CREATE TABLE outbox_hand PARTITION OF outbox FOR VALUES FROM ('2000-01-01') TO ('2001-01-01')`)
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, created_at) VALUES ('hand', 'h', 'E', '2000-06-01')`) // before the slot: never published
	okType, heldType := "retpartok"+runID, "retpartheld"+runID
	appendTimeTopic(t, topicFor(okType))
	const width, retain = 2 * time.Second, 3 * time.Second
	cfg := retentionConfig(t, dsn, "retpart", retain)
	cfg.Outbox.PartitionWidth, cfg.Outbox.PartitionsAhead = width, 2
	c := startConnector(t, cfg)
	created := func() float64 {
		return testutil.ToFloat64(c.m.Retention.PartitionsCreated.WithLabelValues("public.outbox"))
	}
	waitFor(t, 30*time.Second, "partitions made ahead", func() bool { return created() >= 3 })
	conn := pgConnect(t, dsn)

	type row struct {
		id string
		at time.Time
	}
	var mu sync.Mutex
	var rows []row
	write := func(conn *pgx.Conn, aggType string) error {
		var r row
		err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'p', 'E', '{}') RETURNING id::text, created_at`, aggType).Scan(&r.id, &r.at)
		mu.Lock()
		rows = append(rows, r)
		mu.Unlock()
		return err
	}
	quit, done := make(chan struct{}), make(chan error, 1)
	go func(quit <-chan struct{}) { // its own copy: stopWriter clears the variable
		wc, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			done <- err
			return
		}
		defer wc.Close(context.Background())
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(10 * time.Millisecond): // the writer's pace
			}
			if err := write(wc, okType); err != nil {
				done <- err
				return
			}
		}
	}(quit)
	stopWriter := func() {
		if quit != nil {
			close(quit)
			quit = nil
			if err := <-done; err != nil {
				t.Fatalf("writer: %v", err)
			}
		}
	}
	t.Cleanup(stopWriter)
	dropped := func() int { return queryInt(t, conn, "SELECT count(*) FROM dropped") }
	waitFor(t, time.Minute, "partitions dropped behind", func() bool { return dropped() >= 2 })

	if err := write(conn, heldType); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	held := rows[len(rows)-1]
	mu.Unlock()
	heldPart := replication.PartitionName("outbox", held.at.Truncate(width))
	before := dropped()
	time.Sleep(2*retain + width)
	if n := queryInt(t, conn, "SELECT count(*) FROM dropped WHERE name = $1", heldPart); n != 0 {
		t.Fatalf("the partition of an undelivered row was dropped")
	}
	if n := dropped(); n > before+1 { // the partition before the held row's may go
		t.Fatalf("%d partitions dropped while an earlier row was not delivered", n-before)
	}
	appendTimeTopic(t, topicFor(heldType))
	waitFor(t, time.Minute, "the held row's partition dropped", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM dropped WHERE name = $1", heldPart) == 1
	})
	stopWriter()
	c.stop(t) // no drop after this: the counter and the trigger's table agree

	// Every event is in Kafka, and every dropped partition went after the
	// events of all its rows were appended.
	ids := make([]string, len(rows))
	createdAt := map[string]time.Time{}
	for i, r := range rows {
		ids[i], createdAt[r.id] = r.id, r.at
	}
	recs := consumeN(t, []string{topicFor(okType), topicFor(heldType)}, len(ids), time.Minute, 0)
	checkDeletedAfterAck(t, conn, recs, ids) // no row deletes here: checks 0 lost
	dropAt := droppedTables(t, conn)
	checkDroppedAfterAck(t, recs, createdAt, dropAt, width)
	if n := queryInt(t, conn, "SELECT count(*) FROM outbox_hand"); n != 1 {
		t.Errorf("the partition made by hand lost rows: %d", n)
	}
	if got := testutil.ToFloat64(c.m.Retention.PartitionsDropped.WithLabelValues("public.outbox")); int(got) != len(dropAt) {
		t.Errorf("dropped counter %v, %d dropped: %v", got, len(dropAt), dropAt)
	}
	t.Logf("%d rows, %v partitions made, %d dropped", len(rows), created(), len(dropAt))
}
