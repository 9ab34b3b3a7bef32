package main

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseDelivery(t *testing.T) {
	tests := []struct {
		flag    string // "-" for no flag
		want    []string
		wantErr string
	}{
		{flag: "-", want: []string{atLeastOnce, exactlyOnce}},
		{flag: "at_least_once", want: []string{atLeastOnce}},
		{flag: "exactly_once", want: []string{atLeastOnce, exactlyOnce}},
		{flag: " exactly_once , at_least_once,exactly_once", want: []string{atLeastOnce, exactlyOnce}},
		{flag: "", want: []string{atLeastOnce}},
		{flag: "exactly-once", wantErr: `-delivery: unknown mode "exactly-once"`},
	}
	for _, tt := range tests {
		var args []string
		if tt.flag != "-" {
			args = []string{"-delivery", tt.flag}
		}
		o, err := parseFlags(args)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("-delivery %q: err %v, want %q", tt.flag, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(o.Deliveries, tt.want) {
			t.Errorf("-delivery %q: %v, %v; want %v", tt.flag, o.Deliveries, err, tt.want)
		}
		if got := paramsOf(o).Deliveries; !slices.Equal(got, tt.want) {
			t.Errorf("-delivery %q: params %v", tt.flag, got)
		}
		systems := steadySystems(o, 2000, false, 1)
		hasEOS := slices.ContainsFunc(systems, func(s system) bool { return s.Name == eosSystem && s.Delivery == exactlyOnce })
		if want := slices.Contains(tt.want, exactlyOnce); hasEOS != want {
			t.Errorf("-delivery %q: exactly_once steady system %v, want %v", tt.flag, hasEOS, want)
		}
	}
}

func TestDeliveryYAML(t *testing.T) {
	tests := []struct {
		c    connectorConfig
		want string
	}{
		{connectorConfig{}, ""},
		{connectorConfig{Delivery: atLeastOnce}, ""},
		{connectorConfig{Delivery: exactlyOnce, Positions: "eos1.positions.drain_tx1"},
			"  delivery: exactly_once\n  positions_topic: eos1.positions.drain_tx1\n"},
	}
	for _, tt := range tests {
		if got := tt.c.deliveryYAML(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.c, got, tt.want)
		}
	}
}

// eosResults is a run with both modes: drains of 1- and 1,000-event
// transactions (the second without exactly_once) and steady runs at 500 and
// 2,000 events/s (the exactly_once one at 2,000/s received nothing).
func eosResults() *Results {
	const n = 100_000
	drain := func(size int, alo, eos float64) DrainResult {
		d := DrainResult{TxSize: size, Events: n, Transactions: n / size, PeakRSSBytes: 20e6,
			Connector: ConnectorRun{ReaderRun: ReaderRun{Seconds: n / alo, EventsPerSec: alo, CPU: CPUUsage{Client: 1}}}}
		d.ConnectorRuns = []ConnectorRun{d.Connector}
		if eos > 0 {
			x := ConnectorRun{ReaderRun: ReaderRun{Seconds: n / eos, EventsPerSec: eos, CPU: CPUUsage{Client: 1.5}},
				PeakRSSBytes: 26e6, Verified: Verified{Distinct: n, Records: n}}
			d.ExactlyOnceRuns = []ConnectorRun{x}
			d.ExactlyOnce = &d.ExactlyOnceRuns[0]
		}
		return d
	}
	steady := func(system string, rate int, p50, p99, client float64, rss int64) SteadyResult {
		s := steadyRun(system, rate, rate*20, p99, client, 1)
		s.CommitToConsume.P50Ms, s.PeakRSSBytes = p50, rss
		return s
	}
	r := &Results{Params: Params{Rates: []int{500, 2000}, Duration: "20s"}, Env: EnvInfo{Cores: 2}}
	r.Drains = []DrainResult{drain(1, 200_000, 160_000), drain(1000, 400_000, 0)}
	r.Steady = []SteadyResult{
		steady("outbox-cdc", 500, 2, 4, 0.2, 20e6),
		steady(eosSystem, 500, 7, 12.5, 0.3, 24e6),
		steady("outbox-cdc", 2000, 3, 8, 0.8, 21e6),
		steady(eosSystem, 2000, 0, 0, 0, 0),
	}
	r.Steady[3].CommitToConsume.N = 0
	return r
}

