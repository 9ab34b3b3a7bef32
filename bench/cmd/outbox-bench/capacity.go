package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// The capacity scenario (issue 39) replaces a fixed high rate: for the
// default connector, the minimal connector and the connector with fixed
// lingers it searches the highest offered rate whose short steady run keeps
// commit-to-consume p99 within a bound, and reports the CPU per event there.

// capacityOptions are the scenario's flags.
type capacityOptions struct {
	Lingers   []time.Duration // fixed kafka.linger values searched besides the default and the minimal
	Start     int             // the first probe's rate
	Max       int             // no probe above it
	Growth    float64         // factor between probes until one fails
	Precision float64         // bisection ends when the lowest failure is within this of the highest pass
	Probes    int             // probes per system at most
	Duration  time.Duration   // writing time per probe
	Settle    time.Duration   // wait for a probe's last events
	P99       time.Duration   // the bound a probe must keep
	Budget    time.Duration   // the whole scenario: no probe starts that would end past it
}

// flags registers the scenario's flags; the comma list of lingers is
// returned to be parsed with the other lists.
func (c *capacityOptions) flags(fs *flag.FlagSet) *string {
	lingers := fs.String("capacity-lingers", "0s,2ms,10ms", "capacity: fixed kafka.linger values searched besides the default and the minimal connector, comma list")
	fs.IntVar(&c.Start, "capacity-start", 2000, "capacity: the first probe's rate in events/s")
	fs.IntVar(&c.Max, "capacity-max", 64000, "capacity: the highest rate probed")
	fs.Float64Var(&c.Growth, "capacity-growth", 2, "capacity: rate factor between probes until one fails")
	fs.Float64Var(&c.Precision, "capacity-precision", 0.1, "capacity: bisect until the lowest failing rate is within this fraction of the highest passing one")
	fs.IntVar(&c.Probes, "capacity-probes", 8, "capacity: probes per system at most")
	fs.DurationVar(&c.Duration, "capacity-duration", 5*time.Second, "capacity: writing time per probe")
	fs.DurationVar(&c.Settle, "capacity-settle", 10*time.Second, "capacity: wait for a probe's last events (a probe that needs longer fails)")
	fs.DurationVar(&c.P99, "capacity-p99", 50*time.Millisecond, "capacity: the commit-to-consume p99 a probe must keep")
	fs.DurationVar(&c.Budget, "capacity-budget", 20*time.Minute, "capacity: time for the whole scenario (the systems are probed in turn; no probe starts that would end past it)")
	return lingers
}

func (c capacityOptions) validate() error {
	switch {
	case c.Start <= 0 || c.Max < c.Start:
		return fmt.Errorf("-capacity-start %d, -capacity-max %d: want 0 < start ≤ max", c.Start, c.Max)
	case c.Growth <= 1:
		return fmt.Errorf("-capacity-growth %g: must be above 1", c.Growth)
	case c.Precision <= 0:
		return fmt.Errorf("-capacity-precision %g: must be positive", c.Precision)
	case c.Probes <= 0:
		return fmt.Errorf("-capacity-probes %d: must be positive", c.Probes)
	case c.Duration < time.Second || c.Settle <= 0 || c.P99 <= 0 || c.Budget <= 0:
		return fmt.Errorf("-capacity-duration %v (≥ 1s), -capacity-settle %v, -capacity-p99 %v, -capacity-budget %v: must be positive",
			c.Duration, c.Settle, c.P99, c.Budget)
	}
	return nil
}

// CapacityResult is one system's search.
type CapacityResult struct {
	System string `json:"system"`
	Linger string `json:"linger,omitempty"`
	// Capacity is the highest rate that passed below the lowest that failed
	// (0: none passed).
	Capacity int             `json:"capacity"`
	Stopped  string          `json:"stopped"` // why the search ended
	Probes   []CapacityProbe `json:"probes"`
}

