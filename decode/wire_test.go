package decode

import "github.com/outbox-cdc/outbox-cdc/internal/pgwire"

// The wire builders live in internal/pgwire, shared with the pipeline's
// tests; this file keeps the decoder tests' outbox table.

// The outbox table used throughout the tests.
const (
	outboxID = 16390
	otherID  = 16400
)

func testMapping() Mapping {
	return Mapping{
		Schema: "public", Table: "outbox",
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
		EventType: "event_type", Payload: "payload",
		HeaderColumns: []string{"trace_id", "tenant"},
	}
}

func outboxCols() []pgwire.Col {
	return []pgwire.Col{
		{Name: "id", OID: pgwire.OIDUUID},
		{Name: "aggregate_type", OID: pgwire.OIDVarchar},
		{Name: "aggregate_id", OID: pgwire.OIDText},
		{Name: "event_type", OID: pgwire.OIDText},
		{Name: "payload", OID: pgwire.OIDJSONB},
		{Name: "trace_id", OID: pgwire.OIDText},
		{Name: "tenant", OID: pgwire.OIDText},
		{Name: "created_at", OID: pgwire.OIDTimestamptz},
	}
}

func outboxRelation() pgwire.Wire {
	return pgwire.Relation(outboxID, "public", "outbox", outboxCols()...)
}
