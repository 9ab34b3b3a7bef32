package main

import (
	"fmt"
	"slices"
	"strings"
)

// Issue 39: the default costs no more than a minimal connector and is
// faster at every rate. Every goal is a ratio to the minimal connector
// (bench/minimal) measured in the same run, or an absolute latency.

// minimalGoal is one steady rate's goals for the default connector.
type minimalGoal struct {
	rate                          int
	p50Ms, p99Ms                  float64 // 0: no goal
	connectorFactor, brokerFactor float64 // CPU per event over the minimal's
}

var minimalGoals = []minimalGoal{
	{rate: 500, p50Ms: 1, p99Ms: 5, connectorFactor: 1.5, brokerFactor: 1.5},
	{rate: 2000, p99Ms: 10, connectorFactor: 1.1, brokerFactor: 1.1},
}

const issue39 = "issue 39: "

// minimalTargets are issue 39's steady, drain and capacity targets.
func minimalTargets(r *Results) []Target {
	var ts []Target
	for _, g := range minimalGoals {
		ts = append(ts, minimalSteadyTargets(r, g)...)
	}
	ts = append(ts, fasterTarget(r))
	ts = append(ts, minimalDrainTargets(r)...)
	return append(ts, capacityTargets(r)...)
}

// minimalSteadyTargets compare the default with the minimal connector at
// g.rate: its latency, and its connector and broker CPU per event.
func minimalSteadyTargets(r *Results, g minimalGoal) []Target {
	rate := thousands(g.rate) + " events/s"
	def, ref := findSteady(r, defaultSystem, g.rate), findSteady(r, minimalSystem, g.rate)
	var goals []string
	if g.p50Ms > 0 {
		goals = append(goals, fmt.Sprintf("p50 ≤ %g ms", g.p50Ms))
	}
	goals = append(goals, fmt.Sprintf("p99 ≤ %g ms", g.p99Ms))
	lat := Target{Name: issue39 + "default latency at " + rate, Goal: strings.Join(goals, ", ")}
	conn := Target{Name: issue39 + "default connector CPU per event vs minimal at " + rate, Goal: fmt.Sprintf("≤ %g× the minimal's", g.connectorFactor)}
	brk := Target{Name: issue39 + "default broker CPU per event vs minimal at " + rate, Goal: fmt.Sprintf("≤ %g× the minimal's", g.brokerFactor)}
	if def == nil || def.CommitToConsume.N == 0 {
		lat.Status = statusNotMeasured
	} else {
		c := def.CommitToConsume
		lat.Measured = fmt.Sprintf("p50 %s ms, p99 %s ms", ms(c.P50Ms), ms(c.P99Ms))
		if ref != nil && ref.CommitToConsume.N > 0 {
			lat.Measured += fmt.Sprintf(" (minimal: p50 %s ms, p99 %s ms)", ms(ref.CommitToConsume.P50Ms), ms(ref.CommitToConsume.P99Ms))
		}
		lat.Status = status((g.p50Ms == 0 || c.P50Ms <= g.p50Ms) && c.P99Ms <= g.p99Ms)
		if lat.Status == statusNotMet {
			lat.Limit = cpuLimit(r, def)
		}
	}
	cpuRatio(&conn, def, ref, g.connectorFactor, func(p perEvent) float64 { return p.client })
	cpuRatio(&brk, def, ref, g.brokerFactor, func(p perEvent) float64 { return p.broker })
	return []Target{lat, conn, brk}
}

// cpuRatio fills t with def's CPU per event over ref's (get picks which)
// against factor.
func cpuRatio(t *Target, def, ref *SteadyResult, factor float64, get func(perEvent) float64) {
	if def == nil || ref == nil || def.Committed == 0 || ref.Committed == 0 {
		t.Status, t.Limit = statusNotMeasured, "needs the default and the minimal connector at this rate (-minimal)"
		return
	}
	a, b := get(perEventOf(def)), get(perEventOf(ref))
	if b <= 0 {
		t.Status, t.Limit = statusNotMeasured, "the minimal connector's CPU rounds to 0 (too short a run)"
		return
	}
	t.Measured = fmt.Sprintf("%.1f µs vs %.1f µs = %.2f×", a, b, a/b)
	t.Status = status(a/b <= factor)
	if t.Status == statusNotMet {
		t.Limit = sharedNote(def.CPU, "the default's run") + sharedNote(ref.CPU, "the minimal's run")
		t.Limit = strings.TrimPrefix(t.Limit, "; ")
	}
}

