package main

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// steadyRun is a steady result of n events with the given p99 and CPU.
func steadyRun(system string, rate, n int, p99Ms, client, kafka float64) SteadyResult {
	return SteadyResult{System: system, OfferedRate: rate, Committed: n, AchievedRate: float64(rate),
		CommitToConsume: Percentiles{N: n, P50Ms: p99Ms / 2, P99Ms: p99Ms},
		CPU:             CPUUsage{WallSeconds: 20, Client: client, Kafka: kafka}}
}

func findTarget(t *testing.T, ts []Target, name string) Target {
	t.Helper()
	for _, x := range ts {
		if x.Name == name {
			return x
		}
	}
	t.Fatalf("no target %q in %v", name, ts)
	return Target{}
}

func TestSteadyTargets(t *testing.T) {
	const n = 40_000 // 2,000/s for 20 s
	tests := []struct {
		name   string
		runs   []SteadyResult
		target string
		want   string // status
	}{
		{"p99 met", []SteadyResult{steadyRun("outbox-cdc", 2000, n, 9.9, 1, 1)}, "commit → consume p99 at 2,000 events/s", statusMet},
		{"p99 missed", []SteadyResult{steadyRun("outbox-cdc", 2000, n, 10.1, 1, 1)}, "commit → consume p99 at 2,000 events/s", statusNotMet},
		{"p99 at 500/s is 5 ms", []SteadyResult{steadyRun("outbox-cdc", 500, n, 6, 1, 1)}, "commit → consume p99 at 500 events/s", statusNotMet},
		{"p99 not run", nil, "commit → consume p99 at 10,000 events/s", statusNotMeasured},
		// 1.2 s over 40,000 events = 30 µs.
		{"cpu 30 µs met", []SteadyResult{steadyRun("outbox-cdc", 2000, n, 1, 1.2, 1)}, "connector CPU per event at 2,000 events/s", statusMet},
		{"cpu 32.5 µs missed", []SteadyResult{steadyRun("outbox-cdc", 2000, n, 1, 1.3, 1)}, "connector CPU per event at 2,000 events/s", statusNotMet},
		{"cpu at 10,000/s is 20 µs", []SteadyResult{steadyRun("outbox-cdc", 10000, n, 1, 1.2, 1)}, "connector CPU per event at 10,000 events/s", statusNotMet},
		{"broker 1.5× met", []SteadyResult{steadyRun(floorProducer, 2000, n, 1, 0, 2), steadyRun("outbox-cdc", 2000, n, 1, 1, 3)},
			"broker CPU per event at 2,000 events/s", statusMet},
		{"broker 1.6× missed", []SteadyResult{steadyRun(floorProducer, 2000, n, 1, 0, 2), steadyRun("outbox-cdc", 2000, n, 1, 1, 3.2)},
			"broker CPU per event at 2,000 events/s", statusNotMet},
		{"broker below its floor: no verdict", []SteadyResult{steadyRun(floorProducer, 2000, n, 1, 0, 4), steadyRun("outbox-cdc", 2000, n, 1, 1, 2)},
			"broker CPU per event at 2,000 events/s", statusNotMeasured},
		{"broker without floor", []SteadyResult{steadyRun("outbox-cdc", 2000, n, 1, 1, 3)}, "broker CPU per event at 2,000 events/s", statusNotMeasured},
		// Another system's numbers never stand in for the connector's.
		{"debezium is not the connector", []SteadyResult{steadyRun("debezium", 2000, n, 1, 1, 1)}, "commit → consume p99 at 2,000 events/s", statusNotMeasured},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := findTarget(t, steadyTargets(&Results{Steady: tt.runs}), tt.target)
			if got.Status != tt.want {
				t.Fatalf("status %q, want %q (measured %q)", got.Status, tt.want, got.Measured)
			}
		})
	}
}

func TestDebeziumTargets(t *testing.T) {
	drain := func(ratio float64, ours, theirs int64) []DrainResult {
		return []DrainResult{{TxSize: 1, PeakRSSBytes: ours, Connector: ConnectorRun{ReaderRun: ReaderRun{EventsPerSec: 100_000}},
			Debezium: &ConnectorRun{ReaderRun: ReaderRun{EventsPerSec: 100_000 / ratio}, PeakRSSBytes: theirs}, DebeziumRatio: ratio}}
	}
	steady := func(ours, theirs float64) []SteadyResult {
		return []SteadyResult{steadyRun("outbox-cdc", 2000, 100, ours, 0, 0), steadyRun("debezium", 2000, 100, theirs, 0, 0)}
	}
	tests := []struct {
		name                string
		r                   Results
		drain, rss, latency string
	}{
		{"all met", Results{Drains: drain(10, 30e6, 600e6), Steady: steady(2, 100), Params: Params{Rates: []int{2000}}},
			statusMet, statusMet, statusMet},
		{"all missed", Results{Drains: drain(9.9, 31e6, 600e6), Steady: steady(2, 99), Params: Params{Rates: []int{2000}}},
			statusNotMet, statusNotMet, statusNotMet},
		{"no steady run", Results{Drains: drain(20, 30e6, 900e6)}, statusMet, statusMet, statusNotMeasured},
		{"skipped", Results{DebeziumSkipped: "java not found", Drains: drain(20, 30e6, 900e6)},
			statusNotMeasured, statusNotMeasured, statusNotMeasured},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := debeziumTargets(&tt.r)
			for i, want := range []string{tt.drain, tt.rss, tt.latency} {
				if ts[i].Status != want {
					t.Fatalf("%s: status %q, want %q (measured %q)", ts[i].Name, ts[i].Status, want, ts[i].Measured)
				}
				if tt.r.DebeziumSkipped != "" && !strings.Contains(ts[i].Limit, tt.r.DebeziumSkipped) {
					t.Fatalf("%s: limit %q does not say why Debezium was skipped", ts[i].Name, ts[i].Limit)
				}
			}
		})
	}
}

func TestRenderSaysDebeziumSkipped(t *testing.T) {
	r := &Results{DebeziumSkipped: "scripts/fetch-debezium.sh: exit status 1: mvn not found"}
	r.Targets = evaluateTargets(r)
	out := renderReport(r, "", nil)
	if !strings.Contains(out, "**Debezium was skipped: scripts/fetch-debezium.sh: exit status 1: mvn not found.**") {
		t.Fatalf("report does not say Debezium was skipped:\n%s", out)
	}
}

func TestDebeziumTopic(t *testing.T) {
	if got := dbzTopic("outbox.event.{aggregate_type}"); got != "outbox.event.${routedByValue}" {
		t.Fatalf("dbzTopic = %q", got)
	}
}

// The bare producer's records carry the id the consumer pairs them by, and
// the connector's default headers.
func TestFloorRecord(t *testing.T) {
	r := floorRecord("t", "agg", 1234)
	got := map[string]string{}
	for _, h := range r.Headers {
		got[h.Key] = string(h.Value)
	}
	if seq, ok := seqOf([]byte(got[wire.HeaderID])); !ok || seq != 1234 {
		t.Fatalf("id header %q: seq %d, %v", got[wire.HeaderID], seq, ok)
	}
	if got[wire.HeaderEventType] != "OrderPlaced" || got[wire.HeaderAggregateType] != "agg" || string(r.Key) != "agg-234" {
		t.Fatalf("record: key %q, headers %v", r.Key, got)
	}
}
