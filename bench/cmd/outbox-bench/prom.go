package main

import (
	"math"
	"sort"
	"strconv"
	"strings"
)

const (
	metricPublished    = "outbox_cdc_events_published_total"
	metricDeadLettered = "outbox_cdc_events_dead_lettered_total"
	metricCommitToAck  = "outbox_cdc_commit_to_ack_seconds"
)

// promSamples is the part of a /metrics page the benchmark reads: unlabeled
// samples by name and the commit-to-ack histogram.
type promSamples struct {
	values map[string]float64
	ack    histogram
}

// histogram is a cumulative Prometheus histogram.
type histogram struct {
	buckets []bucket // ascending le, cumulative counts, +Inf last
	count   float64
	sum     float64
}

type bucket struct {
	le    float64
	count float64
}

func (s promSamples) delivered() int64 {
	return int64(s.values[metricPublished] + s.values[metricDeadLettered])
}

// parseProm reads the text exposition format, enough for counters, gauges
// and one histogram. Malformed lines are skipped.
func parseProm(b []byte) promSamples {
	s := promSamples{values: map[string]float64{}}
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		series := line[:sp]
		name, labels, _ := strings.Cut(series, "{")
		switch name {
		case metricCommitToAck + "_bucket":
			le := labelValue(labels, "le")
			ub, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				ub, err = math.Inf(1), nil
			}
			if err == nil {
				s.ack.buckets = append(s.ack.buckets, bucket{le: ub, count: v})
			}
		case metricCommitToAck + "_count":
			s.ack.count = v
		case metricCommitToAck + "_sum":
			s.ack.sum = v
		case metricPublished, metricDeadLettered: // labelled by outbox table: the sum
			s.values[name] += v
		default:
			if labels == "" {
				s.values[name] = v
			}
		}
	}
	sort.Slice(s.ack.buckets, func(i, j int) bool { return s.ack.buckets[i].le < s.ack.buckets[j].le })
	return s
}

func labelValue(labels, key string) string {
	for kv := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// minus returns h - before (the observations between two scrapes).
func (h histogram) minus(before histogram) histogram {
	out := histogram{count: h.count - before.count, sum: h.sum - before.sum}
	for i, b := range h.buckets {
		c := b.count
		if i < len(before.buckets) && before.buckets[i].le == b.le {
			c -= before.buckets[i].count
		}
		out.buckets = append(out.buckets, bucket{le: b.le, count: c})
	}
	return out
}

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

func (h histogram) quantiles() *HistQuantiles {
	if h.count <= 0 || len(h.buckets) == 0 {
		return nil
	}
	q := &HistQuantiles{Count: int64(h.count), MeanMs: h.sum / h.count * 1000}
	q.P50UpperMs, q.P50EstimateMs = h.quantile(0.5)
	q.P99UpperMs, q.P99EstimateMs = h.quantile(0.99)
	q.P999UpperMs, _ = h.quantile(0.999)
	q.MaxUpperMs, _ = h.quantile(1)
	prev := 0.0
	for _, b := range h.buckets {
		q.Buckets = append(q.Buckets, HistBucket{LeMs: msOrInf(b.le), Count: int64(b.count - prev)})
		prev = b.count
	}
	return q
}

// quantile returns the upper bound of the bucket holding quantile q and a
// linear estimate inside it, both in ms (-1 for +Inf, which JSON cannot hold).
func (h histogram) quantile(q float64) (upper, estimate float64) {
	rank := q * h.count
	prevLe, prevCount := 0.0, 0.0
	for _, b := range h.buckets {
		if b.count >= rank && b.count > 0 {
			if math.IsInf(b.le, 1) {
				return -1, -1
			}
			est := b.le
			if b.count > prevCount {
				est = prevLe + (b.le-prevLe)*(rank-prevCount)/(b.count-prevCount)
			}
			return b.le * 1000, est * 1000
		}
		prevLe, prevCount = b.le, b.count
	}
	return -1, -1
}

func msOrInf(s float64) float64 {
	if math.IsInf(s, 1) {
		return -1
	}
	return s * 1000
}