// CapacityProbe is one short steady run of a search.
type CapacityProbe struct {
	Rate        int     `json:"rate"`
	Achieved    float64 `json:"achieved_rate"`
	Received    int64   `json:"received"`
	Committed   int     `json:"committed"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	ConnectorUs float64 `json:"connector_us_per_event"`
	BrokerUs    float64 `json:"broker_us_per_event"`
	WALSenderUs float64 `json:"walsender_us_per_event"`
	BusyCores   float64 `json:"busy_cores"`
	Passed      bool    `json:"passed"`
	Reason      string  `json:"reason,omitempty"` // why it failed
}

// at is the probe at the capacity, or nil.
func (c CapacityResult) at() *CapacityProbe {
	for i := range c.Probes {
		if c.Probes[i].Rate == c.Capacity && c.Probes[i].Passed {
			return &c.Probes[i]
		}
	}
	return nil
}

// searchPlan is the search's rule, apart from the runs.
type searchPlan struct {
	Start, Max, Min   int
	Growth, Precision float64
	Probes            int
}

func (c capacityOptions) plan() searchPlan {
	return searchPlan{Start: c.Start, Max: c.Max, Min: 50, Growth: c.Growth, Precision: c.Precision, Probes: c.Probes}
}

// bracket is the highest passing rate below the lowest failing one (lo) and
// that failing rate (hi); 0 for none. A pass above a failure is noise and
// does not move lo past it.
func bracket(probes []CapacityProbe) (lo, hi int) {
	for _, p := range probes {
		if !p.Passed && (hi == 0 || p.Rate < hi) {
			hi = p.Rate
		}
	}
	for _, p := range probes {
		if p.Passed && p.Rate > lo && (hi == 0 || p.Rate < hi) {
			lo = p.Rate
		}
	}
	return lo, hi
}

// next is the rate to probe after probes, or 0 and why the search is over:
// grow from Start by Growth until a probe fails (or shrink until one
// passes), then bisect geometrically until the failure is within
// Precision of the pass.
func (p searchPlan) next(probes []CapacityProbe) (int, string) {
	if len(probes) == 0 {
		return p.Start, ""
	}
	if len(probes) >= p.Probes {
		return 0, fmt.Sprintf("probe limit (%d)", p.Probes)
	}
	lo, hi := bracket(probes)
	switch {
	case hi == 0 && lo >= p.Max:
		return 0, fmt.Sprintf("passed at the highest rate probed (%s/s)", thousands(p.Max))
	case hi == 0:
		return min(p.Max, int(math.Ceil(float64(lo)*p.Growth))), ""
	case lo == 0:
		if r := int(float64(hi) / p.Growth); r >= p.Min {
			return r, ""
		}
		return 0, fmt.Sprintf("failed at the lowest rate probed (%s/s)", thousands(hi))
	case float64(hi) <= float64(lo)*(1+p.Precision):
		return 0, "converged"
	}
	r := int(math.Round(math.Sqrt(float64(lo) * float64(hi))))
	if r <= lo || r >= hi {
		return 0, "converged"
	}
	return r, ""
}

// achievedShare is the part of the offered rate the writers must achieve:
// below it the load generator, not the system, set the rate.
const achievedShare = 0.95

// judge decides one probe: it passes when every event arrived within the
// settle wait, the writers achieved the rate and p99 is within boundMs.
// fatal is an error that is no verdict (a process failed): it ends the
// system's search.
func judge(res *SteadyResult, err error, rate int, boundMs float64) (passed bool, reason string, fatal error) {
	switch {
	case err != nil && errors.Is(err, errLost) && res != nil:
		return false, fmt.Sprintf("behind: %s of %s events within the settle wait", thousands(int(res.Received)), thousands(res.Committed)), nil
	case err != nil:
		return false, "", err
	case res == nil || res.CommitToConsume.N == 0:
		return false, "", errors.New("no latency measured")
	case res.AchievedRate < achievedShare*float64(rate):
		return false, fmt.Sprintf("writers achieved %s/s", thousands(int(res.AchievedRate))), nil
	case res.CommitToConsume.P99Ms > boundMs:
		return false, fmt.Sprintf("p99 %s ms", ms(res.CommitToConsume.P99Ms)), nil
	}
	return true, "", nil
}

// capacitySystems are the searched systems: the default, the minimal
// connector and each fixed linger.
func capacitySystems(opts options) []system {
	out := []system{{Name: defaultSystem, Probe: true}, {Name: minimalSystem, Minimal: true, Probe: true}}
	for _, l := range opts.Capacity.Lingers {
		out = append(out, system{Name: lingerPrefix + l.String(), Fixed: true, Linger: l, Probe: true})
	}
	return out
}

// runCapacity searches every system, one probe of each in turn, so that
// other load on the machine falls on every system alike; a failed search is
// recorded as a failed scenario and the others go on.
func runCapacity(ctx context.Context, e *env, opts options, res *Results, log *slog.Logger) []CapacityResult {
	var searches []*search
	for _, sys := range capacitySystems(opts) {
		searches = append(searches, newSearch(opts, sys))
	}
	deadline := time.Now().Add(opts.Capacity.Budget)
	for active := len(searches); active > 0 && ctx.Err() == nil; {
		active = 0
		for _, s := range searches {
			if s.done {
				continue
			}
			if err := s.step(ctx, e, deadline, log); err != nil {
				res.fail("capacity, "+s.sys.Name, err, log)
			}
			if !s.done {
				active++
			}
		}
	}
	out := make([]CapacityResult, 0, len(searches))
	for _, s := range searches {
		if !s.done {
			s.stop("stopped: " + context.Cause(ctx).Error())
		}
		log.Info("capacity", "system", s.sys.Name, "events_per_sec", s.res.Capacity, "stopped", s.res.Stopped)
		out = append(out, s.res)
	}
	return out
}

// search is one system's capacity search.
type search struct {
	sys  system
	opts options // the probes': the scenario's duration and settle wait
	res  CapacityResult
	last time.Duration // the previous probe's time: the next is about as long
	done bool
}

func newSearch(opts options, sys system) *search {
	s := &search{sys: sys, opts: opts, res: CapacityResult{System: sys.Name}}
	s.opts.Duration, s.opts.SettleWait = opts.Capacity.Duration, opts.Capacity.Settle
	if sys.Fixed {
		s.res.Linger = sys.Linger.String()
	}
	return s
}

func (s *search) stop(why string) {
	s.res.Stopped, s.done = why, true
	s.res.Capacity, _ = bracket(s.res.Probes)
}

// step runs the next probe, or ends the search when the plan or the time
// budget says so; an error (a process that failed) ends it too.
func (s *search) step(ctx context.Context, e *env, deadline time.Time, log *slog.Logger) error {
	c := s.opts.Capacity
	rate, why := c.plan().next(s.res.Probes)
	switch {
	case rate == 0:
		s.stop(why)
		return nil
	case time.Now().Add(s.last).After(deadline):
		s.stop(fmt.Sprintf("time budget (-capacity-budget %v)", c.Budget))
		return nil
	}
	began := time.Now()
	r, err := runSteady(ctx, e, s.opts, s.sys, rate, log.With("capacity_probe", true))
	s.last = time.Since(began)
	passed, reason, fatal := judge(r, err, rate, float64(c.P99)/float64(time.Millisecond))
	if fatal != nil {
		s.stop("failed at " + thousands(rate) + "/s")
		return fmt.Errorf("probe at %d events/s: %w", rate, fatal)
	}
	p := probeOf(r, rate, passed, reason)
	s.res.Probes = append(s.res.Probes, p)
	log.Info("capacity probe", "system", s.sys.Name, "rate", rate, "passed", passed, "reason", reason,
		"p99_ms", round(p.P99Ms, 2), "achieved", int(p.Achieved), "seconds", round(s.last.Seconds(), 1))
	return nil
}

func probeOf(s *SteadyResult, rate int, passed bool, reason string) CapacityProbe {
	pe := perEventOf(s)
	return CapacityProbe{Rate: rate, Achieved: s.AchievedRate, Received: s.Received, Committed: s.Committed,
		P50Ms: s.CommitToConsume.P50Ms, P99Ms: s.CommitToConsume.P99Ms, ConnectorUs: pe.client, BrokerUs: pe.broker,
		WALSenderUs: pe.walsender, BusyCores: s.CPU.MachineBusyCores, Passed: passed, Reason: reason}
}
