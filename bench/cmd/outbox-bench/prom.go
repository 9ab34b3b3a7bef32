package main

import (
	"math"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

const (
	metricPublished    = "outbox_cdc_events_published_total"
	metricDeadLettered = "outbox_cdc_events_dead_lettered_total"
	metricCommitToAck  = "outbox_cdc_commit_to_ack_seconds"
)

// delivered is published + dead-lettered, summed over the outbox tables
// (the counters' table label).
func delivered(m cdctest.Metrics) int64 {
	return int64(m.Sum(metricPublished) + m.Sum(metricDeadLettered))
}

// commitToAck is the connector's commit-to-ack histogram.
func commitToAck(m cdctest.Metrics) cdctest.Histogram { return m.Histogram(metricCommitToAck) }

// HistQuantiles are quantiles read from the connector's histogram, in ms.
// UpperBound values are the bucket bounds the quantile falls under (what the
// histogram can prove); Estimate values interpolate linearly inside the
// bucket, as PromQL's histogram_quantile does.
type HistQuantiles struct {
	Count         int64        `json:"count"`
	MeanMs        float64      `json:"mean_ms"`
	P50UpperMs    float64      `json:"p50_upper_ms"`
	P99UpperMs    float64      `json:"p99_upper_ms"`
	P999UpperMs   float64      `json:"p999_upper_ms"`
	MaxUpperMs    float64      `json:"max_upper_ms"`
	P50EstimateMs float64      `json:"p50_estimate_ms"`
	P99EstimateMs float64      `json:"p99_estimate_ms"`
	Buckets       []HistBucket `json:"buckets"`
}

// HistBucket is one non-cumulative histogram bucket (le -1 is +Inf).
type HistBucket struct {
	LeMs  float64 `json:"le_ms"`
	Count int64   `json:"count"`
}

// quantiles reads h; nil when it holds no observation.
func quantiles(h cdctest.Histogram) *HistQuantiles {
	if h.Count <= 0 || len(h.Buckets) == 0 {
		return nil
	}
	q := &HistQuantiles{Count: int64(h.Count), MeanMs: h.Sum / h.Count * 1000}
	q.P50UpperMs, q.P50EstimateMs = quantile(h, 0.5)
	q.P99UpperMs, q.P99EstimateMs = quantile(h, 0.99)
	q.P999UpperMs, _ = quantile(h, 0.999)
	q.MaxUpperMs, _ = quantile(h, 1)
	prev := 0.0
	for _, b := range h.Buckets {
		q.Buckets = append(q.Buckets, HistBucket{LeMs: msOrInf(b.Le), Count: int64(b.Count - prev)})
		prev = b.Count
	}
	return q
}

// quantile returns the upper bound of the bucket holding quantile q and a
// linear estimate inside it, both in ms (-1 for +Inf, which JSON cannot hold).
func quantile(h cdctest.Histogram, q float64) (upper, estimate float64) {
	rank := q * h.Count
	prevLe, prevCount := 0.0, 0.0
	for _, b := range h.Buckets {
		if b.Count >= rank && b.Count > 0 {
			if math.IsInf(b.Le, 1) {
				return -1, -1
			}
			est := b.Le
			if b.Count > prevCount {
				est = prevLe + (b.Le-prevLe)*(rank-prevCount)/(b.Count-prevCount)
			}
			return b.Le * 1000, est * 1000
		}
		prevLe, prevCount = b.Le, b.Count
	}
	return -1, -1
}

func msOrInf(s float64) float64 {
	if math.IsInf(s, 1) {
		return -1
	}
	return s * 1000
}
