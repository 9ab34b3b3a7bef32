package router

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

const testSource = "/outbox-cdc/shop/public.outbox"

func ceRouter(t *testing.T, format, contentType string) *Router {
	t.Helper()
	return mustNew(t, Config{Format: format, CloudEvents: CloudEvents{Source: testSource, ContentType: contentType}})
}

// The plain headers every record keeps, for event().
var plainHeaders = []hdr{{"id", "0b6f1c2e-0000-4000-8000-000000000001"}, {"event_type", "OrderCreated"}, {"aggregate_type", "order"}}

// ceHeaders are the binary-mode attribute headers for event() committed at
// commitTime, in the order the router writes them.
func ceHeaders(extra ...hdr) []hdr {
	h := append([]hdr(nil), plainHeaders...)
	h = append(h, hdr{"ce_specversion", "1.0"}, hdr{"ce_id", "0b6f1c2e-0000-4000-8000-000000000001"}, hdr{"ce_source", testSource},
		hdr{"ce_type", "OrderCreated"}, hdr{"ce_subject", "42"}, hdr{"ce_time", "2024-05-06T07:08:09.123Z"}, hdr{"ce_partitionkey", "42"})
	return append(h, extra...)
}

// TestCloudEventsBinary checks binary content mode against the Kafka
// protocol binding (3.2): every attribute but data as a ce_-prefixed UTF-8
// header, datacontenttype as the content-type header, data as the value
// unchanged, the key as before.
func TestCloudEventsBinary(t *testing.T) {
	bin := event()
	bin.Payload, bin.PayloadFormat = decode.Value{Bytes: []byte{0, 0xff, 'x'}}, decode.PayloadBinary
	text := event()
	text.Payload, text.PayloadFormat = val("hello"), decode.PayloadText
	json := event()
	json.PayloadFormat = decode.PayloadJSON
	tomb := json
	tomb.Payload = null
	emptySubject := json
	emptySubject.AggregateID = val("")
	badSubject := json
	badSubject.AggregateID = decode.Value{Bytes: []byte{0xff, 1}}
	withCols := json
	withCols.Headers = []decode.Header{{Name: "tenant", Value: val("acme")}}
	noSubject := append(append([]hdr(nil), ceHeaders()[:7]...), hdr{"ce_time", "2024-05-06T07:08:09.123Z"}, hdr{"content-type", "application/json"})
	otherZone := time.Date(2024, 5, 6, 9, 8, 9, 123_000_000, time.FixedZone("CEST", 2*3600))

	tests := []struct {
		name        string
		ev          decode.Event
		commit      time.Time
		contentType string // kafka.cloudevents.content_type
		value       []byte // nil: a tombstone
		headers     []hdr
	}{
		{"jsonb payload", json, commitTime, "", []byte(`{"total":10}`), ceHeaders(hdr{"content-type", "application/json"})},
		{"text payload", text, commitTime, "", []byte("hello"), ceHeaders(hdr{"content-type", "text/plain"})},
		{"bytea payload", bin, commitTime, "", []byte{0, 0xff, 'x'}, ceHeaders(hdr{"content-type", "application/octet-stream"})},
		{"configured content type", json, commitTime, "application/vnd.shop.order+json", []byte(`{"total":10}`),
			ceHeaders(hdr{"content-type", "application/vnd.shop.order+json"})},
		{"time in UTC, RFC 3339", json, otherZone, "", []byte(`{"total":10}`), ceHeaders(hdr{"content-type", "application/json"})},
		{"tombstone: no data, no content-type", tomb, commitTime, "", nil, ceHeaders()},
		{"header columns stay plain headers", withCols, commitTime, "", []byte(`{"total":10}`),
			append(append(append([]hdr(nil), plainHeaders...), hdr{"tenant", "acme"}), ceHeaders(hdr{"content-type", "application/json"})[3:]...)},
		{"empty aggregate id: no subject", emptySubject, commitTime, "", []byte(`{"total":10}`), noSubject},
		{"aggregate id not UTF-8: no subject", badSubject, commitTime, "", []byte(`{"total":10}`), noSubject},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ceRouter(t, FormatCEBinary, tc.contentType)
			var rec Record
			if reason := r.Route(&tc.ev, tc.commit, &rec); reason != "" {
				t.Fatalf("Route: %s", reason)
			}
			if !bytes.Equal(rec.Key, tc.ev.AggregateID.Bytes) || rec.Topic != "outbox.event.order" || !rec.Timestamp.Equal(tc.commit) {
				t.Errorf("key %q topic %q timestamp %v: the binding keeps the plain record's", rec.Key, rec.Topic, rec.Timestamp)
			}
			if (rec.Value == nil) != (tc.value == nil) || !bytes.Equal(rec.Value, tc.value) {
				t.Errorf("value %q, want %q", rec.Value, tc.value)
			}
			if !equalHeaders(rec.Headers, tc.headers) {
				t.Errorf("headers\n got %v\nwant %v", headersOf(rec.Headers), tc.headers)
			}
			checkBinding(t, &rec)
		})
	}
}

