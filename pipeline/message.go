package pipeline

import (
	"encoding/base64"
	"encoding/json"
	"sort"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

// emitted is the content of a table-less outbox event, written by
// outbox.Emit with pg_logical_emit_message(true, prefix, content).
type emitted struct {
	ID            *string           `json:"id"`
	AggregateType *string           `json:"aggregate_type"`
	AggregateID   *string           `json:"aggregate_id"`
	EventType     *string           `json:"event_type"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
	Headers       map[string]string `json:"headers"`
}

// parseMessage turns a logical message into an Event. Content that is not
// the documented JSON yields an Event marked Invalid, which is dead-lettered
// with the raw content as its value.
func parseMessage(content []byte) decode.Event {
	var e emitted
	if err := json.Unmarshal(content, &e); err != nil {
		return decode.Event{Invalid: "logical message is not an outbox event (JSON object expected): " + err.Error(),
			ID: decode.Value{Null: true}, AggregateType: decode.Value{Null: true}, AggregateID: decode.Value{Null: true},
			EventType: decode.Value{Null: true}, Payload: decode.Value{Bytes: content}}
	}
	ev := decode.Event{ID: ptrValue(e.ID), AggregateType: ptrValue(e.AggregateType),
		AggregateID: ptrValue(e.AggregateID), EventType: ptrValue(e.EventType)}
	switch {
	case e.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*e.PayloadBase64)
		if err != nil {
			ev.Invalid = "payload_base64 is not standard base64: " + err.Error()
		}
		ev.Payload = decode.Value{Bytes: b}
	case len(e.Payload) == 0 || string(e.Payload) == "null":
		ev.Payload = decode.Value{Null: true}
	default:
		ev.Payload = decode.Value{Bytes: e.Payload}
	}
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ev.Headers = append(ev.Headers, decode.Header{Name: k, Value: decode.Value{Bytes: []byte(e.Headers[k])}})
	}
	return ev
}

func ptrValue(s *string) decode.Value {
	if s == nil {
		return decode.Value{Null: true}
	}
	return decode.Value{Bytes: []byte(*s)}
}
