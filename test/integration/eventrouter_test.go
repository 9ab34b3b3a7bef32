package integration

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The rows and the records Debezium's outbox EventRouter makes of them, from
// debezium/debezium:
//   - documentation/modules/ROOT/pages/transformations/outbox-event-router.adoc,
//     "Example outbox message": the row (id 406c07f3-…, aggregateid "1",
//     aggregatetype Order, type OrderCreated, the order payload) and the
//     record: topic outbox.event.<aggregatetype>, key "1", one header id =
//     the row's id, value the payload column's text.
//   - debezium-connect-plugins/src/main/java/io/debezium/transforms/outbox/
//     EventRouterDelegate.java (apply): the id header first, then the header
//     placements in order; an envelope is a struct {payload, aliases...};
//     the partition placement sets the record's partition (a NULL one leaves
//     it to the key); the timestamp column (MicroTimestamp, a timestamp
//     column) divided by 1000 is the record timestamp; a NULL payload with
//     route.tombstone.on.empty.payload is a null value; the RegexRouter
//     rewrites the route.by.field value.
//   - EventRouterTest.java: canSetMultipleFieldsIntoTheEnvelope (an alias
//     used for a header and an envelope member at once),
//     canSetPartitionWithAdditionalFields, canMarkAnEventAsDeleted,
//     canSetTimestampByUserDefinedConfiguration.
const (
	erID      = "406c07f3-26f0-4eea-a50c-109940064b8f"
	erPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action 🚀", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`
	// The same payload as JsonConverter (schemas.enable=false) writes a
	// string member: quotes escaped, a character outside the BMP as its
	// surrogate pair (Jackson escapes each half), nothing else.
	erPayloadJSON = `"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action \uD83D\uDE80\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"`
)

// wantRecord is a record as Debezium writes it; a nil value is a tombstone,
// partition -1 means "the key's" (murmur2, as the Java producer), a zero
// timestamp means "the commit time" (Debezium's ts_ms, the time it read the
// change, is not reproducible).
type wantRecord struct {
	topic, key string
	value      []byte
	headers    []kgo.RecordHeader
	partition  int32
	timestamp  time.Time
}

