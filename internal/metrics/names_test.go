package metrics

import "testing"

func TestSeriesNames(t *testing.T) {
	names, err := New().SeriesNames()
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]bool{
		"outbox_cdc_events_published_total":       true,
		"outbox_cdc_commit_to_ack_seconds_bucket": true, // histogram series
		"outbox_cdc_commit_to_ack_seconds_count":  true,
		"outbox_cdc_fatal_errors_total":           true, // a vector with no label value set yet
		"outbox_cdc_slot_wal_status":              true,
		"outbox_cdc_seconds_since_last_event":     true, // a GaugeFunc, registered but not a field
		"go_goroutines":                           true,
		"outbox_cdc_events_published_total_sum":   false,
		"outbox_cdc_connected_bucket":             false,
	} {
		if names[n] != want {
			t.Errorf("SeriesNames()[%s] = %v, want %v", n, names[n], want)
		}
	}
}
