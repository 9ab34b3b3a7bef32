package decode

import (
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
)

// TestPayloadFormat: an Insert's PayloadFormat follows the payload column's
// type in the Relation message, whatever the value holds.
func TestPayloadFormat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		oid     uint32
		payload string
		want    PayloadFormat
	}{
		{"jsonb", pgwire.OIDJSONB, `{"a":1}`, PayloadJSON},
		{"json", pgwire.OIDJSON, `{ "a" : 1 }`, PayloadJSON},
		{"bytea", pgwire.OIDBytea, `\x00ff`, PayloadBinary},
		{"text", pgwire.OIDText, `{"a":1}`, PayloadText},
		{"varchar", pgwire.OIDVarchar, "hello", PayloadText},
		{"domain or other type", 16385, "<x/>", PayloadText},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rel := pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID},
				pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText}, pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText},
				pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: tc.oid})
			ins := pgwire.Insert(outboxID, pgwire.Txt("e1"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(tc.payload))
			m := testMapping()
			m.HeaderColumns = nil
			res := mustDecode(t, NewDecoder(m), rel, ins)
			if res.Kind != KindEvent || res.Event.Invalid != "" {
				t.Fatalf("kind %v, invalid %q", res.Kind, res.Event.Invalid)
			}
			if got := res.Event.PayloadFormat; got != tc.want {
				t.Errorf("PayloadFormat = %d, want %d", got, tc.want)
			}
		})
	}
}
