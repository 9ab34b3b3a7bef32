package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Delivery modes of the connector contender (kafka.delivery). The
// exactly_once rows run the same connector binary on their own slot, topics
// and positions topic, read by a read_committed consumer: what a consumer of
// that mode must do, so its latency includes the wait for the commit marker.
const (
	atLeastOnce = "at_least_once"
	exactlyOnce = "exactly_once"
)

// eosSystem is the steady-run name of the exactly_once connector (a topic
// name part once its dashes are dropped, so no spaces).
const eosSystem = "outbox-cdc-" + exactlyOnce

// parseDeliveries reads -delivery: at_least_once always runs (every other
// row compares with it); exactly_once is added or left out.
func parseDeliveries(s string) ([]string, error) {
	out := []string{atLeastOnce}
	for _, p := range splitList(s) {
		switch p {
		case atLeastOnce:
		case exactlyOnce:
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		default:
			return nil, fmt.Errorf("-delivery: unknown mode %q (want %s, %s)", p, atLeastOnce, exactlyOnce)
		}
	}
	return out, nil
}

// eos reports whether the exactly_once rows run.
func (o options) eos() bool { return slices.Contains(o.Deliveries, exactlyOnce) }

// isolation is the benchmark consumer's extra option for a topic: an
// exactly_once one (committed) is read with read_committed, so records of
// aborted (or still open) transactions are never handed over.
func isolation(committed bool) []kgo.Opt {
	if committed {
		return []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	}
	return nil
}

// waitNoMore waits until no record arrived for quiet.
func (a *arrivals) waitNoMore(ctx context.Context, quiet time.Duration) error {
	last, since := a.records.Load(), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Since(since) < quiet {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if n := a.records.Load(); n != last {
			last, since = n, time.Now()
		}
	}
	return nil
}

// eosCost is what exactly_once costs against at_least_once in one run:
// Ratio is its throughput (drain) or achieved rate (steady) over
// at_least_once's; the differences are exactly_once minus at_least_once.
type eosCost struct {
	Run         string
	Ratio       float64
	P50DiffMs   float64 // steady only
	P99DiffMs   float64 // steady only
	CPUDiffUs   float64 // connector CPU per event
	RSSDiffMB   float64
	HasLatency  bool
	ALOEventsPS float64
	EOSEventsPS float64
}

// eosCosts pairs every exactly_once run with the at_least_once run beside it.
func eosCosts(r *Results) []eosCost {
	var out []eosCost
	for _, d := range r.Drains {
		if d.ExactlyOnce == nil || d.Connector.EventsPerSec == 0 {
			continue
		}
		x := d.ExactlyOnce
		out = append(out, eosCost{
			Run:         fmt.Sprintf("drain, %s-event transactions", thousands(d.TxSize)),
			Ratio:       x.EventsPerSec / d.Connector.EventsPerSec,
			CPUDiffUs:   usPerEvent(x.CPU.Client, d.Events) - usPerEvent(d.Connector.CPU.Client, d.Events),
			RSSDiffMB:   mb(d.eosPeakRSS()) - mb(d.PeakRSSBytes),
			ALOEventsPS: d.Connector.EventsPerSec, EOSEventsPS: x.EventsPerSec,
		})
	}
	for _, rate := range r.Params.Rates {
		a, x := findSteady(r, "outbox-cdc", rate), findSteady(r, eosSystem, rate)
		if a == nil || x == nil || a.AchievedRate == 0 || a.CommitToConsume.N == 0 || x.CommitToConsume.N == 0 {
			continue
		}
		out = append(out, eosCost{
			Run:         fmt.Sprintf("steady, %s events/s", thousands(rate)),
			Ratio:       x.AchievedRate / a.AchievedRate,
			P50DiffMs:   x.CommitToConsume.P50Ms - a.CommitToConsume.P50Ms,
			P99DiffMs:   x.CommitToConsume.P99Ms - a.CommitToConsume.P99Ms,
			CPUDiffUs:   perEventOf(x).client - perEventOf(a).client,
			RSSDiffMB:   mb(x.PeakRSSBytes) - mb(a.PeakRSSBytes),
			HasLatency:  true,
			ALOEventsPS: a.AchievedRate, EOSEventsPS: x.AchievedRate,
		})
	}
	return out
}