// checkBinding applies the binding's receiver rules to rec: binary mode
// (no content-type starting application/cloudevents) needs the required
// attributes as ce_ headers, valid UTF-8, a known specversion and an RFC 3339
// time; structured mode needs a JSON object with them.
func checkBinding(t *testing.T, rec *Record) {
	t.Helper()
	attrs := map[string]string{}
	ct := ""
	for _, h := range rec.Headers {
		switch {
		case h.Key == "content-type":
			ct = string(h.Value)
		case strings.HasPrefix(h.Key, "ce_"):
			attrs[h.Key[3:]] = string(h.Value)
		}
	}
	if strings.HasPrefix(ct, "application/cloudevents") {
		if ct != "application/cloudevents+json; charset=UTF-8" {
			t.Fatalf("structured content-type %q", ct)
		}
		if len(attrs) > 0 {
			t.Errorf("structured record with ce_ headers %v", attrs)
		}
		var env map[string]any
		if err := json.Unmarshal(rec.Value, &env); err != nil {
			t.Fatalf("structured value is not JSON: %v\n%s", err, rec.Value)
		}
		for k, v := range env {
			if s, ok := v.(string); ok && k != "data" && k != "data_base64" {
				attrs[k] = s
			}
		}
		if _, d := env["data"]; d {
			if _, b := env["data_base64"]; b {
				t.Errorf("data and data_base64 both present")
			}
		}
	}
	for _, req := range []string{"specversion", "id", "source", "type"} {
		if attrs[req] == "" {
			t.Errorf("required attribute %s missing (%v)", req, attrs)
		}
	}
	if attrs["specversion"] != "1.0" {
		t.Errorf("specversion %q", attrs["specversion"])
	}
	if _, err := time.Parse(time.RFC3339Nano, attrs["time"]); err != nil {
		t.Errorf("time %q is not RFC 3339: %v", attrs["time"], err)
	}
}

