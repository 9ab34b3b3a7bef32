package main

import (
	"strings"
	"testing"
	"time"
)

// latencyRun is a one-row run at rate: p50 and p99 in ms, connector and
// broker CPU in µs per event over 1,000,000 events.
func latencyRun(system string, rate int, p50, p99, connUs, brokerUs float64) SteadyResult {
	s := frontierRun(system, "", rate, p99, connUs, brokerUs)
	s.CommitToConsume.P50Ms = p50
	return s
}

func TestMinimalTargets(t *testing.T) {
	deadline(t, 5*time.Second)
	type want struct{ name, status, measured string }
	cases := []struct {
		name  string
		r     Results
		wants []want
	}{{
		name: "the default within every ratio",
		r: Results{Params: Params{Rates: []int{500, 2000}}, Steady: []SteadyResult{
			latencyRun("minimal", 500, 11, 14, 40, 60), latencyRun("outbox-cdc", 500, 0.8, 4, 55, 80),
			latencyRun("minimal", 2000, 11, 15, 30, 40), latencyRun("outbox-cdc", 2000, 2, 9, 32, 44),
		}},
		wants: []want{
			{issue39 + "default latency at 500 events/s", statusMet, "p50 0.80 ms, p99 4.00 ms (minimal: p50 11.0 ms, p99 14.0 ms)"},
			{issue39 + "default connector CPU per event vs minimal at 500 events/s", statusMet, "55.0 µs vs 40.0 µs = 1.38×"},
			{issue39 + "default broker CPU per event vs minimal at 500 events/s", statusMet, "80.0 µs vs 60.0 µs = 1.33×"},
			{issue39 + "default latency at 2,000 events/s", statusMet, "p99 9.00 ms"},
			{issue39 + "default connector CPU per event vs minimal at 2,000 events/s", statusMet, "= 1.07×"},
			{issue39 + "default broker CPU per event vs minimal at 2,000 events/s", statusMet, "= 1.10×"},
			{issue39 + "default p99 vs minimal, every steady rate", statusMet, "500/s: 4.00 ms vs 14.0 ms; 2,000/s: 9.00 ms vs 15.0 ms"},
		},
	}, {
		name: "a p50 past 1 ms, CPU past the ratios, slower than the minimal",
		r: Results{Params: Params{Rates: []int{500, 2000}}, Steady: []SteadyResult{
			latencyRun("minimal", 500, 11, 3, 40, 60), latencyRun("outbox-cdc", 500, 1.5, 4, 70, 95),
			latencyRun("minimal", 2000, 11, 15, 30, 40), latencyRun("outbox-cdc", 2000, 2, 9, 34, 40),
		}},
		wants: []want{
			{issue39 + "default latency at 500 events/s", statusNotMet, "p50 1.50 ms"},
			{issue39 + "default connector CPU per event vs minimal at 500 events/s", statusNotMet, "= 1.75×"},
			{issue39 + "default broker CPU per event vs minimal at 500 events/s", statusNotMet, "= 1.58×"},
			{issue39 + "default connector CPU per event vs minimal at 2,000 events/s", statusNotMet, "= 1.13×"},
			{issue39 + "default p99 vs minimal, every steady rate", statusNotMet, "500/s: 4.00 ms vs 3.00 ms"},
		},
	}, {
		name: "no minimal run, and a 10-row run that must not count",
		r: Results{Params: Params{Rates: []int{500}}, Steady: []SteadyResult{
			latencyRun("outbox-cdc", 500, 0.8, 4, 55, 80),
			func() SteadyResult { s := latencyRun("minimal", 500, 11, 14, 40, 60); s.TxRows = 10; return s }(),
		}},
		wants: []want{
			{issue39 + "default latency at 500 events/s", statusMet, "p99 4.00 ms"},
			{issue39 + "default connector CPU per event vs minimal at 500 events/s", statusNotMeasured, ""},
			{issue39 + "default p99 vs minimal, every steady rate", statusNotMeasured, ""},
		},
	}, {
		name: "drain and capacity",
		r: Results{
			Drains: []DrainResult{
				{TxSize: 1, Connector: ConnectorRun{ReaderRun: ReaderRun{Seconds: 10, EventsPerSec: 100_000}},
					Minimal: &ConnectorRun{ReaderRun: ReaderRun{Seconds: 12, EventsPerSec: 80_000}}, MinimalRatio: 1.25},
				{TxSize: 1000, Connector: ConnectorRun{ReaderRun: ReaderRun{Seconds: 10, EventsPerSec: 100_000}},
					Minimal: &ConnectorRun{ReaderRun: ReaderRun{Seconds: 8, EventsPerSec: 125_000}}, MinimalRatio: 0.8},
			},
			Capacity: []CapacityResult{
				{System: "outbox-cdc", Capacity: 8000, Stopped: "converged", Probes: probes("2000+", "4000+", "8000+", "16000-")},
				{System: "minimal", Capacity: 6000, Stopped: "converged", Probes: probes("6000+")},
				{System: "outbox-cdc-linger0s", Linger: "0s", Capacity: 4000, Probes: probes("4000+")},
				{System: "outbox-cdc-linger10ms", Linger: "10ms", Capacity: 9000, Probes: probes("9000+")},
			},
		},
		wants: []want{
			{issue39 + "drain rate vs minimal, 1-event transactions", statusMet, "100,000 vs 80,000 events/s = 1.25×"},
			{issue39 + "drain rate vs minimal, 1,000-event transactions", statusNotMet, "= 0.80×"},
			{issue39 + "capacity vs minimal", statusMet, "8,000 vs 6,000 events/s"},
			{issue39 + "capacity vs fixed lingers", statusNotMet, "8,000 events/s vs linger 0s 4,000/s, linger 10ms 9,000/s"},
		},
	}, {
		name: "no probe of the default or the minimal passed",
		r: Results{Capacity: []CapacityResult{
			{System: "outbox-cdc", Stopped: "probe limit (3)", Probes: probes("2000-", "1000-", "500-")},
			{System: "minimal", Stopped: "probe limit (3)", Probes: probes("2000-", "1000-", "500-")},
		}},
		wants: []want{{issue39 + "capacity vs minimal", statusNotMeasured, "0 vs 0 events/s"}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]Target{}
			for _, tg := range minimalTargets(&c.r) {
				got[tg.Name] = tg
			}
			for _, w := range c.wants {
				tg, ok := got[w.name]
				if !ok {
					t.Fatalf("no target %q in %v", w.name, got)
				}
				if tg.Status != w.status || !strings.Contains(tg.Measured, w.measured) {
					t.Errorf("%s: status %q measured %q, want %q containing %q", w.name, tg.Status, tg.Measured, w.status, w.measured)
				}
			}
		})
	}
}

