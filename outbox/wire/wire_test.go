package wire

import (
	"encoding/json"
	"testing"
)

// TestNames pins every name to its spelling on the wire: the constants are
// what producers, the connector and consumers share, so renaming one would
// change every record while all the code still compiled.
func TestNames(t *testing.T) {
	for got, want := range map[string]string{
		HeaderID:              "id",
		HeaderEventType:       "event_type",
		HeaderAggregateType:   "aggregate_type",
		HeaderError:           "error",
		HeaderTopic:           "topic",
		HeaderAggregateID:     "aggregate_id",
		HeaderPayloadOmitted:  "payload_omitted",
		HeaderTruncated:       "truncated",
		HeaderContractSubject: "contract_subject",
		HeaderContractVersion: "contract_version",
	} {
		if got != want {
			t.Errorf("header %q, want %q", got, want)
		}
	}
}

func TestReserved(t *testing.T) {
	for name, want := range map[string]bool{
		"id": true, "event_type": true, "aggregate_type": true,
		// aggregate_id is the key, not a header, except on dead letters.
		"aggregate_id": false, "error": false, "tenant": false, "": false, "ID": false,
	} {
		if got := Reserved(name); got != want {
			t.Errorf("Reserved(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestMessageJSON(t *testing.T) {
	s := func(v string) *string { return &v }
	b64 := "AAH/"
	for _, c := range []struct {
		m    Message
		want string
	}{
		{Message{ID: s("e1"), AggregateType: s("order"), AggregateID: s("o-1"), EventType: s("OrderPlaced"),
			Payload: json.RawMessage(`{"n":1}`), Headers: map[string]string{"z": "2", "tenant": "acme"}},
			`{"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"OrderPlaced","payload":{"n":1},"headers":{"tenant":"acme","z":"2"}}`},
		{Message{ID: s("e2"), AggregateType: s(""), AggregateID: s("o-1"), EventType: s("X"), PayloadBase64: &b64},
			`{"id":"e2","aggregate_type":"","aggregate_id":"o-1","event_type":"X","payload_base64":"AAH/"}`},
	} {
		b, err := json.Marshal(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.want {
			t.Errorf("marshal\n got %s\nwant %s", b, c.want)
		}
	}

	// Absent and null members are nil; "" is a value.
	var m Message
	if err := json.Unmarshal([]byte(`{"id":null,"aggregate_id":"","extra":[1]}`), &m); err != nil {
		t.Fatal(err)
	}
	if m.ID != nil || m.AggregateType != nil || m.EventType != nil || m.AggregateID == nil || *m.AggregateID != "" {
		t.Errorf("unmarshal: %+v", m)
	}
}