// TestCloudEventsStructured checks structured content mode: the content-type
// header names the JSON event format, the value is one JSON object with the
// attributes, and data follows json-format.md 3.1: JSON content byte for
// byte, text as a string, bytes as data_base64.
func TestCloudEventsStructured(t *testing.T) {
	const attrs = `{"specversion":"1.0","id":"0b6f1c2e-0000-4000-8000-000000000001","source":"/outbox-cdc/shop/public.outbox",` +
		`"type":"OrderCreated","subject":"42","time":"2024-05-06T07:08:09.123Z","partitionkey":"42",`
	spaced := event()
	spaced.Payload, spaced.PayloadFormat = val(`{ "total" : 10,  "note":"<&>" }`), decode.PayloadJSON
	text := event()
	text.Payload, text.PayloadFormat = val("line \"1\"\n"), decode.PayloadText
	jsonText := event()
	jsonText.Payload, jsonText.PayloadFormat = val(`[1, 2]`), decode.PayloadText
	notUTF8 := event()
	notUTF8.Payload, notUTF8.PayloadFormat = decode.Value{Bytes: []byte{'a', 0xff}}, decode.PayloadText
	bin := event()
	bin.Payload, bin.PayloadFormat = decode.Value{Bytes: []byte{0, 0xff, 'x'}}, decode.PayloadBinary
	empty := event()
	empty.Payload, empty.PayloadFormat = decode.Value{Bytes: []byte{}}, decode.PayloadText

	tests := []struct {
		name        string
		ev          decode.Event
		contentType string
		value       string
	}{
		{"json kept byte for byte", spaced, "", attrs + `"datacontenttype":"application/json","data":{ "total" : 10,  "note":"<&>" }}`},
		{"text as a JSON string", text, "", attrs + `"datacontenttype":"text/plain","data":"line \"1\"\n"}`},
		{"text under a configured JSON type", jsonText, "application/json", attrs + `"datacontenttype":"application/json","data":[1, 2]}`},
		{"text that is not UTF-8 as data_base64", notUTF8, "", attrs + `"datacontenttype":"text/plain","data_base64":"` +
			base64.StdEncoding.EncodeToString([]byte{'a', 0xff}) + `"}`},
		{"bytes as data_base64", bin, "", attrs + `"datacontenttype":"application/octet-stream","data_base64":"AP94"}`},
		{"bytes under a JSON type stay data_base64", bin, "application/json", attrs + `"datacontenttype":"application/json","data_base64":"AP94"}`},
		{"empty text", empty, "", attrs + `"datacontenttype":"text/plain","data":""}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ceRouter(t, FormatCEStructured, tc.contentType)
			var rec Record
			if reason := r.Route(&tc.ev, commitTime, &rec); reason != "" {
				t.Fatalf("Route: %s", reason)
			}
			if string(rec.Value) != tc.value {
				t.Errorf("value\n got %s\nwant %s", rec.Value, tc.value)
			}
			want := append(append([]hdr(nil), plainHeaders...), hdr{"content-type", "application/cloudevents+json; charset=UTF-8"})
			if !equalHeaders(rec.Headers, want) || string(rec.Key) != "42" {
				t.Errorf("key %q headers %v, want 42 and %v", rec.Key, headersOf(rec.Headers), want)
			}
			checkBinding(t, &rec)
		})
	}

	t.Run("tombstone stays a nil value, in binary mode", func(t *testing.T) {
		ev := event()
		ev.Payload = null
		var rec Record
		if reason := ceRouter(t, FormatCEStructured, "").Route(&ev, commitTime, &rec); reason != "" {
			t.Fatal(reason)
		}
		if rec.Value != nil || !equalHeaders(rec.Headers, ceHeaders()) {
			t.Errorf("value %q headers %v", rec.Value, headersOf(rec.Headers))
		}
		checkBinding(t, &rec)
	})
}

// TestCloudEventsRefused: rows that cannot be a CloudEvent get a reason and
// are dead-lettered as plain records.
func TestCloudEventsRefused(t *testing.T) {
	tests := []struct {
		name   string
		format string
		ct     string
		edit   func(*decode.Event)
		reason string
	}{
		{"NULL id", FormatCEBinary, "", func(e *decode.Event) { e.ID = null }, "id is NULL or empty, but a CloudEvent requires it"},
		{"empty id", FormatCEStructured, "", func(e *decode.Event) { e.ID = val("") }, "id is NULL or empty"},
		{"NULL event_type", FormatCEStructured, "", func(e *decode.Event) { e.EventType = null }, "event_type is NULL or empty"},
		{"event_type not UTF-8", FormatCEBinary, "", func(e *decode.Event) { e.EventType = decode.Value{Bytes: []byte{0xc3}} },
			"event_type is not valid UTF-8"},
		{"text that is not JSON under a JSON type", FormatCEStructured, "application/json",
			func(e *decode.Event) { e.Payload, e.PayloadFormat = val("nope"), decode.PayloadText },
			`payload is not JSON, but its datacontenttype "application/json" says it is`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ceRouter(t, tc.format, tc.ct)
			ev := event()
			tc.edit(&ev)
			var rec Record
			reason := r.Route(&ev, commitTime, &rec)
			if !strings.Contains(reason, tc.reason) || reason == "" {
				t.Fatalf("reason %q, want %q", reason, tc.reason)
			}
			r.DeadLetter(&ev, commitTime, reason, &rec)
			for _, h := range rec.Headers {
				if strings.HasPrefix(h.Key, "ce_") || h.Key == "content-type" {
					t.Errorf("dead letter has CloudEvents header %s", h.Key)
				}
			}
			if rec.Topic != defDLQ || !bytes.Equal(rec.Value, ev.Payload.Bytes) {
				t.Errorf("dead letter topic %q value %q", rec.Topic, rec.Value)
			}
		})
	}
}

// TestPlainUnchanged: the default format adds nothing.
func TestPlainUnchanged(t *testing.T) {
	for _, format := range []string{"", FormatPlain} {
		r := mustNew(t, Config{Format: format})
		ev := event()
		var rec Record
		if reason := r.Route(&ev, commitTime, &rec); reason != "" {
			t.Fatal(reason)
		}
		if !equalHeaders(rec.Headers, plainHeaders) || string(rec.Value) != `{"total":10}` {
			t.Errorf("format %q: headers %v value %s", format, headersOf(rec.Headers), rec.Value)
		}
	}
}

func TestCheckCloudEvents(t *testing.T) {
	tests := []struct {
		name   string
		format string
		ce     CloudEvents
		want   []string // "key: reason substring", in order
	}{
		{"defaults", FormatPlain, CloudEvents{Source: DefaultSource}, nil},
		{"binary with a content type", FormatCEBinary, CloudEvents{Source: DefaultSource, ContentType: "application/json; charset=utf-8"}, nil},
		{"absolute URI source", FormatCEStructured, CloudEvents{Source: "https://shop.example/{database}"}, nil},
		{"urn source", FormatCEStructured, CloudEvents{Source: "urn:shop:{table}"}, nil},
		{"unknown format", "avro", CloudEvents{Source: DefaultSource}, []string{"kafka.format: not supported"}},
		{"empty source", FormatCEBinary, CloudEvents{}, []string{"kafka.cloudevents.source: must not be empty"}},
		{"unknown placeholder", FormatCEBinary, CloudEvents{Source: "/x/{aggregate_type}"},
			[]string{"kafka.cloudevents.source: unknown placeholder {aggregate_type}"}},
		{"unmatched brace", FormatCEBinary, CloudEvents{Source: "/x/{table"}, []string{"kafka.cloudevents.source: unknown placeholder {table"}},
		{"not a URI reference", FormatCEBinary, CloudEvents{Source: "http://bad host/{table}"}, []string{"kafka.cloudevents.source: not a URI reference"}},
		{"content type with plain", FormatPlain, CloudEvents{Source: DefaultSource, ContentType: "application/json"},
			[]string{"kafka.cloudevents.content_type: set while kafka.format is plain"}},
		{"bad media type", FormatCEBinary, CloudEvents{Source: DefaultSource, ContentType: "json"},
			[]string{"kafka.cloudevents.content_type: not a media type"}},
		{"event format as content type", FormatCEBinary, CloudEvents{Source: DefaultSource, ContentType: "application/cloudevents+json"},
			[]string{"kafka.cloudevents.content_type: a CloudEvents event format"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckCloudEvents(tc.format, tc.ce)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i, p := range got {
				key, reason, _ := strings.Cut(tc.want[i], ": ")
				if p.Key != key || !strings.Contains(p.Reason, reason) {
					t.Errorf("problem %d = %s %q, want %s", i, p.Key, p.Reason, tc.want[i])
				}
			}
			_, err := New(Config{TopicTemplate: defTemplate, DLQTopic: defDLQ, Format: tc.format, CloudEvents: tc.ce})
			if (err != nil) != (len(tc.want) > 0 && tc.format != FormatPlain) {
				t.Errorf("New: %v", err)
			}
		})
	}
}

func TestExpandSource(t *testing.T) {
	got := ExpandSource(DefaultSource, "my db", "public", "out/box")
	if want := "/outbox-cdc/my%20db/public.out%2Fbox"; got != want {
		t.Errorf("ExpandSource = %q, want %q", got, want)
	}
	if got := ExpandSource("urn:x", "a", "b", "c"); got != "urn:x" {
		t.Errorf("no placeholders: %q", got)
	}
}