// TestEventRouterDebeziumParity runs the connector binary with the
// translations (testdata/eventrouter/*.yaml) of two Debezium connector
// configurations (*.properties) and checks every record on the broker byte
// for byte against what Debezium's EventRouter produces for the same rows.
func TestEventRouterDebeziumParity(t *testing.T) {
	placementRows := func(agg string) []string {
		return []string{
			fmt.Sprintf(`INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, "timestamp", p)
				VALUES ('%s', '%s', '1', 'OrderCreated', '%s', '2019-05-03 13:58:14.344123', 2)`, erID, agg, erPayload),
			fmt.Sprintf(`INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
				VALUES ('4d47e190-0402-4048-bc2c-89dd54343cdc', '%s', '1', 'OrderDeleted', NULL)`, agg),
		}
	}
	placementRecords := func(agg string) []wantRecord {
		return []wantRecord{
			{topic: "outbox.event." + agg, key: "1", partition: 2,
				value: []byte(`{"payload":` + erPayloadJSON + `,"eventType":"OrderCreated"}`),
				headers: []kgo.RecordHeader{{Key: "id", Value: []byte(erID)},
					{Key: "eventType", Value: []byte("OrderCreated")}},
				timestamp: time.Date(2019, 5, 3, 13, 58, 14, 344_000_000, time.UTC)},
			{topic: "outbox.event." + agg, key: "1", partition: -1, value: nil,
				headers: []kgo.RecordHeader{{Key: "id", Value: []byte("4d47e190-0402-4048-bc2c-89dd54343cdc")},
					{Key: "eventType", Value: []byte("OrderDeleted")}}},
		}
	}
	tests := []struct {
		name       string
		config     string // testdata/eventrouter/<config>.yaml
		snapshot   bool   // rows written before the start, published by snapshot.mode: pending
		partitions int
		rows       func(agg string) []string // INSERT statements
		want       func(agg string) []wantRecord
	}{
		{
			name:       "documented",
			config:     "documented",
			partitions: 1,
			rows: func(agg string) []string {
				return []string{fmt.Sprintf(`INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
					VALUES ('%s', '%s', '1', 'OrderCreated', '%s')`, erID, agg, erPayload)}
			},
			want: func(agg string) []wantRecord {
				return []wantRecord{{topic: "outbox.event." + agg, key: "1", value: []byte(erPayload),
					headers: []kgo.RecordHeader{{Key: "id", Value: []byte(erID)}}, partition: -1}}
			},
		},
		{name: "placements", config: "placements", partitions: 4, rows: placementRows, want: placementRecords},
		// Debezium's initial snapshot reads the rows as op "r", which the
		// EventRouter routes like inserts: the same records.
		{name: "placements_snapshot", config: "placements", snapshot: true, partitions: 4, rows: placementRows, want: placementRecords},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dsn := newDatabase(t)
			// Debezium's "Basic outbox table", plus the columns the
			// placements use; "timestamp" is a timestamp column because
			// Debezium reads it as MicroTimestamp.
			exec1(t, dsn, `CREATE TABLE outboxevent (
				id uuid PRIMARY KEY,
				aggregatetype varchar(255) NOT NULL,
				aggregateid varchar(255) NOT NULL,
				type varchar(255) NOT NULL,
				payload jsonb,
				"timestamp" timestamp(6),
				p int4)`)
			agg := "Order" + runID + tc.name
			topic := "outbox.event." + agg
			createTopic(t, topic, tc.partitions)
			slot := "er_" + tc.name
			dropSlotAtEnd(t, dsn, slot)
			addr := freeAddr(t)
			env := []string{"OUTBOX_CDC_POSTGRES_DSN=" + dsn, "OUTBOX_CDC_POSTGRES_SLOT=" + slot,
				"OUTBOX_CDC_KAFKA_BROKERS=" + strings.Join(kafkaServer.Brokers(), ","),
				"OUTBOX_CDC_KAFKA_DLQ_TOPIC=" + dlqFor(slot), "OUTBOX_CDC_HTTP_LISTEN=" + addr}
			insert := func() {
				for _, q := range tc.rows(agg) {
					exec1(t, dsn, q)
				}
			}
			before := time.Now().Add(-time.Second)
			if tc.snapshot {
				insert()
				env = append(env, "OUTBOX_CDC_SNAPSHOT_MODE=pending")
			}
			p := startProc(t, filepath.Join("testdata", "eventrouter", tc.config+".yaml"), addr, true, env...)
			if !tc.snapshot {
				insert()
			}
			want := tc.want(agg)
			got := consumeN(t, []string{topic}, len(want), time.Minute, 2*time.Second)
			after := time.Now().Add(time.Second)
			stopClean(t, p)
			if len(got) != len(want) {
				t.Fatalf("%d records, want %d", len(got), len(want))
			}
			// One aggregate, so one partition each; order by offset within
			// it is the insert order.
			slices.SortStableFunc(got, func(a, b *kgo.Record) int { return strings.Compare(idOf(a), idOf(b)) })
			slices.SortStableFunc(want, func(a, b wantRecord) int {
				return strings.Compare(string(a.headers[0].Value), string(b.headers[0].Value))
			})
			for i, w := range want {
				checkRecord(t, got[i], w, tc.partitions, before, after)
			}
		})
	}
}

// checkRecord compares one consumed record with Debezium's.
func checkRecord(t *testing.T, r *kgo.Record, w wantRecord, partitions int, before, after time.Time) {
	t.Helper()
	id := idOf(r)
	if r.Topic != w.topic || string(r.Key) != w.key {
		t.Errorf("%s: topic %q key %q, want %q and %q", id, r.Topic, r.Key, w.topic, w.key)
	}
	if (r.Value == nil) != (w.value == nil) || !bytes.Equal(r.Value, w.value) {
		t.Errorf("%s: value (nil %v)\n%s\nwant (nil %v)\n%s", id, r.Value == nil, r.Value, w.value == nil, w.value)
	}
	if !slices.EqualFunc(r.Headers, w.headers, func(a, b kgo.RecordHeader) bool {
		return a.Key == b.Key && bytes.Equal(a.Value, b.Value) && (a.Value == nil) == (b.Value == nil)
	}) {
		t.Errorf("%s: headers %q, want %q", id, r.Headers, w.headers)
	}
	wantPart := w.partition
	if wantPart < 0 {
		wantPart = int32(kgo.StickyKeyPartitioner(nil).ForTopic(w.topic).Partition(&kgo.Record{Key: []byte(w.key)}, partitions))
	}
	if r.Partition != wantPart {
		t.Errorf("%s: partition %d, want %d", id, r.Partition, wantPart)
	}
	switch {
	case !w.timestamp.IsZero() && !r.Timestamp.Equal(w.timestamp):
		t.Errorf("%s: timestamp %v, want %v", id, r.Timestamp.UTC(), w.timestamp)
	case w.timestamp.IsZero() && (r.Timestamp.Before(before) || r.Timestamp.After(after)):
		t.Errorf("%s: timestamp %v, want the commit time, between %v and %v", id, r.Timestamp, before, after)
	}
}

func idOf(r *kgo.Record) string {
	id, _ := header(r, "id")
	return id
}
