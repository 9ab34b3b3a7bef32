package main

import (
	"math"
	"slices"
)

// Percentiles summarise per-event latencies, in ms (nearest-rank).
type Percentiles struct {
	N      int     `json:"n"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func percentiles(ms []float64) Percentiles {
	if len(ms) == 0 {
		return Percentiles{}
	}
	v := slices.Clone(ms)
	slices.Sort(v)
	rank := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(v)))) - 1
		return v[max(0, min(i, len(v)-1))]
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	return Percentiles{
		N: len(v), MeanMs: sum / float64(len(v)),
		P50Ms: rank(0.5), P90Ms: rank(0.9), P99Ms: rank(0.99), P999Ms: rank(0.999), MaxMs: v[len(v)-1],
	}
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}
