package main

import (
	"fmt"
	"slices"
	"strings"
)

// Targets of issue 12 for the steady rates, the floors and Debezium.

// steadyGoal is what one steady rate must achieve; zero fields have no goal.
type steadyGoal struct {
	rate         int
	p99Ms        float64 // commit → consume p99
	connectorUs  float64 // connector CPU per event
	brokerFactor float64 // broker CPU per event over the bare producer's
}

var steadyGoals = []steadyGoal{
	{rate: 500, p99Ms: 5},
	{rate: 2000, p99Ms: 10, connectorUs: 30, brokerFactor: 1.5},
	{rate: 10000, p99Ms: 50, connectorUs: 20},
}

const (
	dbzDrainFactor = 10 // drain throughput ≥ 10× Debezium's
	dbzRSSFactor   = 20 // peak RSS ≤ 1/20 of Debezium's
	dbzP99Factor   = 50 // p99 ≥ 50× lower than Debezium's
)

// perEvent is a run's CPU per committed event in µs.
type perEvent struct{ client, walsender, broker, postgres float64 }

func perEventOf(s *SteadyResult) perEvent {
	n, c := s.Committed, s.CPU
	return perEvent{usPerEvent(c.Client, n), usPerEvent(c.PostgresPath, n), usPerEvent(c.Kafka, n), usPerEvent(c.Postgres, n)}
}

