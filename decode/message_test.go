package decode

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

func txt(s string) Value { return Value{Bytes: []byte(s)} }

var null = Value{Null: true}

func TestParseMessage(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    *Event // nil: only Invalid is checked
		invalid string // substring of Invalid; "" for a valid event
	}{{
		name:    "every member",
		content: `{"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"Placed","payload":{"n": 1},"headers":{"z":"2","a":"1"},"future":true}`,
		want: &Event{ID: txt("e1"), AggregateType: txt("order"), AggregateID: txt("o-1"), EventType: txt("Placed"),
			Payload: txt(`{"n": 1}`), PayloadFormat: PayloadJSON, Headers: []Header{{"a", txt("1")}, {"z", txt("2")}}},
	}, {
		name:    "absent and null members are NULL, empty text is a value",
		content: `{"id":null,"aggregate_id":"","payload":null}`,
		want:    &Event{ID: null, AggregateType: null, AggregateID: txt(""), EventType: null, Payload: null},
	}, {
		name:    "no payload is a tombstone",
		content: `{"id":"e1","aggregate_type":"a","aggregate_id":"k","event_type":"t"}`,
		want:    &Event{ID: txt("e1"), AggregateType: txt("a"), AggregateID: txt("k"), EventType: txt("t"), Payload: null},
	}, {
		name:    "payload_base64 is the raw bytes",
		content: `{"id":"e1","aggregate_type":"a","aggregate_id":"k","event_type":"t","payload_base64":"AAH/"}`,
		want:    &Event{ID: txt("e1"), AggregateType: txt("a"), AggregateID: txt("k"), EventType: txt("t"), Payload: Value{Bytes: []byte{0, 1, 0xff}}, PayloadFormat: PayloadBinary},
	}, {
		name:    "bad base64",
		content: `{"id":"e1","aggregate_type":"a","aggregate_id":"k","event_type":"t","payload_base64":"%%"}`,
		invalid: "payload_base64 is not standard base64",
	}, {
		name:    "not a JSON object",
		content: `[1]`,
		want:    &Event{ID: null, AggregateType: null, AggregateID: null, EventType: null, Payload: txt(`[1]`)},
		// The reason goes into the dead letter's error header, which has
		// always named the type: it must stay decode.emitted.
		invalid: "logical message is not an outbox event (JSON object expected): json: cannot unmarshal array into Go value of type decode.emitted",
	}, {
		name:    "a member of the wrong type",
		content: `{"id":7}`,
		want:    &Event{ID: null, AggregateType: null, AggregateID: null, EventType: null, Payload: txt(`{"id":7}`)},
		invalid: "not an outbox event",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseMessage([]byte(tt.content))
			if tt.invalid == "" && got.Invalid != "" || !strings.Contains(got.Invalid, tt.invalid) {
				t.Fatalf("Invalid = %q, want %q", got.Invalid, tt.invalid)
			}
			if tt.want == nil {
				return
			}
			got.Invalid = ""
			if !reflect.DeepEqual(got, *tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestParseMessageReadsEmit: what outbox.Emit writes is read back as the
// event it was, for every kind of payload. The two ends share wire.Message;
// this checks they also agree on what its members mean.
func TestParseMessageReadsEmit(t *testing.T) {
	w, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		payload any
		want    Value
		format  PayloadFormat
	}{
		{json.RawMessage(`{ "qty" : 2 }`), txt(`{"qty":2}`), PayloadJSON}, // compacted by encoding/json
		{map[string]int{"qty": 2}, txt(`{"qty":2}`), PayloadJSON},
		{"text", txt(`"text"`), PayloadJSON},
		{[]byte{0xff, 0, 'a'}, Value{Bytes: []byte{0xff, 0, 'a'}}, PayloadBinary},
		{[]byte{}, Value{Bytes: []byte{}}, PayloadBinary},
		{nil, null, PayloadText},
		{[]byte(nil), null, PayloadText},
		{json.RawMessage(nil), null, PayloadText},
	} {
		content, err := w.EncodeMessage(outbox.Event{ID: "e1", AggregateType: "order", AggregateID: "o-1", EventType: "Placed",
			Payload: c.payload, Headers: map[string]any{"tenant": "acme", "n": 7, "skip": nil}})
		if err != nil {
			t.Fatal(err)
		}
		got := ParseMessage(content)
		want := Event{ID: txt("e1"), AggregateType: txt("order"), AggregateID: txt("o-1"), EventType: txt("Placed"),
			Payload: c.want, PayloadFormat: c.format, Headers: []Header{{"n", txt("7")}, {"tenant", txt("acme")}}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("payload %#v: content %s\n got %+v\nwant %+v", c.payload, content, got, want)
		}
	}
}