// String is the report's one line for the run.
func (c eosCost) String() string {
	s := fmt.Sprintf("%s: throughput %s/s vs %s/s = **%.2f×**", c.Run, thousands(int(c.EOSEventsPS)), thousands(int(c.ALOEventsPS)), c.Ratio)
	if c.HasLatency {
		s += fmt.Sprintf(", commit → consume p50 %s ms, p99 %s ms", signed(c.P50DiffMs), signed(c.P99DiffMs))
	}
	return s + fmt.Sprintf(", connector CPU %s µs/event, peak RSS %s MB", signed(c.CPUDiffUs), signed(c.RSSDiffMB))
}

func signed(v float64) string {
	if v >= 0 {
		return "+" + ms(v)
	}
	return "−" + ms(-v)
}

// renderDrainEOS is the exactly_once drains beside the at_least_once ones.
func renderDrainEOS(w func(string, ...any), r *Results) {
	if !slices.ContainsFunc(r.Drains, func(d DrainResult) bool { return d.ExactlyOnce != nil }) {
		return
	}
	w("### exactly_once drain\n\n")
	w("The same binary with `kafka.delivery: exactly_once` (default `kafka.transaction_interval`) drains its own slots, " +
		"created before the preload like the others, right after each at_least_once run, onto its own topics and positions " +
		"topic, timed the same way; a `read_committed` consumer (what an exactly_once consumer must use) then requires " +
		"every event and no duplicate.\n\n")
	w("| transactions | at_least_once | exactly_once | ratio | exactly_once runs (s) | CPU per event: at_least_once / exactly_once | peak RSS: at_least_once / exactly_once | verified: distinct / duplicates |\n")
	w("|---|---|---|---|---|---|---|---|\n")
	for _, d := range r.Drains {
		x := d.ExactlyOnce
		if x == nil {
			continue
		}
		var runs, verified []string
		for _, c := range d.ExactlyOnceRuns {
			runs = append(runs, fmt.Sprintf("%.2f", c.Seconds))
			verified = append(verified, fmt.Sprintf("%s / %s", thousands(int(c.Verified.Distinct)), thousands(int(c.Verified.Duplicates))))
		}
		ratio := 0.0
		if d.Connector.EventsPerSec > 0 {
			ratio = x.EventsPerSec / d.Connector.EventsPerSec
		}
		w("| %s × %s events | %s/s | **%s/s** | %.2f× | %s | %.1f / %.1f µs | %.1f / %.1f MB | %s |\n",
			thousands(d.Transactions), thousands(d.TxSize), thousands(int(d.Connector.EventsPerSec)), thousands(int(x.EventsPerSec)),
			ratio, dash(strings.Join(runs, ", ")), usPerEvent(d.Connector.CPU.Client, d.Events), usPerEvent(x.CPU.Client, d.Events),
			mb(d.PeakRSSBytes), mb(d.eosPeakRSS()), dash(strings.Join(verified, "; ")))
	}
	w("\n")
}

// renderEOSCost is one line per run: what exactly_once costs.
func renderEOSCost(w func(string, ...any), r *Results) {
	costs := eosCosts(r)
	if len(costs) == 0 {
		return
	}
	w("## Cost of exactly_once\n\n")
	w("Each exactly_once run against the at_least_once run beside it (same binary, same run; differences are exactly_once " +
		"minus at_least_once; steady latency is commit → consume, read with `read_committed` for exactly_once).\n\n")
	for _, c := range costs {
		w("- %s\n", c)
	}
	w("\n")
}

// eosPeakRSS is the highest VmHWM of the exactly_once runs.
func (d DrainResult) eosPeakRSS() int64 {
	var peak int64
	for _, r := range d.ExactlyOnceRuns {
		peak = max(peak, r.PeakRSSBytes)
	}
	return peak
}