func steadyTargets(r *Results) []Target {
	var ts []Target
	for _, g := range steadyGoals {
		ours := findSteady(r, "outbox-cdc", g.rate)
		rate := thousands(g.rate) + " events/s"
		if g.p99Ms > 0 {
			t := Target{Name: "commit → consume p99 at " + rate, Goal: fmt.Sprintf("≤ %g ms", g.p99Ms)}
			if ours == nil || ours.CommitToConsume.N == 0 {
				t.Status = statusNotMeasured
			} else {
				c := ours.CommitToConsume
				t.Measured = fmt.Sprintf("%s ms (p50 %s ms, %d events, achieved %s/s)", ms(c.P99Ms), ms(c.P50Ms), c.N, thousands(int(ours.AchievedRate)))
				t.Status = status(c.P99Ms <= g.p99Ms)
				if t.Status == statusNotMet {
					t.Limit = cpuLimit(r, ours)
				}
			}
			ts = append(ts, t)
		}
		if g.connectorUs > 0 {
			t := Target{Name: "connector CPU per event at " + rate, Goal: fmt.Sprintf("≤ %g µs", g.connectorUs)}
			if ours == nil || ours.Committed == 0 {
				t.Status = statusNotMeasured
			} else {
				pe := perEventOf(ours)
				t.Measured = fmt.Sprintf("%.1f µs (%.2f s over %s events)", pe.client, ours.CPU.Client, thousands(ours.Committed))
				if f := findSteady(r, floorRecv, g.rate); f != nil && f.Committed > 0 {
					t.Measured += fmt.Sprintf("; pg_recvlogical's client %.1f µs", perEventOf(f).client)
				}
				t.Status = status(pe.client <= g.connectorUs)
				if t.Status == statusNotMet {
					t.Limit = cpuLimit(r, ours)
				}
			}
			ts = append(ts, t)
		}
		if g.brokerFactor > 0 {
			t := Target{Name: "broker CPU per event at " + rate, Goal: fmt.Sprintf("≤ %g× the bare producer's", g.brokerFactor)}
			floor := findSteady(r, floorProducer, g.rate)
			if ours == nil || floor == nil || ours.Committed == 0 || floor.Committed == 0 || floor.CPU.Kafka <= 0 {
				t.Status = statusNotMeasured
			} else {
				a, b := perEventOf(ours).broker, perEventOf(floor).broker
				t.Measured = fmt.Sprintf("%.1f µs vs %.1f µs = %.2f×", a, b, a/b)
				t.Status = status(a/b <= g.brokerFactor)
				switch {
				case a < b:
					// Below its floor: the bare loop is not a floor yet (its
					// strict pacing sends about one record per produce
					// request), so no verdict either way.
					t.Status = statusNotMeasured
					t.Limit = "the bare producer's broker CPU is above the connector's, so it is not a floor: its pacing sends about one record per request"
				case t.Status == statusNotMet:
					t.Limit = "more, smaller produce requests than the bare loop makes" + sharedNote(ours.CPU, "the run")
				}
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// cpuLimit says where a steady run's CPU went.
func cpuLimit(r *Results, s *SteadyResult) string {
	c := s.CPU
	if c.WallSeconds <= 0 {
		return ""
	}
	return fmt.Sprintf("CPU: %.2f of %d cores busy; Kafka %.2f cores, PostgreSQL %.2f, the connector %.2f, the writers and consumer %.2f",
		c.MachineBusyCores, r.Env.Cores, c.Kafka/c.WallSeconds, c.Postgres/c.WallSeconds, c.Client/c.WallSeconds,
		c.Bench/c.WallSeconds) + sharedNote(c, "the run")
}

func debeziumTargets(r *Results) []Target {
	drain := Target{Name: "drain throughput vs Debezium", Goal: fmt.Sprintf("≥ %d× Debezium's", dbzDrainFactor)}
	rss := Target{Name: "peak RSS vs Debezium", Goal: fmt.Sprintf("≤ 1/%d of Debezium's", dbzRSSFactor)}
	p99 := Target{Name: "commit → consume p99 vs Debezium", Goal: fmt.Sprintf("≥ %d× lower", dbzP99Factor)}
	ts := []*Target{&drain, &rss, &p99}
	if r.DebeziumSkipped != "" {
		for _, t := range ts {
			t.Status, t.Limit = statusNotMeasured, "Debezium skipped: "+r.DebeziumSkipped
		}
		return []Target{drain, rss, p99}
	}

	var parts []string
	minRatio := -1.0
	for _, d := range r.Drains {
		if d.Debezium == nil || d.DebeziumRatio <= 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s-event txns: %s vs %s events/s = %s×", thousands(d.TxSize),
			thousands(int(d.Connector.EventsPerSec)), thousands(int(d.Debezium.EventsPerSec)), ratioText(d.DebeziumRatio)))
		if minRatio < 0 || d.DebeziumRatio < minRatio {
			minRatio = d.DebeziumRatio
		}
	}
	setRatio(&drain, parts, minRatio, dbzDrainFactor)

	var ours, theirs int64
	for _, d := range r.Drains {
		ours = max(ours, d.PeakRSSBytes)
		if d.Debezium != nil {
			theirs = max(theirs, d.Debezium.PeakRSSBytes)
		}
	}
	for _, s := range r.Steady {
		switch {
		case s.System == "debezium":
			theirs = max(theirs, s.PeakRSSBytes)
		case strings.HasPrefix(s.System, "outbox-cdc") && s.System != eosSystem:
			ours = max(ours, s.PeakRSSBytes)
		}
	}
	if ours > 0 && theirs > 0 {
		ratio := float64(theirs) / float64(ours)
		setRatio(&rss, []string{fmt.Sprintf("%.1f MB vs %.1f MB = 1/%s", mb(ours), mb(theirs), ratioText(ratio))}, ratio, dbzRSSFactor)
	} else {
		rss.Status = statusNotMeasured
	}

	parts, minRatio = nil, -1
	for _, rate := range r.Params.Rates {
		o, d := findSteady(r, "outbox-cdc", rate), findSteady(r, "debezium", rate)
		if o == nil || d == nil || o.CommitToConsume.P99Ms <= 0 || d.CommitToConsume.N == 0 {
			continue
		}
		ratio := d.CommitToConsume.P99Ms / o.CommitToConsume.P99Ms
		parts = append(parts, fmt.Sprintf("%s/s: %s ms vs %s ms = %s×", thousands(rate), ms(o.CommitToConsume.P99Ms),
			ms(d.CommitToConsume.P99Ms), ratioText(ratio)))
		if minRatio < 0 || ratio < minRatio {
			minRatio = ratio
		}
	}
	setRatio(&p99, parts, minRatio, dbzP99Factor)
	return []Target{drain, rss, p99}
}

// setRatio fills a target met when the smallest ratio reaches goal.
func setRatio(t *Target, parts []string, minRatio, goal float64) {
	if minRatio < 0 {
		t.Status = statusNotMeasured
		return
	}
	t.Measured = strings.Join(parts, "; ")
	t.Status = status(minRatio >= goal)
}

// renderPerEvent is the CPU per event of every steady run beside the floors
// of its rate.
func renderPerEvent(w func(string, ...any), r *Results) {
	if len(r.Steady) == 0 {
		return
	}
	w("## CPU per event\n\n")
	w("CPU time from /proc over each steady run divided by the events committed in it, in µs. **client** is the process " +
		"carrying the events (the connector, Debezium's JVM, pg_recvlogical; the bare producer runs inside the benchmark " +
		"process and is not in this column); **walsender** the backend serving its slot; **broker** the Kafka JVM. The two " +
		"floors of each rate run just before the systems, at the same rate: `pg_recvlogical` streaming its own slot to " +
		"/dev/null while the same writers insert (the WAL side's floor: walsender + client), and `producer-floor`, a bare " +
		"franz-go loop producing the same records with the connector's client settings and no PostgreSQL (the broker " +
		"side's floor).\n\n")
	w("| offered/s | system | events | client | walsender | broker | broker / floor | PostgreSQL total | busy cores |\n")
	w("|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range r.Params.Rates {
		var floor float64
		if f := findSteady(r, floorProducer, rate); f != nil && f.Committed > 0 {
			floor = perEventOf(f).broker
		}
		for _, s := range r.Steady {
			if s.OfferedRate != rate || s.PollInterval != "" {
				continue
			}
			pe := perEventOf(&s)
			client, walsender, ratio, pg := fmt.Sprintf("%.1f", pe.client), fmt.Sprintf("%.1f", pe.walsender), "—", fmt.Sprintf("%.1f", pe.postgres)
			if s.System == floorProducer {
				client, walsender, pg = "—", "—", "—"
			}
			if floor > 0 && s.System != floorRecv {
				ratio = fmt.Sprintf("%.2f×", pe.broker/floor)
			}
			name := s.label()
			if slices.Contains([]string{floorRecv, floorProducer}, s.System) {
				name = "*" + name + " (floor)*"
			}
			w("| %s | %s | %s | %s | %s | %.1f | %s | %s | %.2f |\n", thousands(rate), name, thousands(s.Committed),
				client, walsender, pe.broker, ratio, pg, s.CPU.MachineBusyCores)
		}
	}
	w("\nThe pg_recvlogical floor's broker column is the idle broker's own CPU over the run (nothing is produced).\n\n")
}

// renderDebezium says loudly when Debezium was skipped, and shows its drains.
func renderDebezium(w func(string, ...any), r *Results) {
	if r.DebeziumSkipped != "" {
		w("## Debezium\n\n**Debezium was skipped: %s.** Its targets are not measured.\n\n", oneLine(r.DebeziumSkipped))
		return
	}
	if !slices.ContainsFunc(r.Drains, func(d DrainResult) bool { return d.Debezium != nil }) {
		return
	}
	w("## Debezium drain\n\n")
	w("Debezium %s: the PostgreSQL connector (pgoutput, its own slot created before the preload and its own publication, "+
		"snapshot.mode=no_data) with the Outbox EventRouter (key aggregate_id, value payload, topic from aggregate_type, "+
		"headers id, event_type, aggregate_type) on Kafka Connect standalone (`-Xmx2G` as connect-standalone.sh; producer "+
		"at the client's defaults plus acks=all and idempotence), one run per transaction size, timed from JVM start until "+
		"the benchmark's consumer has every event.\n\n", "3.6.1.Final")
	w("| transactions | Debezium | outbox-cdc | outbox-cdc / Debezium | start-up | peak RSS | client CPU | PostgreSQL | Kafka | verified: distinct / duplicates |\n")
	w("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, d := range r.Drains {
		x := d.Debezium
		if x == nil {
			continue
		}
		w("| %s events | %.2f s = **%s/s** | %s/s | **%s×** | %.2f s | %.1f MB | %.2f s | %.2f s | %.2f s | %s / %s |\n",
			thousands(d.TxSize), x.Seconds, thousands(int(x.EventsPerSec)), thousands(int(d.Connector.EventsPerSec)),
			ratioText(d.DebeziumRatio), x.ReadySeconds, mb(x.PeakRSSBytes), x.CPU.Client, x.CPU.Postgres, x.CPU.Kafka,
			thousands(int(x.Verified.Distinct)), thousands(int(x.Verified.Duplicates)))
	}
	w("\n")
}
