package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Results is everything one run measured; results.json is this struct.
type Results struct {
	StartedAt   time.Time      `json:"started_at"`
	WallSeconds float64        `json:"wall_seconds"`
	Env         EnvInfo        `json:"env"`
	Params      Params         `json:"params"`
	Drains      []DrainResult  `json:"drains"`
	Steady      []SteadyResult `json:"steady"`
	// Capacity is the capacity scenario: one search per system.
	Capacity []CapacityResult `json:"capacity,omitempty"`
	Micro    []MicroResult    `json:"micro"`
	Targets  []Target         `json:"targets"`
	Failures []string         `json:"failures"`
	// DebeziumSkipped says why Debezium did not run ("" when it did, or
	// when -debezium=false).
	DebeziumSkipped string `json:"debezium_skipped,omitempty"`
}

// EnvInfo describes the machine and the servers.
type EnvInfo struct {
	Commit     string            `json:"commit"`
	GoVersion  string            `json:"go_version"`
	OS         string            `json:"os"`
	CPU        string            `json:"cpu"`
	Cores      int               `json:"cores"`
	MemGiB     float64           `json:"mem_gib"`
	Postgres   string            `json:"postgres"`
	Kafka      string            `json:"kafka"`
	PGSettings map[string]string `json:"pg_settings"`
	Partitions int               `json:"partitions"`
	// BackgroundBusyCores is the machine's load during 3 s before the
	// servers started: other users of the machine.
	BackgroundBusyCores float64 `json:"background_busy_cores"`
}

// Params are the run's settings.
type Params struct {
	Events         int      `json:"events"`
	TxSizes        []int    `json:"tx_sizes"`
	Rates          []int    `json:"rates"`
	Duration       string   `json:"duration"`
	Writers        int      `json:"writers"`
	Partitions     int      `json:"partitions"`
	RelayIntervals []string `json:"relay_intervals"`
	RelayBatch     int      `json:"relay_batch"`
	Scenarios      []string `json:"scenarios"`
	Profile        bool     `json:"profile"`
	DrainRepeats   int      `json:"drain_repeats"`
	Floors         bool     `json:"floors"`
	Debezium       bool     `json:"debezium"`
	DebeziumRates  []int    `json:"debezium_rates,omitempty"`
	Deliveries     []string `json:"deliveries,omitempty"`
	Minimal        bool     `json:"minimal"`
	TxRows         []int    `json:"steady_tx_rows,omitempty"`
	// The capacity scenario's bound and probe length.
	CapacityP99Ms    float64 `json:"capacity_p99_ms,omitempty"`
	CapacityDuration string  `json:"capacity_duration,omitempty"`
}

func paramsOf(o options) Params {
	p := Params{Events: o.Events, TxSizes: o.TxSizes, Rates: o.Rates, Duration: o.Duration.String(),
		Writers: o.Writers, Partitions: o.Partitions, RelayBatch: o.RelayBatch, Scenarios: o.Scenarios, Profile: o.Profile, DrainRepeats: o.DrainRepeats,
		Floors: o.Floors, Debezium: o.Debezium, DebeziumRates: o.DebeziumRates, Deliveries: o.Deliveries,
		Minimal: o.Minimal, TxRows: o.TxRows}
	if o.has("capacity") {
		p.CapacityP99Ms, p.CapacityDuration = float64(o.Capacity.P99)/float64(time.Millisecond), o.Capacity.Duration.String()
	}
	for _, d := range o.RelayIntervals {
		p.RelayIntervals = append(p.RelayIntervals, d.String())
	}
	return p
}

// fail records a failed scenario.
func (r *Results) fail(scenario string, err error, log *slog.Logger) {
	log.Error("scenario failed", "scenario", scenario, "err", err)
	r.Failures = append(r.Failures, scenario+": "+err.Error())
}

// writeResults writes results.json, report.md, latency.png and the
// frontier charts (frontier-<rate>.png) into opts.Out.
func writeResults(opts options, res *Results, log *slog.Logger) error {
	var errs []error
	b, err := json.MarshalIndent(res, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(opts.Out, "results.json"), append(b, '\n'), 0o644)
	}
	errs = append(errs, err)
	chart := ""
	if slices.ContainsFunc(res.Steady, func(s SteadyResult) bool { return s.CommitToConsume.N > 0 }) {
		chart = "latency.png"
		if err := writeChart(filepath.Join(opts.Out, chart), res); err != nil {
			errs = append(errs, fmt.Errorf("chart: %w", err))
			chart = ""
		}
	}
	frontier := map[int]string{}
	for _, rate := range res.Params.Rates {
		if len(frontierPoints(res, rate)) < 2 {
			continue
		}
		name := fmt.Sprintf("frontier-%d.png", rate)
		if err := writeFrontierChart(filepath.Join(opts.Out, name), res, rate); err != nil {
			errs = append(errs, fmt.Errorf("frontier chart: %w", err))
			continue
		}
		frontier[rate] = name
	}
	errs = append(errs, os.WriteFile(filepath.Join(opts.Out, "report.md"), []byte(renderReport(res, chart, frontier)), 0o644))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	log.Info("results written", "dir", opts.Out, "wall_seconds", round(res.WallSeconds, 0))
	return nil
}

// replot renders report.md and the charts again from a results.json (the
// report's code may be newer than the run): -replot.
func replot(opts options, log *slog.Logger) error {
	b, err := os.ReadFile(opts.Replot)
	if err != nil {
		return fmt.Errorf("replot: %w", err)
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("replot %s: %w", opts.Replot, err)
	}
	res.Targets = evaluateTargets(&res)
	return writeResults(opts, &res, log)
}