func TestRenderMinimalAndCapacity(t *testing.T) {
	deadline(t, 5*time.Second)
	tx10 := latencyRun("minimal", 500, 12, 20, 30, 50)
	tx10.TxRows = 10
	r := &Results{
		Params: Params{Rates: []int{500}, Events: 20000, Writers: 16, CapacityP99Ms: 50, CapacityDuration: "5s"},
		Steady: []SteadyResult{latencyRun("minimal", 500, 11, 14, 40, 60), latencyRun("outbox-cdc", 500, 0.8, 4, 55, 80), tx10},
		Drains: []DrainResult{{TxSize: 1, Events: 20000, Transactions: 20000,
			RecvLogical: ReaderRun{EventsPerSec: 52919}, Connector: ConnectorRun{ReaderRun: ReaderRun{EventsPerSec: 13827}},
			MinimalRuns: []ConnectorRun{{ReaderRun: ReaderRun{Seconds: 0.53, EventsPerSec: 37771, CPU: CPUUsage{Client: 0.116}},
				PeakRSSBytes: 51e6, Verified: Verified{Distinct: 20000}}}}},
		Capacity: []CapacityResult{{System: "minimal", Capacity: 2000, Stopped: "probe limit (3)", Probes: []CapacityProbe{
			{Rate: 1000, Passed: true, P50Ms: 12, P99Ms: 30},
			{Rate: 2000, Passed: true, P50Ms: 12, P99Ms: 40, ConnectorUs: 25, BrokerUs: 60, WALSenderUs: 20, BusyCores: 1.2},
			{Rate: 4000, Reason: "p99 102 ms"}}}},
	}
	r.Drains[0].summarize()
	md := renderReport(r, "", nil)
	for _, s := range []string{
		"## Against the minimal connector (issue 39)",
		"| 500 | minimal | 500 | 11.0 / 14.0 / 0.00 | 40.0 | 60.0 | 0.0 | 0.0 MB |",
		"| 500 | minimal (10-row txns) | 500 |",
		"| 20,000 × 1 events | 52,919/s | **37,771/s** | 13,827/s | **0.37×** | 0.53 | 5.8 ms | 51.0 MB | 20,000 / 0 |",
		"## Capacity",
		"p99 ≤ 50 ms",
		"| minimal | **2,000** | 12.0 / 40.0 | 25.0 | 60.0 | 20.0 | 1.20 | 1,000 ✓ 30.0 ms; 2,000 ✓ 40.0 ms; 4,000 ✗ p99 102 ms | probe limit (3) |",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}