// fasterTarget: the default's p99 is no higher than the minimal's at every
// steady rate where both ran.
func fasterTarget(r *Results) Target {
	t := Target{Name: issue39 + "default p99 vs minimal, every steady rate", Goal: "≤ the minimal connector's"}
	var parts []string
	ok, seen := true, false
	for _, rate := range r.Params.Rates {
		def, ref := findSteady(r, defaultSystem, rate), findSteady(r, minimalSystem, rate)
		if def == nil || ref == nil || def.CommitToConsume.N == 0 || ref.CommitToConsume.N == 0 {
			continue
		}
		seen = true
		a, b := def.CommitToConsume.P99Ms, ref.CommitToConsume.P99Ms
		parts = append(parts, fmt.Sprintf("%s/s: %s ms vs %s ms", thousands(rate), ms(a), ms(b)))
		ok = ok && a <= b
	}
	if !seen {
		t.Status = statusNotMeasured
		return t
	}
	t.Measured, t.Status = strings.Join(parts, "; "), status(ok)
	return t
}

// minimalDrainTargets: the connector drains at least as fast as the minimal
// connector, per transaction size.
func minimalDrainTargets(r *Results) []Target {
	var ts []Target
	for _, d := range r.Drains {
		t := Target{Name: fmt.Sprintf("%sdrain rate vs minimal, %s-event transactions", issue39, thousands(d.TxSize)),
			Goal: "≥ 1.0× the minimal connector's"}
		if d.Minimal == nil || d.Minimal.Seconds == 0 || d.Connector.Seconds == 0 {
			t.Status = statusNotMeasured
		} else {
			t.Measured = fmt.Sprintf("%s vs %s events/s = %.2f×", thousands(int(d.Connector.EventsPerSec)),
				thousands(int(d.Minimal.EventsPerSec)), d.MinimalRatio)
			t.Status = status(d.MinimalRatio >= 1)
		}
		ts = append(ts, t)
	}
	return ts
}

// capacityTargets: the default's capacity is at least the minimal's and
// every fixed linger's.
func capacityTargets(r *Results) []Target {
	vsMin := Target{Name: issue39 + "capacity vs minimal", Goal: "default ≥ the minimal connector's"}
	vsLinger := Target{Name: issue39 + "capacity vs fixed lingers", Goal: "default ≥ every fixed linger's"}
	var def *CapacityResult
	for i := range r.Capacity {
		if r.Capacity[i].System == defaultSystem {
			def = &r.Capacity[i]
		}
	}
	if def == nil || len(def.Probes) == 0 {
		vsMin.Status, vsLinger.Status = statusNotMeasured, statusNotMeasured
		return []Target{vsMin, vsLinger}
	}
	vsMin.Status, vsLinger.Status = statusNotMeasured, statusNotMeasured
	var lingers []string
	lingersOK := true
	for _, c := range r.Capacity {
		switch {
		case c.System == minimalSystem && len(c.Probes) > 0:
			vsMin.Measured = fmt.Sprintf("%s vs %s events/s", thousands(def.Capacity), thousands(c.Capacity))
			vsMin.Status = status(def.Capacity >= c.Capacity)
		case c.Linger != "" && len(c.Probes) > 0:
			lingers = append(lingers, fmt.Sprintf("linger %s %s/s", c.Linger, thousands(c.Capacity)))
			lingersOK = lingersOK && def.Capacity >= c.Capacity
		}
	}
	if def.Capacity == 0 && vsMin.Status == statusMet {
		// 0 ≥ 0 says nothing: no probe of either passed.
		vsMin.Status = statusNotMeasured
	}
	if len(lingers) > 0 {
		vsLinger.Measured = fmt.Sprintf("%s events/s vs %s", thousands(def.Capacity), strings.Join(lingers, ", "))
		vsLinger.Status = status(lingersOK)
	}
	if def.Stopped != "converged" {
		note := "the default's search ended by " + def.Stopped
		vsMin.Limit, vsLinger.Limit = note, note
	}
	return []Target{vsMin, vsLinger}
}

