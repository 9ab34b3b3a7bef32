package replication

import (
	"reflect"
	"testing"
)

func TestSourceTables(t *testing.T) {
	src := Source{Slot: "s", Publication: "p", OutboxTable: OutboxTable{Schema: "public", Table: "outbox", Columns: []string{"id"}},
		Others: []OutboxTable{{Schema: "billing", Table: "events", Columns: []string{"event_id"}}}}
	ts := src.Tables()
	if len(ts) != 2 {
		t.Fatalf("%d tables, want 2", len(ts))
	}
	for i, want := range []OutboxTable{src.OutboxTable, src.Others[0]} {
		if !reflect.DeepEqual(ts[i].OutboxTable, want) || ts[i].Others != nil || ts[i].Slot != "s" || ts[i].Publication != "p" {
			t.Errorf("table %d: %+v, want %+v with the source's slot and publication and no others", i, ts[i], want)
		}
	}
	if got := ts[1].qualified(); got != `"billing"."events"` {
		t.Errorf("qualified = %s", got)
	}
	if one := (Source{OutboxTable: src.OutboxTable}).Tables(); len(one) != 1 {
		t.Errorf("a single-table source has %d tables", len(one))
	}
}