func TestEOSCosts(t *testing.T) {
	got := eosCosts(eosResults())
	want := []eosCost{
		{Run: "drain, 1-event transactions", Ratio: 0.8, CPUDiffUs: 5, RSSDiffMB: 6, ALOEventsPS: 200_000, EOSEventsPS: 160_000},
		{Run: "steady, 500 events/s", Ratio: 1, P50DiffMs: 5, P99DiffMs: 8.5, CPUDiffUs: 10, RSSDiffMB: 4, HasLatency: true,
			ALOEventsPS: 500, EOSEventsPS: 500},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d costs %+v, want %d", len(got), got, len(want))
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for i, w := range want {
		g := got[i]
		if g.Run != w.Run || g.HasLatency != w.HasLatency || !near(g.Ratio, w.Ratio) || !near(g.P50DiffMs, w.P50DiffMs) ||
			!near(g.P99DiffMs, w.P99DiffMs) || !near(g.CPUDiffUs, w.CPUDiffUs) || !near(g.RSSDiffMB, w.RSSDiffMB) ||
			!near(g.ALOEventsPS, w.ALOEventsPS) || !near(g.EOSEventsPS, w.EOSEventsPS) {
			t.Errorf("cost %d = %+v, want %+v", i, g, w)
		}
	}
	if s := got[1].String(); s != "steady, 500 events/s: throughput 500/s vs 500/s = **1.00×**, commit → consume p50 +5.00 ms, "+
		"p99 +8.50 ms, connector CPU +10.0 µs/event, peak RSS +4.00 MB" {
		t.Errorf("line %q", s)
	}
	if s := got[0].String(); !strings.Contains(s, "160,000/s vs 200,000/s = **0.80×**") || strings.Contains(s, "p50") {
		t.Errorf("drain line %q", s)
	}
}

func TestSigned(t *testing.T) {
	for v, want := range map[float64]string{0: "+0.00", 2.5: "+2.50", -0.25: "−0.25", -150: "−150", 12: "+12.0"} {
		if got := signed(v); got != want {
			t.Errorf("signed(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestReportHasExactlyOnce(t *testing.T) {
	r := eosResults()
	r.Targets = evaluateTargets(r)
	if err := writeChart(filepath.Join(t.TempDir(), "latency.png"), r); err != nil {
		t.Fatal(err)
	}
	// Issue 12's targets stay at_least_once's.
	for _, tg := range r.Targets {
		if strings.Contains(tg.Measured, eosSystem) {
			t.Errorf("target %q counts the exactly_once rows: %s", tg.Name, tg.Measured)
		}
	}
	md := renderReport(r, "latency.png", nil)
	for _, want := range []string{
		"### exactly_once drain",
		"| 100,000 × 1 events | 200,000/s | **160,000/s** | 0.80× | 0.62 | 10.0 / 15.0 µs | 20.0 / 26.0 MB | 100,000 / 0 |",
		"## Cost of exactly_once",
		"| 1 events | connector, exactly_once | 1 |",
		"- drain, 1-event transactions: throughput 160,000/s vs 200,000/s",
		"- steady, 500 events/s: throughput",
		"| 500 | " + eosSystem + " | 500 |",
		"| drain, 1-event transactions, exactly_once (highest of 1 runs) | 26.0 MB |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	// No exactly_once line for a run without both modes measured.
	for _, absent := range []string{"- steady, 2,000 events/s", "- drain, 1,000-event"} {
		if strings.Contains(md, absent) {
			t.Errorf("report has %q", absent)
		}
	}
	// at_least_once alone: no exactly_once section.
	r.Drains[0].ExactlyOnce, r.Drains[0].ExactlyOnceRuns, r.Steady = nil, nil, r.Steady[:1]
	r.Targets = evaluateTargets(r)
	if md := renderReport(r, "", nil); strings.Contains(md, "exactly_once") {
		t.Errorf("report without exactly_once runs mentions it:\n%s", md)
	}
}
