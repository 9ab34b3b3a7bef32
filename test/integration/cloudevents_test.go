package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// ceRow is an outbox row as the test reads it back from PostgreSQL.
type ceRow struct {
	id, eventType, aggregateID string
	payload                    *string // payload::text; nil for NULL
}

// TestCloudEventsEndToEnd runs the connector binary with each CloudEvents
// format against the real broker: the records follow the Kafka protocol
// binding (checked against the rows they came from), a row that cannot be a
// CloudEvent is dead-lettered as a plain record, and the inbox reads the
// events, deduplicating on the CloudEvents id even without the plain
// headers.
func TestCloudEventsEndToEnd(t *testing.T) {
	for _, format := range []string{"cloudevents-binary", "cloudevents-structured"} {
		t.Run(format, func(t *testing.T) { testCloudEvents(t, format) })
	}
}

func testCloudEvents(t *testing.T, format string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	createOutbox(t, dsn, "outbox", "jsonb")
	if _, err := conn.Exec(ctx, `CREATE TABLE ce_handled (event_id text, event_type text, aggregate_id text, payload text)`); err != nil {
		t.Fatal(err)
	}
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	aggType := strings.ReplaceAll(format, "-", "")
	slot := "ce_" + strings.TrimPrefix(format, "cloudevents-")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := writeConfig(t, fmt.Sprintf(`
postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 100ms}
outbox: {table: public.outbox}
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
  format: %s
http: {listen: %s}
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, format, addr))
	p := startProcess(t, cfgPath, addr)

	// Three events of one aggregate (jsonb, one with text that needs
	// escaping), a tombstone, and an empty event_type: no CloudEvent.
	mustExec(ctx, t, conn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) VALUES
		($1, 'o-1', 'OrderPlaced', '{"sku": "A-1", "qty": 2}', now()),
		($1, 'o-1', 'OrderPaid', '{"note": "<\"ü\">", "n": [1, 2.50]}', now() + interval '1 ms'),
		($1, 'o-1', 'OrderShipped', '"just a string"', now() + interval '2 ms'),
		($1, 'o-1', 'OrderDeleted', NULL, now() + interval '3 ms'),
		($1, 'o-1', '', '{}', now() + interval '4 ms')`, aggType)
	want := ceRows(ctx, t, conn, `SELECT id::text, event_type, aggregate_id, payload::text FROM outbox ORDER BY created_at`)

	recs := consumeN(t, []string{topicFor(aggType)}, 4, time.Minute, time.Second)
	if len(recs) != 4 {
		t.Fatalf("%d records on %s, want 4", len(recs), topicFor(aggType))
	}
	source := "/outbox-cdc/" + pc.Database + "/public.outbox"
	for i, rec := range recs {
		checkCloudEvent(t, format, source, rec, want[i])
	}
	dead := consumeN(t, []string{dlqFor(slot)}, 1, time.Minute, time.Second)
	if len(dead) != 1 || !strings.Contains(hdr(dead[0], "error"), "event_type is NULL or empty, but a CloudEvent requires it") ||
		hdr(dead[0], "ce_id") != "" || hdr(dead[0], "content-type") != "" || string(dead[0].Value) != "{}" || hdr(dead[0], "id") != want[4].id {
		t.Fatalf("dead letters %d, first headers %v value %s: want the plain record of %s", len(dead), dead[0].Headers, dead[0].Value, want[4].id)
	}
	stopClean(t, p)

	// The inbox hands the handler the same event whatever the format.
	ic := ibStart(t, dsn, topicFor(aggType), "ce-"+aggType+"-"+runID, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		ev, err := inbox.EventOf(rec)
		if err != nil {
			return err
		}
		var payload *string
		if ev.Payload != nil {
			s := string(ev.Payload)
			payload = &s
		}
		_, err = tx.Exec(ctx, `INSERT INTO ce_handled VALUES ($1, $2, $3, $4)`, ev.ID, ev.Type, ev.AggregateID, payload)
		return err
	})
	handled := func() []ceRow {
		return ceRows(ctx, t, conn, `SELECT event_id, event_type, aggregate_id, payload FROM ce_handled ORDER BY event_id`)
	}
	ibWait(t, ctx, "4 events handled", func() bool { return len(handled()) >= 4 })

	// A copy of the first event without the plain headers, as another
	// CloudEvents producer would send it: the inbox finds its id in the
	// CloudEvents attributes and skips it.
	cp := &kgo.Record{Topic: recs[0].Topic, Key: recs[0].Key, Value: recs[0].Value}
	for _, h := range recs[0].Headers {
		if h.Key != "id" && h.Key != "event_type" && h.Key != "aggregate_type" {
			cp.Headers = append(cp.Headers, h)
		}
	}
	ibProduce(ctx, t, cp)
	ibWait(t, ctx, "the copy counted as a duplicate", func() bool { return ic.metric(t, inbox.MetricDuplicates) >= 1 })
	ic.stop(t)

	got := handled()
	if len(got) != 4 {
		t.Fatalf("handled %d events, want 4: %v", len(got), got)
	}
	byID := map[string]ceRow{}
	for _, g := range got {
		byID[g.id] = g
	}
	for _, w := range want[:4] {
		g, ok := byID[w.id]
		if !ok || g.eventType != w.eventType || g.aggregateID != w.aggregateID || !equalPtr(g.payload, w.payload) {
			t.Errorf("handler saw %+v (%v), want %+v (%v)", g, deref(g.payload), w, deref(w.payload))
		}
	}
	var inboxIDs int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id IN (SELECT id::text FROM outbox)`).Scan(&inboxIDs); err != nil || inboxIDs != 4 {
		t.Errorf("inbox rows keyed by the event ids: %d (%v), want 4", inboxIDs, err)
	}
}

// checkCloudEvent checks rec against the binding and the row it came from.
func checkCloudEvent(t *testing.T, format, source string, rec *kgo.Record, row ceRow) {
	t.Helper()
	if string(rec.Key) != row.aggregateID || hdr(rec, "id") != row.id || hdr(rec, "event_type") != row.eventType {
		t.Errorf("record %d: key %q, plain headers %v; want the row %+v", rec.Offset, rec.Key, rec.Headers, row)
	}
	attrs := map[string]string{}
	var data json.RawMessage
	tombstone := row.payload == nil
	if format == "cloudevents-structured" && !tombstone {
		if ct := hdr(rec, "content-type"); ct != "application/cloudevents+json; charset=UTF-8" {
			t.Errorf("record %d: content-type %q", rec.Offset, ct)
		}
		var env map[string]json.RawMessage
		if err := json.Unmarshal(rec.Value, &env); err != nil {
			t.Fatalf("record %d: value is not a JSON object: %v\n%s", rec.Offset, err, rec.Value)
		}
		for k, v := range env {
			var s string
			if k != "data" && json.Unmarshal(v, &s) == nil {
				attrs[k] = s
			}
		}
		data = env["data"]
		if attrs["datacontenttype"] != "application/json" || !bytes.Equal(data, []byte(*row.payload)) {
			t.Errorf("record %d: datacontenttype %q data %s, want application/json and the jsonb text %s byte for byte",
				rec.Offset, attrs["datacontenttype"], data, *row.payload)
		}
	} else {
		for _, h := range rec.Headers {
			if a, ok := strings.CutPrefix(h.Key, "ce_"); ok {
				attrs[a] = string(h.Value)
			}
		}
		ct, hasCT := header(rec, "content-type")
		switch {
		case tombstone && (rec.Value != nil || hasCT):
			t.Errorf("record %d: tombstone with value %q, content-type %q", rec.Offset, rec.Value, ct)
		case !tombstone && (ct != "application/json" || string(rec.Value) != *row.payload):
			t.Errorf("record %d: content-type %q value %s, want application/json and %s", rec.Offset, ct, rec.Value, *row.payload)
		}
	}
	for k, v := range map[string]string{"specversion": "1.0", "id": row.id, "source": source, "type": row.eventType,
		"subject": row.aggregateID, "partitionkey": row.aggregateID} {
		if attrs[k] != v {
			t.Errorf("record %d: attribute %s = %q, want %q", rec.Offset, k, attrs[k], v)
		}
	}
	// time is the commit time, RFC 3339; the record timestamp is the same
	// instant in milliseconds.
	at, err := time.Parse(time.RFC3339Nano, attrs["time"])
	if err != nil || !strings.HasSuffix(attrs["time"], "Z") || !at.Truncate(time.Millisecond).Equal(rec.Timestamp) {
		t.Errorf("record %d: time %q (%v), record timestamp %v", rec.Offset, attrs["time"], err, rec.Timestamp)
	}
}

// ceRows reads (id, event type, aggregate id, payload) rows.
func ceRows(ctx context.Context, t *testing.T, conn *pgx.Conn, query string) []ceRow {
	t.Helper()
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ceRow, error) {
		var c ceRow
		return c, r.Scan(&c.id, &c.eventType, &c.aggregateID, &c.payload)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func hdr(r *kgo.Record, key string) string {
	v, _ := header(r, key)
	return v
}

func equalPtr(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}
