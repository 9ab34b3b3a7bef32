package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// The frontier (issue 27): at each rate, outbox-cdc with its default
// (kafka.latency_budget), with fixed lingers and the budget off, and with
// other budgets, as p99 against connector + broker CPU per event. The
// default must stay within the p99 bound while costing no more CPU than the
// cheapest fixed linger that stays within it too.

// frontierGoal is one rate's bound on the default's p99: the fixed linger-0
// run's p99 plus slackMs, or floorMs, whichever is larger; at 2,000/s also
// absolute CPU goals.
type frontierGoal struct {
	rate                  int
	slackMs, floorMs      float64
	connectorUs, brokerUs float64 // 0: no absolute goal
	fixedBoundMs          float64 // > 0: the bound is this, whatever linger 0 does
}

var frontierGoals = []frontierGoal{
	{rate: 500, slackMs: 2, floorMs: 10},
	{rate: 2000, slackMs: 2, floorMs: 10, connectorUs: 70, brokerUs: 80},
	{rate: 10000, fixedBoundMs: 50},
}

const (
	defaultSystem = "outbox-cdc"
	lingerPrefix  = "outbox-cdc-linger"
	budgetPrefix  = "outbox-cdc-budget"
)

// frontierPoint is one at_least_once outbox-cdc run at one rate.
type frontierPoint struct {
	System                 string
	Fixed                  bool // a fixed linger, budget off
	P50, P99               float64
	ConnectorUs, BrokerUs  float64
	OtherBusyCores, Linger float64
}

func (p frontierPoint) costUs() float64 { return p.ConnectorUs + p.BrokerUs }

