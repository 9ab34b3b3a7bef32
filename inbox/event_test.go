package inbox

import (
	"bytes"
	"cmp"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func headers(kv ...string) []kgo.RecordHeader {
	h := make([]kgo.RecordHeader, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		h = append(h, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return h
}

// TestEventOf: one event published in each format, as the connector writes
// it (docs/guide.md, "Record formats") and as another CloudEvents producer
// would (without the plain headers), reads as the same Event.
func TestEventOf(t *testing.T) {
	plain := []string{"id", "e-1", "event_type", "OrderPlaced", "aggregate_type", "order"}
	ceBinary := []string{"ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/outbox-cdc/shop/public.outbox", "ce_type", "OrderPlaced",
		"ce_subject", "o-7", "ce_time", "2026-12-01T02:55:00.123456Z", "ce_partitionkey", "o-7"}
	const structuredJSON = `{"specversion":"1.0","id":"e-1","source":"/outbox-cdc/shop/public.outbox","type":"OrderPlaced",` +
		`"subject":"o-7","time":"2026-12-01T02:55:00.123456Z","partitionkey":"o-7","datacontenttype":"application/json",` +
		`"data":{ "sku" : "A-1", "qty":2 }}`
	const payload = `{ "sku" : "A-1", "qty":2 }`
	want := Event{ID: "e-1", Type: "OrderPlaced", AggregateID: "o-7", AggregateType: "order", Payload: []byte(payload), ContentType: "application/json"}
	foreign := want
	foreign.AggregateType = ""

	tests := []struct {
		name string
		rec  *kgo.Record
		want Event
	}{
		{"plain", &kgo.Record{Key: []byte("o-7"), Value: []byte(payload), Headers: headers(plain...)},
			Event{ID: "e-1", Type: "OrderPlaced", AggregateID: "o-7", AggregateType: "order", Payload: []byte(payload)}},
		{"binary", &kgo.Record{Key: []byte("o-7"), Value: []byte(payload),
			Headers: headers(append(append(plain[:6:6], ceBinary...), "content-type", "application/json")...)}, want},
		{"structured", &kgo.Record{Key: []byte("o-7"), Value: []byte(structuredJSON),
			Headers: headers(append(plain[:6:6], "content-type", "application/cloudevents+json; charset=UTF-8")...)}, want},
		{"binary from another producer", &kgo.Record{Value: []byte(payload),
			Headers: headers(append(ceBinary[:14:14], "content-type", "application/json")...)}, foreign},
		{"structured from another producer", &kgo.Record{Value: []byte(structuredJSON),
			Headers: headers("content-type", "application/cloudevents+json")}, foreign},
		{"the CloudEvents id wins", &kgo.Record{Key: []byte("o-7"), Value: []byte(structuredJSON),
			Headers: headers("id", "other", "content-type", "application/cloudevents+json")},
			Event{ID: "e-1", Type: "OrderPlaced", AggregateID: "o-7", Payload: []byte(payload), ContentType: "application/json"}},
		{"structured text data", &kgo.Record{Key: []byte("k"), Value: []byte(`{"specversion":"1.0","id":"e-2","source":"/s","type":"T","datacontenttype":"text/plain","data":"line \"1\"\n"}`),
			Headers: headers("content-type", "application/cloudevents+json")},
			Event{ID: "e-2", Type: "T", AggregateID: "k", Payload: []byte("line \"1\"\n"), ContentType: "text/plain"}},
		{"structured data_base64", &kgo.Record{Key: []byte("k"), Value: []byte(`{"specversion":"1.0","id":"e-3","source":"/s","type":"T","datacontenttype":"application/octet-stream","data_base64":"AP94"}`),
			Headers: headers("content-type", "application/cloudevents+json")},
			Event{ID: "e-3", Type: "T", AggregateID: "k", Payload: []byte{0, 0xff, 'x'}, ContentType: "application/octet-stream"}},
		{"structured without datacontenttype is JSON", &kgo.Record{Key: []byte("k"), Value: []byte(`{"specversion":"1.0","id":"e-4","source":"/s","type":"T","data":[1]}`),
			Headers: headers("content-type", "application/cloudevents+json")},
			Event{ID: "e-4", Type: "T", AggregateID: "k", Payload: []byte("[1]"), ContentType: "application/json"}},
		{"binary tombstone", &kgo.Record{Key: []byte("o-7"), Headers: headers(append(plain[:6:6], ceBinary...)...)},
			Event{ID: "e-1", Type: "OrderPlaced", AggregateID: "o-7", AggregateType: "order"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EventOf(tc.rec)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tc.want.ID || got.Type != tc.want.Type || got.AggregateID != tc.want.AggregateID ||
				got.AggregateType != tc.want.AggregateType || got.ContentType != tc.want.ContentType ||
				!bytes.Equal(got.Payload, tc.want.Payload) || (got.Payload == nil) != (tc.want.Payload == nil) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			// A CloudEvent that does not also carry its id as the "id"
			// header (another producer's) is keyed by source and id.
			key := map[string]string{
				"binary from another producer":               "/outbox-cdc/shop/public.outbox e-1",
				"structured from another producer":           "/outbox-cdc/shop/public.outbox e-1",
				"the CloudEvents id wins":                    "/outbox-cdc/shop/public.outbox e-1",
				"structured text data":                       "/s e-2",
				"structured data_base64":                     "/s e-3",
				"structured without datacontenttype is JSON": "/s e-4",
			}[tc.name]
			if key == "" {
				key = tc.want.ID
			}
			if id := EventID(tc.rec); id != key {
				t.Errorf("EventID = %q, want %q", id, key)
			}
		})
	}
}

// TestEventOfUnreadable: a structured record that cannot be read is an
// error for the handler. The inbox still dedupes on the envelope's id when
// only the data is bad; else on the id header, then the offset.
func TestEventOfUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name, ct, value, err string
		id                   string // the id despite the error; "": none
	}{
		{"not JSON", "application/cloudevents+json", "{", "CloudEvents JSON: unexpected end of JSON input", ""},
		{"another event format", "application/cloudevents+avro", "x", `content-type "application/cloudevents+avro" is not the CloudEvents JSON format`, ""},
		{"both data members", "application/cloudevents+json", `{"id":"e","data":1,"data_base64":"AA=="}`, "both data and data_base64", "e"},
		{"bad base64", "application/cloudevents+json", `{"id":"e","data_base64":"%%"}`, "illegal base64", "e"},
		{"text data not a string", "application/cloudevents+json", `{"id":"e","datacontenttype":"text/plain","data":{}}`, "is not a JSON string", "e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &kgo.Record{Topic: "t", Partition: 1, Offset: 9, Value: []byte(tc.value), Headers: headers("content-type", tc.ct)}
			if _, err := EventOf(rec); err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "t/1/9") {
				t.Errorf("EventOf error %v, want %q naming t/1/9", err, tc.err)
			}
			if id := EventID(rec); id != cmp.Or(tc.id, "t/1/9") {
				t.Errorf("EventID = %q, want %q", id, cmp.Or(tc.id, "t/1/9"))
			}
			rec.Headers = append(rec.Headers, headers("id", "e-9")...)
			if id := EventID(rec); id != cmp.Or(tc.id, "e-9") {
				t.Errorf("EventID with an id header = %q", id)
			}
		})
	}
}

