package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

// ceRow is an outbox row as the test reads it back from PostgreSQL.
type ceRow struct {
	id, eventType, aggregateID string
	payload                    []byte // the bytes the record carries; nil for NULL
}

// ceContentType is the datacontenttype the connector derives from each
// payload column type.
var ceContentType = map[string]string{"jsonb": "application/json", "text": "text/plain", "bytea": "application/octet-stream"}

// TestCloudEventsEndToEnd runs the connector binary with each CloudEvents
// format and payload column type against the real broker: the records follow
// the Kafka protocol binding (checked against the rows they came from, one
// of them published by the snapshot), a row that cannot be a CloudEvent is
// dead-lettered as a plain record, and the inbox reads the events,
// deduplicating on the CloudEvents id even without the plain headers.
func TestCloudEventsEndToEnd(t *testing.T) {
	for _, tc := range []struct{ format, payloadType string }{
		{"cloudevents-binary", "jsonb"}, {"cloudevents-binary", "bytea"},
		{"cloudevents-structured", "jsonb"}, {"cloudevents-structured", "text"}, {"cloudevents-structured", "bytea"},
	} {
		t.Run(tc.format+"/"+tc.payloadType, func(t *testing.T) { testCloudEvents(t, tc.format, tc.payloadType) })
	}
}