// frontierPoints are rate's outbox-cdc runs: the default, the fixed lingers
// (in linger order) and the other budgets.
func frontierPoints(r *Results, rate int) []frontierPoint {
	var out []frontierPoint
	for _, s := range r.Steady {
		if s.OfferedRate != rate || !s.oneRow() || s.Committed == 0 || s.CommitToConsume.N == 0 ||
			(s.System != defaultSystem && !strings.HasPrefix(s.System, lingerPrefix) && !strings.HasPrefix(s.System, budgetPrefix)) {
			continue
		}
		pe := perEventOf(&s)
		p := frontierPoint{System: s.System, Fixed: s.Linger != "", P50: s.CommitToConsume.P50Ms, P99: s.CommitToConsume.P99Ms,
			ConnectorUs: pe.client, BrokerUs: pe.broker, OtherBusyCores: s.CPU.Other / max(s.CPU.WallSeconds, 1e-9)}
		if p.Fixed {
			p.Linger = lingerMs(s.Linger)
		}
		out = append(out, p)
	}
	slices.SortStableFunc(out, func(a, b frontierPoint) int {
		if a.Fixed != b.Fixed {
			return cmp.Compare(btoi(a.Fixed), btoi(b.Fixed))
		}
		return cmp.Compare(a.Linger, b.Linger)
	})
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lingerMs parses a linger as the report wrote it ("5ms", "0s").
func lingerMs(s string) float64 {
	d, err := time.ParseDuration(s)
	if err != nil {
		return math.NaN()
	}
	return float64(d) / float64(time.Millisecond)
}

// p99Bound is the bound on the default's p99 at g.rate, and how it was set.
func (g frontierGoal) p99Bound(points []frontierPoint) (float64, string, bool) {
	if g.fixedBoundMs > 0 {
		return g.fixedBoundMs, fmt.Sprintf("< %g ms", g.fixedBoundMs), true
	}
	i := slices.IndexFunc(points, func(p frontierPoint) bool { return p.Fixed && p.Linger == 0 })
	if i < 0 {
		return 0, "", false
	}
	b := max(points[i].P99+g.slackMs, g.floorMs)
	return b, fmt.Sprintf("≤ %s ms (max of linger 0's p99 %s + %g, %g)", ms(b), ms(points[i].P99), g.slackMs, g.floorMs), true
}

// frontierTargets are issue 27's targets, one set per rate.
func frontierTargets(r *Results) []Target {
	var ts []Target
	for _, g := range frontierGoals {
		points := frontierPoints(r, g.rate)
		rate := thousands(g.rate) + " events/s"
		d := slices.IndexFunc(points, func(p frontierPoint) bool { return p.System == defaultSystem })
		bound, boundText, ok := g.p99Bound(points)
		if d < 0 || !ok {
			ts = append(ts, Target{Name: "default vs fixed lingers at " + rate, Goal: "the frontier", Status: statusNotMeasured,
				Limit: "needs the default and the fixed linger-0 run (-cdc-lingers 0s,...)"})
			continue
		}
		def := points[d]
		p99 := Target{Name: "default p99 at " + rate, Goal: boundText,
			Measured: fmt.Sprintf("%s ms (p50 %s ms)", ms(def.P99), ms(def.P50)), Status: status(def.P99 <= bound)}
		ts = append(ts, p99)
		ts = append(ts, costTargets(points, def, bound, rate)...)
		if g.connectorUs > 0 {
			ts = append(ts,
				Target{Name: "default connector CPU per event at " + rate, Goal: fmt.Sprintf("≤ %g µs", g.connectorUs),
					Measured: fmt.Sprintf("%.1f µs", def.ConnectorUs), Status: status(def.ConnectorUs <= g.connectorUs)},
				Target{Name: "default broker CPU per event at " + rate, Goal: fmt.Sprintf("≤ %g µs", g.brokerUs),
					Measured: fmt.Sprintf("%.1f µs", def.BrokerUs), Status: status(def.BrokerUs <= g.brokerUs)})
		}
	}
	return ts
}

// costTargets compare the default's connector and broker CPU per event with
// the cheapest fixed linger whose p99 is within bound.
func costTargets(points []frontierPoint, def frontierPoint, bound float64, rate string) []Target {
	var ts []Target
	for _, c := range []struct {
		what string
		get  func(frontierPoint) float64
	}{
		{"connector", func(p frontierPoint) float64 { return p.ConnectorUs }},
		{"broker", func(p frontierPoint) float64 { return p.BrokerUs }},
	} {
		t := Target{Name: fmt.Sprintf("default %s CPU per event vs fixed lingers at %s", c.what, rate),
			Goal: "≤ the cheapest fixed linger within the p99 bound"}
		best := -1
		for i, p := range points {
			if p.Fixed && p.P99 <= bound && (best < 0 || c.get(p) < c.get(points[best])) {
				best = i
			}
		}
		if best < 0 {
			t.Status, t.Limit = statusNotMeasured, "no fixed linger kept its p99 within the bound"
		} else {
			b := points[best]
			t.Measured = fmt.Sprintf("%.1f µs vs %.1f µs (%s)", c.get(def), c.get(b), strings.TrimPrefix(b.System, "outbox-cdc-"))
			t.Status = status(c.get(def) <= c.get(b))
		}
		ts = append(ts, t)
	}
	return ts
}

// renderFrontier writes one table per rate and links each rate's chart.
func renderFrontier(w func(string, ...any), r *Results, charts map[int]string) {
	var rates []int
	for _, g := range r.Params.Rates {
		if len(frontierPoints(r, g)) > 1 {
			rates = append(rates, g)
		}
	}
	if len(rates) == 0 {
		return
	}
	w("## The frontier: latency budget against fixed lingers\n\n")
	w("outbox-cdc (at_least_once) with its defaults (`%s`), with fixed `kafka.linger` values and the budget off (`linger…`), "+
		"and with other `kafka.latency_budget` values (`budget…`). CPU is per committed event; **other** is busy cores outside "+
		"the servers, the connector and the benchmark (a quiet machine shows about 0).\n\n", defaultSystem)
	for _, rate := range rates {
		w("### %s events/s\n\n", thousands(rate))
		w("| system | p50 (ms) | p99 (ms) | connector µs/event | broker µs/event | sum | other (cores) |\n|---|---|---|---|---|---|---|\n")
		for _, p := range frontierPoints(r, rate) {
			w("| %s | %s | %s | %.1f | %.1f | %.1f | %.2f |\n", p.System, ms(p.P50), ms(p.P99), p.ConnectorUs, p.BrokerUs, p.costUs(), p.OtherBusyCores)
		}
		w("\n")
		if c := charts[rate]; c != "" {
			w("![p99 against CPU per event at %s events/s](%s)\n\n", thousands(rate), c)
		}
	}
}
