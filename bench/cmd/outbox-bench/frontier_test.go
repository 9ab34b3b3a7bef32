package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run builds one steady outbox-cdc run at rate: p99 in ms, connector and
// broker CPU in µs per event over 1,000,000 events.
func frontierRun(system, linger string, rate int, p99, connUs, brokerUs float64) SteadyResult {
	const n = 1_000_000
	s := SteadyResult{System: system, Linger: linger, OfferedRate: rate, Committed: n, AchievedRate: float64(rate)}
	s.CommitToConsume = Percentiles{N: n, P50Ms: p99 / 4, P99Ms: p99}
	s.CPU = CPUUsage{WallSeconds: 20, Client: connUs * n / 1e6, Kafka: brokerUs * n / 1e6}
	return s
}

func TestFrontierTargets(t *testing.T) {
	type want struct{ name, status, measured string }
	cases := []struct {
		name  string
		runs  []SteadyResult
		wants []want
	}{{
		name: "the default beats the cheapest linger within the bound",
		runs: []SteadyResult{
			frontierRun("outbox-cdc", "", 2000, 6, 60, 70),
			frontierRun("outbox-cdc-linger0s", "0s", 2000, 3, 160, 220),
			frontierRun("outbox-cdc-linger5ms", "5ms", 2000, 9, 65, 75),
			frontierRun("outbox-cdc-linger10ms", "10ms", 2000, 14, 50, 60), // past the bound: no comparator
		},
		wants: []want{
			{"default p99 at 2,000 events/s", statusMet, "6.00 ms"},
			{"default connector CPU per event vs fixed lingers at 2,000 events/s", statusMet, "60.0 µs vs 65.0 µs (linger5ms)"},
			{"default broker CPU per event vs fixed lingers at 2,000 events/s", statusMet, "70.0 µs vs 75.0 µs (linger5ms)"},
			{"default connector CPU per event at 2,000 events/s", statusMet, "60.0 µs"},
			{"default broker CPU per event at 2,000 events/s", statusMet, "70.0 µs"},
		},
	}, {
		name: "a fixed linger cheaper within the bound, a p99 past it",
		runs: []SteadyResult{
			frontierRun("outbox-cdc", "", 500, 13, 90, 100),
			frontierRun("outbox-cdc-linger0s", "0s", 500, 2, 300, 380),
			frontierRun("outbox-cdc-linger2ms", "2ms", 500, 4, 80, 90),
		},
		wants: []want{
			{"default p99 at 500 events/s", statusNotMet, "13.0 ms"},
			{"default connector CPU per event vs fixed lingers at 500 events/s", statusNotMet, "90.0 µs vs 80.0 µs (linger2ms)"},
		},
	}, {
		name: "no fixed linger within the bound",
		runs: []SteadyResult{
			frontierRun("outbox-cdc", "", 10000, 40, 30, 30),
			frontierRun("outbox-cdc-linger0s", "0s", 10000, 280, 31, 60),
		},
		wants: []want{
			{"default p99 at 10,000 events/s", statusMet, "40.0 ms"},
			{"default connector CPU per event vs fixed lingers at 10,000 events/s", statusNotMeasured, ""},
		},
	}, {
		name:  "no linger-0 run",
		runs:  []SteadyResult{frontierRun("outbox-cdc", "", 2000, 6, 60, 70)},
		wants: []want{{"default vs fixed lingers at 2,000 events/s", statusNotMeasured, ""}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]Target{}
			for _, tg := range frontierTargets(&Results{Steady: c.runs}) {
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

func TestFrontierChartAndTable(t *testing.T) {
	r := &Results{Params: Params{Rates: []int{2000}}, Steady: []SteadyResult{
		frontierRun("outbox-cdc", "", 2000, 6, 60, 70),
		frontierRun("outbox-cdc-linger0s", "0s", 2000, 3, 160, 220),
		frontierRun("outbox-cdc-linger5ms", "5ms", 2000, 9, 65, 75),
		frontierRun("outbox-cdc-budget2ms", "", 2000, 4, 90, 110),
	}}
	path := filepath.Join(t.TempDir(), "frontier-2000.png")
	if err := writeFrontierChart(path, r, 2000); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() < 1000 {
		t.Fatalf("chart: %v, %v", st, err)
	}
	md := renderReport(r, "", map[int]string{2000: "frontier-2000.png"})
	for _, s := range []string{"## The frontier", "| outbox-cdc-linger0s | 0.75 | 3.00 | 160.0 | 220.0 | 380.0 |", "(frontier-2000.png)"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
	// Fixed lingers come after the default and budgets, in linger order.
	points := frontierPoints(r, 2000)
	if points[len(points)-1].System != "outbox-cdc-linger5ms" || points[len(points)-2].System != "outbox-cdc-linger0s" {
		t.Errorf("order: %+v", points)
	}
}
