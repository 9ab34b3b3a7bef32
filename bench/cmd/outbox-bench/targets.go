package main

import (
	"fmt"
	"slices"
	"strings"
)

// Target is one goal of the performance issue, measured.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	// Status is "met", "not met" or "not measured".
	Status string `json:"status"`
	// Limit says what limits a target that is not met, from the run's own
	// numbers.
	Limit string `json:"limit,omitempty"`
}

const (
	statusMet         = "met"
	statusNotMet      = "not met"
	statusNotMeasured = "not measured"

	rssLimitBytes   = 64e6
	ackTargetRate   = 2000
	ackTargetP99Ms  = 10
	drainTarget     = 1.0
	relayTargetTime = 50
)

func status(ok bool) string {
	if ok {
		return statusMet
	}
	return statusNotMet
}

func evaluateTargets(r *Results) []Target {
	var ts []Target
	ts = append(ts, drainTargets(r)...)
	ts = append(ts, steadyTargets(r)...)
	ts = append(ts, frontierTargets(r)...)
	ts = append(ts, minimalTargets(r)...)
	ts = append(ts, ackTarget(r), rssTarget(r), allocTarget(r))
	ts = append(ts, debeziumTargets(r)...)
	ts = append(ts, relayTargets(r)...)
	return ts
}

func drainTargets(r *Results) []Target {
	if len(r.Drains) == 0 {
		return []Target{{Name: "drain rate", Goal: fmt.Sprintf("≥ %.1f× pg_recvlogical", drainTarget), Status: statusNotMeasured}}
	}
	var ts []Target
	for _, d := range r.Drains {
		t := Target{
			Name: fmt.Sprintf("drain rate, %s-event transactions", thousands(d.TxSize)),
			Goal: fmt.Sprintf("≥ %.1f× pg_recvlogical", drainTarget),
		}
		if d.Connector.Seconds == 0 || d.RecvLogical.Seconds == 0 {
			t.Status = statusNotMeasured
			ts = append(ts, t)
			continue
		}
		t.Measured = fmt.Sprintf("%s vs %s events/s = %.2f×", thousands(int(d.Connector.EventsPerSec)),
			thousands(int(d.RecvLogical.EventsPerSec)), d.Ratio)
		t.Status = status(d.Ratio >= drainTarget)
		if t.Status == statusNotMet {
			c := d.Connector.CPU
			t.Limit = fmt.Sprintf("CPU: %.2f of %d cores busy during the drain; per 1,000 events the connector used %.1f ms CPU, "+
				"Kafka %.1f ms, PostgreSQL %.1f ms (pg_recvlogical's client used %.1f ms, its walsender %.1f ms)",
				c.MachineBusyCores, r.Env.Cores, perK(c.Client, d.Events), perK(c.Kafka, d.Events), perK(c.Postgres, d.Events),
				perK(d.RecvLogical.CPU.Client, d.Events), perK(d.RecvLogical.CPU.Postgres, d.Events)) +
				sharedNote(c, "the connector drain") + sharedNote(d.RecvLogical.CPU, "the pg_recvlogical drain")
		}
		ts = append(ts, t)
	}
	return ts
}

func perK(seconds float64, events int) float64 { return seconds * 1e6 / float64(events) }

// sharedNote says how much of the machine other processes took during a
// run, when that is enough to skew it.
func sharedNote(c CPUUsage, run string) string {
	if c.WallSeconds <= 0 {
		return ""
	}
	other := c.Other / c.WallSeconds
	if other < 0.25 {
		return ""
	}
	return fmt.Sprintf("; the machine was shared during %s: other processes used %.2f cores on average", run, other)
}

func ackTarget(r *Results) Target {
	t := Target{Name: "commit-to-ack p99 at 2,000 events/s", Goal: fmt.Sprintf("≤ %d ms", ackTargetP99Ms)}
	s := findSteady(r, "outbox-cdc", ackTargetRate)
	if s == nil || s.CommitToAck == nil {
		t.Status = statusNotMeasured
		return t
	}
	h := s.CommitToAck
	t.Measured = fmt.Sprintf("p99 ≤ %s ms (histogram bucket; interpolated %.1f ms); commit-to-consume p99 %.1f ms exact; achieved %s events/s",
		bound(h.P99UpperMs), h.P99EstimateMs, s.CommitToConsume.P99Ms, thousands(int(s.AchievedRate)))
	t.Status = status(h.P99UpperMs > 0 && h.P99UpperMs <= ackTargetP99Ms)
	if t.Status == statusNotMet {
		c := s.CPU
		t.Limit = fmt.Sprintf("CPU: %.2f of %d cores busy; during the run Kafka used %.2f cores, PostgreSQL %.2f, the connector %.2f, "+
			"the writers and consumer %.2f", c.MachineBusyCores, r.Env.Cores, c.Kafka/c.WallSeconds, c.Postgres/c.WallSeconds,
			c.Client/c.WallSeconds, c.Bench/c.WallSeconds) + sharedNote(c, "the run")
		for _, v := range r.Steady {
			if v.Linger != "" && v.OfferedRate == ackTargetRate && v.CommitToAck != nil {
				t.Limit += fmt.Sprintf("; with kafka.linger=%s (fewer, larger produce requests) p99 ≤ %s ms",
					v.Linger, bound(v.CommitToAck.P99UpperMs))
			}
		}
	}
	return t
}

