package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// deadline ends the test binary if a test hangs: pure logic has no reason
// to take seconds.
func deadline(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.AfterFunc(d, func() { panic(fmt.Sprintf("%s: still running after %v", t.Name(), d)) })
	t.Cleanup(func() { timer.Stop() })
}

// probes builds a history: "2000+" passed at 2,000/s, "4000-" failed.
func probes(spec ...string) []CapacityProbe {
	var out []CapacityProbe
	for _, s := range spec {
		var rate int
		fmt.Sscanf(s[:len(s)-1], "%d", &rate)
		out = append(out, CapacityProbe{Rate: rate, Passed: s[len(s)-1] == '+'})
	}
	return out
}

func TestSearchPlanNext(t *testing.T) {
	deadline(t, 5*time.Second)
	plan := searchPlan{Start: 2000, Max: 64000, Min: 50, Growth: 2, Precision: 0.1, Probes: 8}
	cases := []struct {
		name    string
		history []string
		rate    int
		why     string // substring of the reason when rate is 0
	}{
		{"first probe at the start", nil, 2000, ""},
		{"grow while passing", []string{"2000+"}, 4000, ""},
		{"grow from the highest pass", []string{"2000+", "4000+"}, 8000, ""},
		{"bisect geometrically after the first failure", []string{"2000+", "4000+", "8000-"}, 5657, ""},
		{"bisect between the bracket", []string{"2000+", "4000+", "8000-", "5657+"}, 6727, ""},
		{"converged within the precision", []string{"2000+", "4000+", "8000-", "5657+", "6727+", "7336-"}, 0, "converged"},
		{"shrink while failing", []string{"2000-"}, 1000, ""},
		{"bisect up after a pass below the start", []string{"2000-", "1000+"}, 1414, ""},
		{"give up below the minimum", []string{"2000-", "1000-", "500-", "250-", "125-", "62-"}, 0, "failed at the lowest rate"},
		{"capped at the maximum", []string{"2000+", "4000+", "8000+", "16000+", "32000+"}, 64000, ""},
		{"passed at the maximum", []string{"2000+", "4000+", "8000+", "16000+", "32000+", "64000+"}, 0, "highest rate"},
		{"probe limit", []string{"2000+", "4000+", "8000-", "5657+", "6727-", "6169+", "6442+", "6583-"}, 0, "probe limit"},
		// A pass above the lowest failure is noise: the bracket stays below it.
		{"a noisy pass above a failure", []string{"2000+", "4000-", "2828+", "8000+"}, 3363, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rate, why := plan.next(probes(c.history...))
			if rate != c.rate || (c.rate == 0 && !strings.Contains(why, c.why)) {
				t.Fatalf("next(%v) = %d, %q; want %d, %q", c.history, rate, why, c.rate, c.why)
			}
		})
	}
}

func TestBracket(t *testing.T) {
	deadline(t, 5*time.Second)
	cases := []struct {
		history []string
		lo, hi  int
	}{
		{nil, 0, 0},
		{[]string{"2000+", "4000+"}, 4000, 0},
		{[]string{"2000-"}, 0, 2000},
		{[]string{"2000+", "8000-", "4000-"}, 2000, 4000},
		{[]string{"2000+", "4000-", "8000+"}, 2000, 4000},
	}
	for _, c := range cases {
		if lo, hi := bracket(probes(c.history...)); lo != c.lo || hi != c.hi {
			t.Errorf("bracket(%v) = %d, %d; want %d, %d", c.history, lo, hi, c.lo, c.hi)
		}
	}
}

