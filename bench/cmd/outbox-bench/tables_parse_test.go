package main

import "testing"

// The event counters carry the outbox table as a label; every table counts.
func TestParsePromTableLabels(t *testing.T) {
	s := mustParse(t, `outbox_cdc_events_published_total{table="public.outbox"} 600
outbox_cdc_events_published_total{table="billing.events"} 400
outbox_cdc_events_dead_lettered_total{table="billing.events"} 2
`)
	if got := delivered(s); got != 1002 {
		t.Errorf("delivered = %d, want 1002 (both tables and the dead letters)", got)
	}
}
