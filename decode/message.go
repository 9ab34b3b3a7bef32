package decode

import (
	"encoding/base64"
	"encoding/json"
	"sort"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// emitted is wire.Message under the name that encoding/json's errors have
// always given it: an unreadable message is dead-lettered with the error
// text in its error header, which names the type ("... of type
// decode.emitted").
type emitted wire.Message

// ParseMessage turns the content of a table-less outbox event (wire.Message,
// written by outbox.Emit) into an Event. Content that is not that JSON object
// yields an Event marked Invalid, which is dead-lettered with the raw content
// as its value. A member that is absent or null is a NULL value, as the
// column of a table event would be.
func ParseMessage(content []byte) Event {
	var e emitted
	if err := json.Unmarshal(content, &e); err != nil {
		return Event{Invalid: "logical message is not an outbox event (JSON object expected): " + err.Error(),
			ID: Value{Null: true}, AggregateType: Value{Null: true}, AggregateID: Value{Null: true},
			EventType: Value{Null: true}, Payload: Value{Bytes: content}}
	}
	ev := Event{ID: ptrValue(e.ID), AggregateType: ptrValue(e.AggregateType),
		AggregateID: ptrValue(e.AggregateID), EventType: ptrValue(e.EventType)}
	switch {
	case e.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*e.PayloadBase64)
		if err != nil {
			ev.Invalid = "payload_base64 is not standard base64: " + err.Error()
		}
		ev.Payload, ev.PayloadFormat = Value{Bytes: b}, PayloadBinary
	case len(e.Payload) == 0 || string(e.Payload) == "null":
		ev.Payload = Value{Null: true}
	default:
		ev.Payload, ev.PayloadFormat = Value{Bytes: e.Payload}, PayloadJSON
	}
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ev.Headers = append(ev.Headers, Header{Name: k, Value: Value{Bytes: []byte(e.Headers[k])}})
	}
	return ev
}

func ptrValue(s *string) Value {
	if s == nil {
		return Value{Null: true}
	}
	return Value{Bytes: []byte(*s)}
}
