package config

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestWarnsWithoutIDHeader: outbox.standard_headers without id leaves plain
// records with no event id, so inbox consumers fall back to the record's
// position and process replays and repairs again: a warning at load.
func TestWarnsWithoutIDHeader(t *testing.T) {
	c := withRequired()
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("default configuration warns: %v", w)
	}
	c.Outbox.StandardHeaders = []string{"event_type", "aggregate_type"}
	w := c.Warnings()
	if len(w) != 1 || w[0].Key != "outbox.standard_headers" || !strings.Contains(w[0].Problem, "no id header") {
		t.Fatalf("standard_headers without id: %v", w)
	}
	c.Outbox.StandardHeaders = []string{}
	if w := c.Warnings(); len(w) != 1 {
		t.Fatalf("standard_headers empty: %v", w)
	}
	// CloudEvents records carry their id as an attribute, which the inbox reads.
	c.Kafka.Format = router.FormatCEBinary
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("CloudEvents format without the id header warns: %v", w)
	}
	// Per table: only the table that leaves id out.
	c = withRequired()
	c.Outbox.Tables = []OutboxTable{{Table: "public.a"}, {Table: "public.b", StandardHeaders: []string{"event_type"}}}
	w = c.Warnings()
	if len(w) != 1 || w[0].Key != "outbox.tables[1].standard_headers" {
		t.Fatalf("per-table standard_headers without id: %v", w)
	}
}
