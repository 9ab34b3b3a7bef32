package cdctest

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const page = `# HELP outbox_cdc_events_published_total Outbox events acknowledged.
# TYPE outbox_cdc_events_published_total counter
outbox_cdc_events_published_total{table="public.outbox"} 600
outbox_cdc_events_published_total{table="billing.events"} 400
outbox_cdc_connected 1
outbox_cdc_confirmed_lsn 1.2345e+07 1700000000000
outbox_cdc_commit_to_ack_seconds_bucket{table="a",le="0.01"} 3
outbox_cdc_commit_to_ack_seconds_bucket{table="b",le="0.01"} 1
outbox_cdc_commit_to_ack_seconds_bucket{table="a",le="+Inf"} 5
outbox_cdc_commit_to_ack_seconds_bucket{table="b",le="+Inf"} 2
outbox_cdc_commit_to_ack_seconds_sum 0.25
outbox_cdc_commit_to_ack_seconds_count 7
outbox_cdc_reason_total{reason="a b}c"} 2
`

func TestParseMetricsValues(t *testing.T) {
	m, err := ParseMetrics([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		want float64
	}{
		{"outbox_cdc_events_published_total", 1000}, // every table counts
		{"outbox_cdc_connected", 1},
		{"outbox_cdc_confirmed_lsn", 12345000},                             // the timestamp is not the value
		{"outbox_cdc_reason_total", 2},                                     // a label value with a space and a brace
		{`outbox_cdc_events_published_total{table="billing.events"}`, 400}, // one series by its labels
		{`outbox_cdc_commit_to_ack_seconds_bucket{table="a",le="+Inf"}`, 5},
	} {
		if v, err := m.Value(tt.name); err != nil || v != tt.want {
			t.Errorf("Value(%s) = %v, %v; want %v", tt.name, v, err, tt.want)
		}
	}
	// A prefix of a name is not the name; labels no series has are none.
	for _, name := range []string{"outbox_cdc_events_published", "outbox_cdc_commit_to_ack_seconds", "nope",
		`outbox_cdc_events_published_total{table="other"}`} {
		if v, err := m.Value(name); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("Value(%s) = %v, %v; want not found", name, v, err)
		}
		if m.Sum(name) != 0 {
			t.Errorf("Sum(%s) = %v, want 0", name, m.Sum(name))
		}
	}
}

func TestParseMetricsHistogram(t *testing.T) {
	m, err := ParseMetrics([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Histogram("outbox_cdc_commit_to_ack_seconds")
	if h.Count != 7 || h.Sum != 0.25 || len(h.Buckets) != 2 {
		t.Fatalf("histogram %+v", h)
	}
	// Series are summed per bound and sorted, +Inf last.
	if b := h.Buckets; b[0] != (Bucket{Le: 0.01, Count: 4}) || !math.IsInf(b[1].Le, 1) || b[1].Count != 7 {
		t.Fatalf("buckets %+v", b)
	}
	before := Histogram{Count: 2, Sum: 0.05, Buckets: []Bucket{{0.01, 1}, {math.Inf(1), 2}}}
	d := h.Minus(before)
	if d.Count != 5 || math.Abs(d.Sum-0.2) > 1e-12 || d.Buckets[0].Count != 3 || d.Buckets[1].Count != 5 {
		t.Fatalf("difference %+v", d)
	}
	if e := m.Histogram("absent"); e.Count != 0 || len(e.Buckets) != 0 {
		t.Fatalf("absent histogram %+v", e)
	}
}

// A malformed page is an error, not a metric that silently reads 0.
func TestParseMetricsRejectsMalformed(t *testing.T) {
	for _, line := range []string{
		"outbox_cdc_connected",
		"outbox_cdc_connected one",
		`outbox_cdc_connected{table="a" 1`,
		"outbox_cdc_connected 1 2 3",
		`x_bucket{table="a"} 1`,
		`x_bucket{le="big"} 1`,
		`{le="1"} 1`,
	} {
		if _, err := ParseMetrics([]byte("ok 1\n" + line + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: err %v, want one naming line 2", line, err)
		}
	}
}

func TestScrape(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(page))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	if v, err := Metric(context.Background(), addr, "outbox_cdc_connected"); err != nil || v != 1 {
		t.Fatalf("Metric = %v, %v", v, err)
	}
	status = http.StatusServiceUnavailable
	if _, err := Scrape(context.Background(), addr); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("Scrape of a 503: %v", err)
	}
}