func TestJudge(t *testing.T) {
	deadline(t, 5*time.Second)
	run := func(achieved, p99 float64) *SteadyResult {
		return &SteadyResult{OfferedRate: 4000, Committed: 20000, Received: 20000, AchievedRate: achieved,
			CommitToConsume: Percentiles{N: 20000, P99Ms: p99}}
	}
	behind := run(4000, 0)
	behind.Received = 15000
	crash := errors.New("connector exited")
	cases := []struct {
		name   string
		res    *SteadyResult
		err    error
		passed bool
		reason string
		fatal  error
	}{
		{"within the bound", run(4000, 30), nil, true, "", nil},
		{"at the bound", run(3900, 50), nil, true, "", nil},
		{"p99 past the bound", run(4000, 61), nil, false, "p99 61.0 ms", nil},
		{"writers short of the rate", run(3500, 10), nil, false, "writers achieved 3,500/s", nil},
		{"behind after the settle wait", behind, fmt.Errorf("%w: received 15000", errLost), false, "behind: 15,000 of 20,000", nil},
		{"a process failed", run(4000, 10), crash, false, "", crash},
		{"nothing measured", &SteadyResult{}, nil, false, "", errors.New("no latency measured")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			passed, reason, fatal := judge(c.res, c.err, 4000, 50)
			if passed != c.passed || !strings.Contains(reason, c.reason) || (fatal == nil) != (c.fatal == nil) {
				t.Fatalf("judge = %v, %q, %v; want %v, %q, %v", passed, reason, fatal, c.passed, c.reason, c.fatal)
			}
		})
	}
}

func TestCapacityOptions(t *testing.T) {
	deadline(t, 5*time.Second)
	o, err := parseFlags([]string{"-capacity-lingers", "0s,5ms", "-capacity-start", "1000", "-steady-tx-rows", "1,10"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Capacity.Lingers) != 2 || o.Capacity.Lingers[1] != 5*time.Millisecond || o.Capacity.Start != 1000 {
		t.Fatalf("capacity options %+v", o.Capacity)
	}
	if !o.has("capacity") || len(o.TxRows) != 2 || o.TxRows[1] != 10 {
		t.Fatalf("scenarios %v, tx rows %v", o.Scenarios, o.TxRows)
	}
	var names []string
	for _, s := range capacitySystems(o) {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != "outbox-cdc,minimal,outbox-cdc-linger0s,outbox-cdc-linger5ms" {
		t.Fatalf("capacity systems %s", got)
	}
	for _, bad := range [][]string{
		{"-capacity-growth", "1"}, {"-capacity-start", "5000", "-capacity-max", "4000"}, {"-capacity-probes", "0"},
		{"-capacity-duration", "100ms"}, {"-steady-tx-rows", "0"}, {"-scenarios", "capacity,bogus"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%v) accepted", bad)
		}
	}
}

func TestSteadySystemsShapes(t *testing.T) {
	deadline(t, 5*time.Second)
	o, err := parseFlags([]string{"-cdc-lingers", "", "-cdc-budgets", "", "-cdc-retention", "", "-relay-intervals", "", "-delivery", "at_least_once"})
	if err != nil {
		t.Fatal(err)
	}
	label := func(ss []system) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.label()+"="+s.aggType(500))
		}
		return strings.Join(out, ",")
	}
	if got, want := label(steadySystems(o, 500, false, 1)),
		"pg_recvlogical=steady_pg_recvlogical_500,producer-floor=steady_producerfloor_500,minimal=steady_minimal_500,outbox-cdc=steady_outboxcdc_500"; got != want {
		t.Errorf("one-row systems:\n%s\nwant\n%s", got, want)
	}
	// No bare producer in the 10-row shape: it has no transactions.
	if got, want := label(steadySystems(o, 500, false, 10)),
		"pg_recvlogical (10-row txns)=steady_pg_recvlogical_500_tx10,minimal (10-row txns)=steady_minimal_500_tx10,"+
			"outbox-cdc (10-row txns)=steady_outboxcdc_500_tx10"; got != want {
		t.Errorf("10-row systems:\n%s\nwant\n%s", got, want)
	}
	if got := (system{Name: "outbox-cdc-linger2ms", Probe: true}).aggType(4000); got != "cap_outboxcdclinger2ms_4000" {
		t.Errorf("probe aggType %s", got)
	}
}