// TestDedupeKey: the inbox key is the id header (outbox-cdc sets it on every
// record); for a CloudEvent without it, source and id (the pair the
// specification makes unique); else the header Config.IDHeader names; else
// the record's position.
func TestDedupeKey(t *testing.T) {
	h := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	for _, tt := range []struct {
		name     string
		headers  []kgo.RecordHeader
		value    string
		idHeader string
		want     string
	}{
		{"plain", h("id", "e-1"), "", "", "e-1"},
		{"binary CloudEvent with the id header (outbox-cdc's)", h("id", "e-1", "ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/a"), "", "", "e-1"},
		{"binary CloudEvent without id header", h("ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/a"), "", "", "/a e-1"},
		{"same id, other source", h("ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/b"), "", "", "/b e-1"},
		{"structured CloudEvent", h("content-type", "application/cloudevents+json"), `{"specversion":"1.0","id":"e-2","source":"/s","type":"T"}`, "", "/s e-2"},
		{"named header", h("event_id", "e-3"), "", "event_id", "e-3"},
		{"named header absent", h("other", "x"), "", "event_id", "t/1/7"},
		{"nothing", nil, "", "", "t/1/7"},
	} {
		rec := &kgo.Record{Topic: "t", Partition: 1, Offset: 7, Headers: tt.headers, Value: []byte(tt.value)}
		got := EventID(rec)
		if tt.idHeader != "" {
			got = (&Consumer{cfg: Config{IDHeader: tt.idHeader}}).EventID(rec)
		}
		if got != tt.want {
			t.Errorf("%s: key %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestEventOfTxnPart: the parts of a transaction exactly_once committed in
// parts (wire.HeaderTxn, wire.HeaderTxnPart) are read; a malformed part is
// none, and a record without them belongs to a transaction committed whole.
func TestEventOfTxnPart(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  []string
		txn  string
		part int
		last bool
	}{
		{"whole", nil, "", 0, false},
		{"a part", []string{"txn", "734@0/16B3748", "txn_part", "2"}, "734@0/16B3748", 2, false},
		{"the last", []string{"txn", "734@0/16B3748", "txn_part", "3/3"}, "734@0/16B3748", 3, true},
		{"not n/n", []string{"txn", "734@0/16B3748", "txn_part", "3/4"}, "734@0/16B3748", 0, false},
		{"not a number", []string{"txn", "734@0/16B3748", "txn_part", "x"}, "734@0/16B3748", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := EventOf(&kgo.Record{Key: []byte("k"), Headers: headers(append([]string{"id", "e-1"}, tc.hdr...)...)})
			if err != nil {
				t.Fatal(err)
			}
			if ev.Txn != tc.txn || ev.Part != tc.part || ev.Last != tc.last {
				t.Fatalf("txn %q part %d last %v, want %q %d %v", ev.Txn, ev.Part, ev.Last, tc.txn, tc.part, tc.last)
			}
		})
	}
}