func testCloudEvents(t *testing.T, format, payloadType string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	createOutbox(t, dsn, "outbox", payloadType)
	if _, err := conn.Exec(ctx, `CREATE TABLE ce_handled (event_id text, event_type text, aggregate_id text, payload bytea)`); err != nil {
		t.Fatal(err)
	}
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// A payload is given as text and stored as the column's type.
	asType := map[string]string{"jsonb": "%s::jsonb", "text": "%s", "bytea": "convert_to(%s, 'UTF8')"}[payloadType]
	insert := func(rows ...string) {
		t.Helper()
		values := make([]string, len(rows))
		for i, r := range rows {
			et, payload, _ := strings.Cut(r, "|")
			if payload != "NULL" {
				payload = fmt.Sprintf(asType, "'"+payload+"'")
			}
			// Apart by a millisecond each, so created_at orders them.
			values[i] = fmt.Sprintf("($1, 'o-1', '%s', %s, clock_timestamp() + interval '%d ms')", et, payload, i)
		}
		mustExec(ctx, t, conn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) VALUES `+
			strings.Join(values, ", "), aggType(format, payloadType))
	}

	// Written before the slot exists: published by the snapshot read.
	insert(`OrderCreated|{"sku": "A-0"}`)
	slot := "ce_" + strings.TrimPrefix(format, "cloudevents-") + "_" + payloadType
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
snapshot: {mode: pending}
http: {listen: %s}
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, format, addr))
	p := startProcess(t, cfgPath, addr)

	// Three events of one aggregate (one with text that needs escaping), a
	// tombstone, and an empty event_type: no CloudEvent.
	insert(`OrderPlaced|{"sku": "A-1", "qty": 2}`, `OrderPaid|{"note": "<\"ü\">", "n": [1, 2.50]}`,
		`OrderShipped|"just a string"`, `OrderDeleted|NULL`, `|{}`)
	bytesOf := "convert_to(payload::text, 'UTF8')"
	if payloadType == "bytea" {
		bytesOf = "payload"
	}
	want := ceRows(ctx, t, conn, `SELECT id::text, event_type, aggregate_id, `+bytesOf+` FROM outbox ORDER BY created_at`)

	topic := topicFor(aggType(format, payloadType))
	recs := consumeN(t, []string{topic}, 5, time.Minute, time.Second)
	if len(recs) != 5 {
		t.Fatalf("%d records on %s, want 5", len(recs), topic)
	}
	source := "/outbox-cdc/" + pc.Database + "/public.outbox"
	for i, rec := range recs {
		checkCloudEvent(t, format, ceContentType[payloadType], source, rec, want[i])
	}
	dead := consumeN(t, []string{dlqFor(slot)}, 1, time.Minute, time.Second)
	if len(dead) != 1 || !strings.Contains(hdr(dead[0], "error"), "event_type is NULL or empty, but a CloudEvent requires it") ||
		hdr(dead[0], "ce_id") != "" || hdr(dead[0], "content-type") != "" || string(dead[0].Value) != "{}" || hdr(dead[0], "id") != want[5].id {
		t.Fatalf("dead letters %d, first headers %v value %s: want the plain record of %s", len(dead), dead[0].Headers, dead[0].Value, want[5].id)
	}
	stopClean(t, p)

	// The inbox hands the handler the same event whatever the format.
	ic := ibStart(t, dsn, topic, "ce-"+slot+"-"+runID, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		ev, err := inbox.EventOf(rec)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ce_handled VALUES ($1, $2, $3, $4)`, ev.ID, ev.Type, ev.AggregateID, ev.Payload)
		return err
	})
	handled := func() []ceRow {
		return ceRows(ctx, t, conn, `SELECT event_id, event_type, aggregate_id, payload FROM ce_handled ORDER BY event_id`)
	}
	ibWait(t, ctx, "5 events handled", func() bool { return len(handled()) >= 5 })

	// A copy of an event without the plain headers, as another CloudEvents
	// producer would send it: the inbox finds its id in the CloudEvents
	// attributes and skips it.
	cp := &kgo.Record{Topic: recs[1].Topic, Key: recs[1].Key, Value: recs[1].Value}
	for _, h := range recs[1].Headers {
		if h.Key != "id" && h.Key != "event_type" && h.Key != "aggregate_type" {
			cp.Headers = append(cp.Headers, h)
		}
	}
	ibProduce(ctx, t, cp)
	ibWait(t, ctx, "the copy counted as a duplicate", func() bool { return ic.metric(t, inbox.MetricDuplicates) >= 1 })
	ic.stop(t)

	got := handled()
	if len(got) != 5 {
		t.Fatalf("handled %d events, want 5: %v", len(got), got)
	}
	byID := map[string]ceRow{}
	for _, g := range got {
		byID[g.id] = g
	}
	for _, w := range want[:5] {
		g, ok := byID[w.id]
		if !ok || g.eventType != w.eventType || g.aggregateID != w.aggregateID || !bytes.Equal(g.payload, w.payload) || (g.payload == nil) != (w.payload == nil) {
			t.Errorf("handler saw %+v (%q), want %+v (%q)", g, g.payload, w, w.payload)
		}
	}
	var inboxIDs int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id IN (SELECT id::text FROM outbox)`).Scan(&inboxIDs); err != nil || inboxIDs != 5 {
		t.Errorf("inbox rows keyed by the event ids: %d (%v), want 5", inboxIDs, err)
	}
}

// aggType names the aggregate type, and so the topic, of one subtest.
func aggType(format, payloadType string) string {
	return strings.ReplaceAll(format, "-", "") + payloadType
}

// checkCloudEvent checks rec against the binding and the row it came from:
// ct is the datacontenttype the payload column's type gives.
func checkCloudEvent(t *testing.T, format, ct, source string, rec *kgo.Record, row ceRow) {
	t.Helper()
	if string(rec.Key) != row.aggregateID || hdr(rec, "id") != row.id || hdr(rec, "event_type") != row.eventType {
		t.Errorf("record %d: key %q, plain headers %v; want the row %+v", rec.Offset, rec.Key, rec.Headers, row)
	}
	attrs := map[string]string{}
	tombstone := row.payload == nil
	if format == "cloudevents-structured" && !tombstone {
		if h := hdr(rec, "content-type"); h != "application/cloudevents+json; charset=UTF-8" {
			t.Errorf("record %d: content-type %q", rec.Offset, h)
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
		// json-format.md 3.1: JSON as is, bytes as data_base64, other text
		// as a JSON string.
		var data []byte
		switch ct {
		case "application/json":
			data = env["data"]
		case "application/octet-stream":
			data, _ = base64.StdEncoding.DecodeString(attrs["data_base64"])
		default:
			var s string
			_ = json.Unmarshal(env["data"], &s)
			data = []byte(s)
		}
		if attrs["datacontenttype"] != ct || !bytes.Equal(data, row.payload) {
			t.Errorf("record %d: datacontenttype %q data %s, want %s and the payload %q byte for byte\n%s",
				rec.Offset, attrs["datacontenttype"], data, ct, row.payload, rec.Value)
		}
	} else {
		for _, h := range rec.Headers {
			if a, ok := strings.CutPrefix(h.Key, "ce_"); ok {
				attrs[a] = string(h.Value)
			}
		}
		got, hasCT := header(rec, "content-type")
		switch {
		case tombstone && (rec.Value != nil || hasCT):
			t.Errorf("record %d: tombstone with value %q, content-type %q", rec.Offset, rec.Value, got)
		case !tombstone && (got != ct || !bytes.Equal(rec.Value, row.payload)):
			t.Errorf("record %d: content-type %q value %q, want %s and %q", rec.Offset, got, rec.Value, ct, row.payload)
		}
	}
	for k, v := range map[string]string{"specversion": "1.0", "id": row.id, "source": source, "type": row.eventType,
		"subject": row.aggregateID, "partitionkey": row.aggregateID} {
		if attrs[k] != v {
			t.Errorf("record %d: attribute %s = %q, want %q", rec.Offset, k, attrs[k], v)
		}
	}
	// time is the commit time (the read's for the snapshot row), RFC 3339
	// in UTC; the record timestamp is the same instant in milliseconds.
	at, err := time.Parse(time.RFC3339Nano, attrs["time"])
	if err != nil || !strings.HasSuffix(attrs["time"], "Z") || !at.Truncate(time.Millisecond).Equal(rec.Timestamp) {
		t.Errorf("record %d: time %q (%v), record timestamp %v", rec.Offset, attrs["time"], err, rec.Timestamp)
	}
}

// ceRows reads (id, event type, aggregate id, payload bytes) rows.
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

// TestCloudEventsStructuredSizeLimit: the size limit applies to the record as
// written. A payload that fits its topic's max.message.bytes as a plain record
// does not once wrapped in the structured envelope, and is dead-lettered for
// its size; a small event of the same aggregate still arrives.
func TestCloudEventsStructuredSizeLimit(t *testing.T) {
	// A plain record of the big payload is at most 61 bytes of batch
	// header, about 30 of framing, key and the three plain headers (under
	// 100) over its 3,700: under the limit. The envelope adds about 300.
	const maxBytes, big = 4000, 3700
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "text")
	topic := limitedTopic(t, 1, maxBytes)
	cfg := testConfig(t, dsn, "public.outbox", "ce_size")
	cfg.DLQ.Mode = config.DLQSkip // later events of the aggregate overtake its dead letter
	cfg.Kafka.Topics = map[string]string{"limited": topic}
	cfg.Kafka.Format = "cloudevents-structured"
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)

	var bigID, smallID string
	committed(t, conn, func(tx pgx.Tx) {
		bigID = insert(t, tx, "outbox", "limited", "agg-1", "Sized", strings.Repeat("x", big))
		smallID = insert(t, tx, "outbox", "limited", "agg-1", "Sized", "small")
	})
	recs := consumeN(t, []string{topic}, 1, time.Minute, 2*time.Second)
	if len(recs) != 1 || hdr(recs[0], "id") != smallID {
		t.Errorf("%s holds %d records (first id %q), want only %s", topic, len(recs), hdr(recs[0], "id"), smallID)
	}
	dead := consumeN(t, []string{dlqFor("ce_size")}, 1, time.Minute, 2*time.Second)
	if len(dead) != 1 || hdr(dead[0], "id") != bigID {
		t.Fatalf("%d dead letters (first id %q), want %s", len(dead), hdr(dead[0], "id"), bigID)
	}
	if reason := hdr(dead[0], "error"); !strings.Contains(reason, "exceeds max.message.bytes 4000") || !strings.Contains(reason, topic) {
		t.Errorf("dead letter error %q", reason)
	}
	// A record the sink dead-letters is the record it refused: the envelope.
	if hdr(dead[0], "content-type") != "application/cloudevents+json; charset=UTF-8" || len(dead[0].Value) <= big+200 {
		t.Errorf("dead letter content-type %q, %d bytes of value", hdr(dead[0], "content-type"), len(dead[0].Value))
	}
}