// renderMinimal compares the default with the minimal connector, steady
// (every rate and shape) and in the drain.
func renderMinimal(w func(string, ...any), r *Results) {
	hasSteady := slices.ContainsFunc(r.Steady, func(s SteadyResult) bool { return s.System == minimalSystem })
	hasDrain := slices.ContainsFunc(r.Drains, func(d DrainResult) bool { return d.Minimal != nil })
	if !hasSteady && !hasDrain {
		return
	}
	w("## Against the minimal connector (issue 39)\n\n")
	w("`bench/cmd/minimal-connector` (`bench/minimal`): a pglogrepl stream of pgoutput (proto_version 1) from its own slot, " +
		"each outbox insert produced with franz-go at its defaults plus `ProducerLinger(10ms)` (idempotent, acks=all), the " +
		"slot confirmed only up to the end of transactions whose every record was acknowledged; no templates, metrics, gate " +
		"or checkpoint store. It runs as its own process, measured as the connector is. CPU is per committed event, in µs.\n\n")
	if hasSteady {
		w("| offered/s | system | achieved/s | p50 / p99 / max (ms) | connector | broker | walsender | peak RSS |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Steady {
			if s.System != minimalSystem && s.System != defaultSystem {
				continue
			}
			pe, c := perEventOf(&s), s.CommitToConsume
			w("| %s | %s | %s | %s / %s / %s | %.1f | %.1f | %.1f | %.1f MB |\n", thousands(s.OfferedRate), s.label(),
				thousands(int(s.AchievedRate)), ms(c.P50Ms), ms(c.P99Ms), ms(c.MaxMs), pe.client, pe.broker, pe.walsender, mb(s.PeakRSSBytes))
		}
		w("\n")
	}
	if hasDrain {
		w("Drain: the minimal connector on a slot of its own after each connector run, timed from process start to its exit "+
			"once it has confirmed all %s events (`-stop-after`); CPU and peak RSS from its rusage.\n\n", thousands(r.Params.Events))
		w("| transactions | pg_recvlogical | minimal | connector | connector / minimal | minimal runs (s) | minimal CPU per 1,000 events | minimal peak RSS | verified: distinct / duplicates |\n")
		w("|---|---|---|---|---|---|---|---|---|\n")
		for _, d := range r.Drains {
			if d.Minimal == nil {
				continue
			}
			var runs, verified []string
			for _, x := range d.MinimalRuns {
				runs = append(runs, fmt.Sprintf("%.2f", x.Seconds))
				verified = append(verified, fmt.Sprintf("%s / %s", thousands(int(x.Verified.Distinct)), thousands(int(x.Verified.Duplicates))))
			}
			m := d.Minimal
			w("| %s × %s events | %s/s | **%s/s** | %s/s | **%.2f×** | %s | %.1f ms | %.1f MB | %s |\n",
				thousands(d.Transactions), thousands(d.TxSize), thousands(int(d.RecvLogical.EventsPerSec)), thousands(int(m.EventsPerSec)),
				thousands(int(d.Connector.EventsPerSec)), d.MinimalRatio, strings.Join(runs, ", "), perK(m.CPU.Client, d.Events),
				mb(m.PeakRSSBytes), strings.Join(verified, "; "))
		}
		w("\n")
	}
}

// renderCapacity is one row per searched system and its probes.
func renderCapacity(w func(string, ...any), r *Results) {
	if len(r.Capacity) == 0 {
		return
	}
	w("## Capacity\n\n")
	w("For each system, the highest offered rate (one-row transactions, %d writers) whose probe kept commit-to-consume "+
		"p99 ≤ %g ms, every event delivered within the settle wait and the writers at ≥ %.0f%% of the rate: probes of %s each, "+
		"the rate doubled from the first until one failed, then bisected (geometric mean) between the highest pass and the "+
		"lowest failure. CPU per event is at the capacity's probe, in µs. ✓ passed, ✗ failed (why).\n\n",
		r.Params.Writers, r.Params.CapacityP99Ms, 100*achievedShare, r.Params.CapacityDuration)
	w("| system | capacity (events/s) | p50 / p99 there (ms) | connector | broker | walsender | busy cores | probes | search ended |\n")
	w("|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Capacity {
		at, p50p99, conn, brk, wal, busy := c.at(), "—", "—", "—", "—", "—"
		if at != nil {
			p50p99 = fmt.Sprintf("%s / %s", ms(at.P50Ms), ms(at.P99Ms))
			conn, brk, wal = fmt.Sprintf("%.1f", at.ConnectorUs), fmt.Sprintf("%.1f", at.BrokerUs), fmt.Sprintf("%.1f", at.WALSenderUs)
			busy = fmt.Sprintf("%.2f", at.BusyCores)
		}
		w("| %s | **%s** | %s | %s | %s | %s | %s | %s | %s |\n", c.System, thousands(c.Capacity), p50p99, conn, brk, wal, busy,
			probesText(c.Probes), dash(c.Stopped))
	}
	w("\n")
}

// probesText is a search's probes in order: "2,000 ✓ 3.10 ms; 4,000 ✗ p99 61 ms".
func probesText(ps []CapacityProbe) string {
	var parts []string
	for _, p := range ps {
		if p.Passed {
			parts = append(parts, fmt.Sprintf("%s ✓ %s ms", thousands(p.Rate), ms(p.P99Ms)))
		} else {
			parts = append(parts, fmt.Sprintf("%s ✗ %s", thousands(p.Rate), p.Reason))
		}
	}
	return dash(strings.Join(parts, "; "))
}