func rssTarget(r *Results) Target {
	t := Target{Name: "connector peak RSS, any load", Goal: fmt.Sprintf("≤ %.0f MB", mb(rssLimitBytes))}
	var peak int64
	var where []string
	for _, d := range r.Drains {
		if d.PeakRSSBytes > 0 {
			where = append(where, fmt.Sprintf("drain %s-event txns %.1f MB", thousands(d.TxSize), mb(d.PeakRSSBytes)))
			peak = max(peak, d.PeakRSSBytes)
		}
	}
	// Issue 12's targets are at_least_once's; exactly_once has its own rows.
	for _, s := range r.Steady {
		if s.PeakRSSBytes > 0 && strings.HasPrefix(s.System, "outbox-cdc") && s.System != eosSystem {
			where = append(where, fmt.Sprintf("%s at %s/s %.1f MB", s.label(), thousands(s.OfferedRate), mb(s.PeakRSSBytes)))
			peak = max(peak, s.PeakRSSBytes)
		}
	}
	if peak == 0 {
		t.Status = statusNotMeasured
		return t
	}
	t.Measured = fmt.Sprintf("max %.1f MB (%s)", mb(peak), strings.Join(where, ", "))
	t.Status = status(peak <= rssLimitBytes)
	if t.Status == statusNotMet {
		t.Limit = "the producer buffer (kafka.max_buffered_records/bytes) and the WAL queue fill during a backlog drain"
	}
	return t
}

func mb(b int64) float64 { return float64(b) / 1e6 }

// allocTarget: every decode benchmark and the router's hot path (not its
// dead-letter path) must report 0 allocs/op.
func allocTarget(r *Results) Target {
	t := Target{Name: "allocations per event in decode and routing", Goal: "0 allocs/op"}
	var parts []string
	worst := 0.0
	seen := map[string]bool{}
	for _, m := range r.Micro {
		pkg := shortPkg(m.Package)
		if pkg != "decode" && pkg != "router" {
			continue
		}
		if strings.Contains(m.Name, "DeadLetter") {
			continue
		}
		seen[pkg] = true
		parts = append(parts, fmt.Sprintf("%s %g", strings.TrimPrefix(benchName(m.Name), "Benchmark"), m.AllocsPerOp))
		worst = max(worst, m.AllocsPerOp)
	}
	if len(parts) == 0 {
		t.Status = statusNotMeasured
		return t
	}
	t.Measured = strings.Join(parts, ", ")
	t.Status = status(worst == 0)
	var missing []string
	for _, p := range []string{"decode", "router"} {
		if !seen[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Status = statusNotMeasured
		t.Limit = "no benchmark in " + strings.Join(missing, ", ")
	}
	return t
}

// benchName drops the -GOMAXPROCS suffix.
func benchName(n string) string {
	if i := strings.LastIndexByte(n, '-'); i > 0 {
		return n[:i]
	}
	return n
}

func relayTargets(r *Results) []Target {
	var names []string
	for _, s := range r.Steady {
		if s.PollInterval != "" && !slices.Contains(names, s.System) {
			names = append(names, s.System)
		}
	}
	if len(names) == 0 {
		return []Target{{Name: "polling relay median latency", Goal: "≥ 50× outbox-cdc's", Status: statusNotMeasured}}
	}
	var ts []Target
	for _, name := range names {
		t := Target{Name: "polling relay median latency, " + name, Goal: fmt.Sprintf("≥ %d× outbox-cdc's", relayTargetTime)}
		var parts, limits []string
		minRatio := -1.0
		for _, rate := range r.Params.Rates {
			rs, ours := findSteady(r, name, rate), findSteady(r, "outbox-cdc", rate)
			if rs == nil || ours == nil || ours.CommitToConsume.P50Ms <= 0 || rs.CommitToConsume.N == 0 {
				continue
			}
			ratio := rs.CommitToConsume.P50Ms / ours.CommitToConsume.P50Ms
			parts = append(parts, fmt.Sprintf("%s/s: %s ms vs %s ms = %s×", thousands(rate),
				ms(rs.CommitToConsume.P50Ms), ms(ours.CommitToConsume.P50Ms), ratioText(ratio)))
			if minRatio < 0 || ratio < minRatio {
				minRatio = ratio
			}
			if ratio >= relayTargetTime {
				continue
			}
			if ours.CommitToConsume.P50Ms > 10 {
				limits = append(limits, fmt.Sprintf("at %s/s outbox-cdc itself is slow (median %s ms, %.2f of %d cores busy)",
					thousands(rate), ms(ours.CommitToConsume.P50Ms), ours.CPU.MachineBusyCores, r.Env.Cores))
			} else {
				limits = append(limits, fmt.Sprintf("at %s/s the relay's median (%s ms) is about half its poll interval plus a "+
					"claim-produce-update round trip, under 50× outbox-cdc's %s ms", thousands(rate),
					ms(rs.CommitToConsume.P50Ms), ms(ours.CommitToConsume.P50Ms)))
			}
		}
		if minRatio < 0 {
			t.Status = statusNotMeasured
		} else {
			t.Measured = strings.Join(parts, "; ")
			t.Status = status(minRatio >= relayTargetTime)
			t.Limit = strings.Join(limits, "; ")
		}
		ts = append(ts, t)
	}
	return ts
}

func ratioText(x float64) string {
	if x < 10 {
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.0f", x)
}

// findSteady is system's one-row run at rate (the shape targets are set
// for), or nil.
func findSteady(r *Results, system string, rate int) *SteadyResult {
	for i := range r.Steady {
		if r.Steady[i].System == system && r.Steady[i].OfferedRate == rate && r.Steady[i].oneRow() {
			return &r.Steady[i]
		}
	}
	return nil
}

// thousands formats n with comma separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// bound formats a histogram upper bound in ms (-1 is +Inf).
func bound(ms float64) string {
	if ms < 0 {
		return "+Inf"
	}
	return fmt.Sprintf("%g", round(ms, 3))
}
