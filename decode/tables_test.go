package decode

import (
	"errors"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
)

// Two outbox tables with different column names and header columns: each
// Insert is mapped by its own table's mapping and says which table it is.
func TestTablesDecoder(t *testing.T) {
	billing := Mapping{Schema: "billing", Table: "events", ID: "event_id", AggregateType: "kind",
		AggregateID: "invoice_id", EventType: "name", Payload: "body", HeaderColumns: []string{"region"}}
	d := NewTablesDecoder([]Mapping{testMapping(), billing})
	mustDecode(t, d, outboxRelation())
	rel := mustDecode(t, d, pgwire.Relation(9001, "billing", "events",
		pgwire.Col{Name: "body", OID: pgwire.OIDText}, pgwire.Col{Name: "event_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "region", OID: pgwire.OIDText}, pgwire.Col{Name: "kind", OID: pgwire.OIDText},
		pgwire.Col{Name: "invoice_id", OID: pgwire.OIDText}, pgwire.Col{Name: "name", OID: pgwire.OIDText}))
	if ri := rel.Relation; !ri.Outbox || ri.Table != 1 || ri.Invalid != "" {
		t.Fatalf("billing relation %+v, want outbox table 1, valid", ri)
	}
	mustDecode(t, d, pgwire.Relation(9002, "public", "other", pgwire.Col{Name: "x", OID: pgwire.OIDText}))

	res := mustDecode(t, d, pgwire.Insert(9001, pgwire.Txt("{}"), pgwire.Txt("e1"), pgwire.Txt("eu"),
		pgwire.Txt("invoice"), pgwire.Txt("inv-7"), pgwire.Txt("Paid")))
	ev := res.Event
	if res.Kind != KindEvent || ev.Table != 1 || ev.Invalid != "" {
		t.Fatalf("billing insert: kind %v table %d invalid %q", res.Kind, ev.Table, ev.Invalid)
	}
	checkValue(t, "id", ev.ID, val("e1"))
	checkValue(t, "aggregate_type", ev.AggregateType, val("invoice"))
	checkValue(t, "aggregate_id", ev.AggregateID, val("inv-7"))
	checkValue(t, "event_type", ev.EventType, val("Paid"))
	checkValue(t, "payload", ev.Payload, val("{}"))
	if len(ev.Headers) != 1 || ev.Headers[0].Name != "region" || !eqValue(ev.Headers[0].Value, val("eu")) {
		t.Errorf("billing headers %+v, want region=eu", ev.Headers)
	}

	res = mustDecode(t, d, pgwire.Insert(outboxID, pgwire.Txt("00000000-0000-0000-0000-000000000001"), pgwire.Txt("order"),
		pgwire.Txt("o-1"), pgwire.Txt("Created"), pgwire.Txt("{}"), pgwire.Txt("tr"), pgwire.Txt("acme"), pgwire.Null()))
	if ev := res.Event; res.Kind != KindEvent || ev.Table != 0 || len(ev.Headers) != 2 || ev.Headers[1].Name != "tenant" {
		t.Fatalf("outbox insert: kind %v table %d headers %+v", res.Kind, ev.Table, ev.Headers)
	}
	if res := mustDecode(t, d, pgwire.Insert(9002, pgwire.Txt("x"))); res.Kind != KindSkip {
		t.Errorf("insert into another table: kind %v, want skip", res.Kind)
	}

	// An outbox table that now carries the other outbox table's name is a
	// rename: its rows would be mapped with the wrong columns.
	_, err := d.Decode(pgwire.Relation(9001, "public", "outbox", outboxCols()...))
	if !errors.Is(err, ErrTableRenamed) {
		t.Errorf("billing relation renamed to public.outbox: err %v, want ErrTableRenamed", err)
	}
}

func TestTablesDecoderAllocs(t *testing.T) {
	billing := Mapping{Schema: "billing", Table: "events", ID: "id", AggregateType: "aggregate_type",
		AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload", HeaderColumns: []string{"tenant"}}
	d := NewTablesDecoder([]Mapping{testMapping(), billing})
	mustDecode(t, d, pgwire.Relation(9001, "billing", "events", outboxCols()...))
	ins := pgwire.Insert(9001, pgwire.Txt("e"), pgwire.Txt("t"), pgwire.Txt("a"), pgwire.Txt("x"), pgwire.Txt("{}"),
		pgwire.Txt("tr"), pgwire.Txt("acme"), pgwire.Null())
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(ins) }); n != 0 {
		t.Errorf("%v allocations per insert into the second table, want 0", n)
	}
}
