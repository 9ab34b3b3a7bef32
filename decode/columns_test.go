package decode

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
)

// Mapping.Columns arrive in Event.Columns, in their order, with their type
// OIDs; one the table lacks makes the row Invalid like any mapped column.
func TestInsertColumns(t *testing.T) {
	const uuid = "0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11"
	m := testMapping()
	m.Columns = []string{"created_at", "tenant", "gone"}
	rel := pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID},
		pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText}, pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: pgwire.OIDBytea},
		pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: pgwire.OIDVarchar},
		pgwire.Col{Name: "created_at", OID: pgwire.OIDTimestamptz})
	ins := pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`\x00ff`),
		pgwire.Txt("t"), pgwire.Txt("acme"), pgwire.Null())
	res := mustDecode(t, NewDecoder(m), rel, ins)
	ev := res.Event
	want := []Column{{Name: "created_at", Value: Value{Null: true}, Type: pgwire.OIDTimestamptz},
		{Name: "tenant", Value: val("acme"), Type: pgwire.OIDVarchar}, {Name: "gone"}}
	if len(ev.Columns) != len(want) {
		t.Fatalf("columns %+v, want %+v", ev.Columns, want)
	}
	for i, w := range want {
		g := ev.Columns[i]
		if g.Name != w.Name || g.Type != w.Type || g.Value.Null != w.Value.Null || string(g.Value.Bytes) != string(w.Value.Bytes) {
			t.Errorf("column %d = %+v, want %+v", i, g, w)
		}
	}
	if len(ev.Headers) != 2 || ev.Headers[1].Name != "tenant" {
		t.Errorf("headers %+v: a column in both lists is a header too", ev.Headers)
	}
	if ev.PayloadFormat != PayloadBinary || string(ev.Payload.Bytes) != "\x00\xff" {
		t.Errorf("payload %q binary %v, want raw bytes marked binary", ev.Payload.Bytes, ev.PayloadFormat)
	}
	if !strings.Contains(ev.Invalid, `"gone"`) {
		t.Errorf("Invalid = %q, want the missing column named", ev.Invalid)
	}
}
