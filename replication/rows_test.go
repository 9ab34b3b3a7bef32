package replication

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

func TestSnapshotSQL(t *testing.T) {
	m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
		Payload: "payload", HeaderColumns: []string{"tenant"}}
	tests := []struct {
		name  string
		by    string
		pk    []string
		bytea bool
		want  string // the query's tail
	}{
		{"primary key", "", []string{"id"}, false, `FROM "public"."outbox" WHERE (status = 'PENDING') ORDER BY "id"`},
		{"composite key", "", []string{"tenant", "seq"}, false, `ORDER BY "tenant", "seq"`},
		{"column, key breaks ties", "created_at", []string{"id"}, true, `ORDER BY "created_at", (cmin::text::bigint), "ctid", "id"`},
		{"column that is the key", "id", []string{"id"}, false, `ORDER BY "id", (cmin::text::bigint), "ctid"`},
		{"column, no key", "created_at", nil, false, `ORDER BY "created_at", (cmin::text::bigint), "ctid"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := snapshotSQL(m, "public", "outbox", tt.bytea, "status = 'PENDING'", orderColumns(tt.by, tt.pk))
			if !strings.HasSuffix(q, tt.want) {
				t.Fatalf("query %s\nwant it to end with %s", q, tt.want)
			}
			payload := `convert_to("payload"::text, 'UTF8')`
			if tt.bytea {
				payload = `"payload", `
			}
			if !strings.Contains(q, payload) || !strings.Contains(q, `"tenant"::text FROM`) {
				t.Fatalf("query %s: wrong columns", q)
			}
		})
	}
	if got := orderColumns("", nil); len(got) != 0 {
		t.Fatalf("no key, no column: %v, want none (refused by snapshotOrder)", got)
	}
}
