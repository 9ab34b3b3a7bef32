// Command outbox-bench measures outbox-cdc against the physical limit
// (pg_recvlogical draining the same WAL), against the minimal connector
// (bench/minimal: the floor issue 39's targets are ratios to) and against a
// polling relay (bench/relay), on servers it starts itself
// (internal/testenv). It writes report.md, results.json, latency.png and CPU
// profiles into -out (bench/results). Run it with `make bench`; flags
// override the defaults (outbox-bench -h). docs/performance.md describes the
// method. It builds the minimal connector itself (-minimal-bin to skip).
//
// Scenarios, in order:
//   - drain: N events preloaded, as one-row and as 1,000-row transactions,
//     behind slots created before the preload; pg_recvlogical, the
//     connector process (in each -delivery mode) and the minimal connector
//     drain their own slots in turn, twice each, and an in-process
//     connector drains one more under the CPU profiler.
//   - steady: paced writers (one-row transactions, or -steady-tx-rows) at
//     each offered rate, carried by the minimal connector, the connector
//     (default and with a linger) and by the polling relay (each poll
//     interval) in turn, and by the connector in exactly_once mode
//     (-delivery): commit-to-consume per event, commit-to-ack from the
//     connector's histogram, PostgreSQL CPU, connector memory.
//   - capacity: for the default, the minimal connector and fixed lingers,
//     the highest rate whose short probe keeps p99 within -capacity-p99
//     (growth, then bisection), with the CPU per event there.
//
// The program exits 1 if any scenario failed (an event lost, a process that
// did not stop cleanly, a deadline), after writing what it measured.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// envEvents overrides the default event count of the drain scenario.
const envEvents = "OUTBOX_BENCH_EVENTS"

// options are the command-line flags.
type options struct {
	Events         int
	TxSizes        []int
	Rates          []int
	Duration       time.Duration
	Writers        int
	Partitions     int
	RelayIntervals []time.Duration
	Lingers        []time.Duration
	Budgets        []time.Duration // kafka.latency_budget values (steady)
	Retentions     []time.Duration // outbox.retention values (steady)
	RelayBatch     int
	Scenarios      []string
	Profile        bool
	DrainRepeats   int
	Debezium       bool
	DebeziumRates  []int
	Floors         bool
	Deliveries     []string
	// Minimal runs the minimal connector (bench/minimal) in the steady runs
	// and the drain; MinimalBin is its binary ("": built into the work dir).
	Minimal    bool
	MinimalBin string
	// TxRows are the steady runs' transaction shapes: rows per transaction.
	TxRows   []int
	Capacity capacityOptions

	Connector    string
	Micro        string
	Out          string
	Go           string
	Timeout      time.Duration
	DrainTimeout time.Duration
	SettleWait   time.Duration
	QuietBudget  time.Duration
	LatencyCSV   string
	LogLevel     string
	Replot       string // a results.json to render again, no servers
}

func parseFlags(args []string) (options, error) {
	o := options{Events: 1_000_000}
	if v := os.Getenv(envEvents); v != "" {
		n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
		if err != nil || n <= 0 {
			return o, fmt.Errorf("%s=%q: want a positive integer", envEvents, v)
		}
		o.Events = n
	}
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.IntVar(&o.Events, "events", o.Events, "drain: events to preload per transaction size (env "+envEvents+")")
	txSizes := fs.String("tx-sizes", "1,1000", "drain: events per preloaded transaction, comma list")
	rates := fs.String("rates", "500,2000", "steady: offered loads in events/s, comma list (the capacity scenario finds the highest)")
	fs.DurationVar(&o.Duration, "duration", 20*time.Second, "steady: writing time per offered load and system")
	fs.IntVar(&o.Writers, "writers", 16, "steady: concurrent writer connections")
	fs.IntVar(&o.Partitions, "partitions", 3, "partitions of every benchmark topic")
	intervals := fs.String("relay-intervals", "1s,100ms", "steady: polling relay poll intervals, comma list")
	lingers := fs.String("cdc-lingers", "0s,1ms,2ms,5ms,10ms",
		"steady: also run outbox-cdc with these fixed kafka.linger values and the budget off, comma list (\"\": none)")
	budgets := fs.String("cdc-budgets", "2ms,10ms", "steady: also run outbox-cdc with these kafka.latency_budget values, comma list (\"\": none)")
	retentions := fs.String("cdc-retention", "2s", "steady: also run outbox-cdc with these outbox.retention values, deleting delivered rows during the run, comma list (\"\": none)")
	fs.IntVar(&o.RelayBatch, "relay-batch", 100, "steady: polling relay claim batch (LIMIT)")
	scenarios := fs.String("scenarios", "drain,steady,capacity", "scenarios to run, comma list of drain, steady, capacity")
	fs.IntVar(&o.DrainRepeats, "drain-repeats", 2, "drain: runs of each reader per transaction size (the fastest counts)")
	fs.BoolVar(&o.Debezium, "debezium", true, "also run Debezium (Kafka Connect standalone, scripts/fetch-debezium.sh) in the drain and steady runs")
	dbzRates := fs.String("debezium-rates", "500,2000", "steady: offered loads at which Debezium runs, comma list")
	fs.BoolVar(&o.Floors, "floors", true, "steady: also measure the floors at each rate (pg_recvlogical, a bare franz-go producer)")
	deliveries := fs.String("delivery", atLeastOnce+","+exactlyOnce,
		"connector delivery modes, comma list: at_least_once always runs; exactly_once adds its own drain and steady rows")
	fs.BoolVar(&o.Minimal, "minimal", true, "also run the minimal connector (bench/cmd/minimal-connector) in the drain and the steady runs")
	fs.StringVar(&o.MinimalBin, "minimal-bin", "", "minimal-connector binary (default: go build ./cmd/minimal-connector of the bench module into the work dir)")
	txRows := fs.String("steady-tx-rows", "1", "steady: rows per writer transaction, comma list; each shape runs every system (e.g. 1,10)")
	capLingers := o.Capacity.flags(fs)
	fs.BoolVar(&o.Profile, "profile", true, "drain: also drain in process under the CPU profiler")
	fs.StringVar(&o.Connector, "connector", "", "outbox-cdc binary (default: go build ./cmd/outbox-cdc into the work dir)")
	fs.StringVar(&o.Micro, "micro", "", "output of go test -bench to include in the report")
	fs.StringVar(&o.Out, "out", "bench/results", "directory for report.md, results.json, latency.png and profiles")
	fs.StringVar(&o.Go, "go", "go", "go command (for building the connector and go tool pprof)")
	fs.DurationVar(&o.Timeout, "timeout", 75*time.Minute, "deadline for the whole run")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", 10*time.Minute, "deadline for one drain")
	fs.DurationVar(&o.SettleWait, "settle", time.Minute, "steady: how long to wait for the last events after writing stops")
	fs.DurationVar(&o.QuietBudget, "quiet-budget", 4*time.Minute,
		"total time to spend, before scenarios, waiting for other load on the machine to stop (0: never wait)")
	fs.StringVar(&o.LatencyCSV, "latency-csv", "", "steady: also write each run's per-event commit and receive times as CSV into this directory")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.Replot, "replot", "", "render report.md and the charts into -out again from this results.json, running nothing")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	l := listFlags{txSizes: *txSizes, rates: *rates, dbzRates: *dbzRates, deliveries: *deliveries, txRows: *txRows, capLingers: *capLingers,
		intervals: *intervals, lingers: *lingers, budgets: *budgets, retentions: *retentions, scenarios: *scenarios}
	if err := o.setLists(l); err != nil {
		return o, err
	}
	return o, o.validate()
}

// listFlags are the comma-list flags as given.
type listFlags struct {
	txSizes, rates, dbzRates, deliveries, txRows, capLingers, intervals, lingers, budgets, retentions, scenarios string
}

// setLists parses the comma-list flags into o.
func (o *options) setLists(l listFlags) error {
	var err error
	if o.TxSizes, err = parseInts("tx-sizes", l.txSizes); err != nil {
		return err
	}
	if o.Rates, err = parseInts("rates", l.rates); err != nil {
		return err
	}
	if o.DebeziumRates, err = parseInts("debezium-rates", l.dbzRates); err != nil {
		return err
	}
	if o.Deliveries, err = parseDeliveries(l.deliveries); err != nil {
		return err
	}
	if o.TxRows, err = parseInts("steady-tx-rows", l.txRows); err != nil {
		return err
	}
	if o.Capacity.Lingers, err = parseDurations("capacity-lingers", l.capLingers, 0); err != nil {
		return err
	}
	for _, s := range splitList(l.intervals) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fmt.Errorf("-relay-intervals: %q is not a positive duration", s)
		}
		o.RelayIntervals = append(o.RelayIntervals, d)
	}
	if o.Lingers, err = parseDurations("cdc-lingers", l.lingers, 0); err != nil {
		return err
	}
	if o.Budgets, err = parseDurations("cdc-budgets", l.budgets, time.Nanosecond); err != nil {
		return err
	}
	if o.Retentions, err = parseDurations("cdc-retention", l.retentions, time.Second); err != nil {
		return err
	}
	for _, s := range splitList(l.scenarios) {
		if s != "drain" && s != "steady" && s != "capacity" {
			return fmt.Errorf("-scenarios: unknown scenario %q (want drain, steady, capacity)", s)
		}
		o.Scenarios = append(o.Scenarios, s)
	}
	return nil
}

// validate checks the values that must be positive or consistent.
func (o *options) validate() error {
	switch {
	case o.Events <= 0:
		return fmt.Errorf("-events %d: must be positive", o.Events)
	case o.Duration < time.Second:
		return fmt.Errorf("-duration %v: must be at least 1s", o.Duration)
	case o.Writers <= 0:
		return fmt.Errorf("-writers %d: must be positive", o.Writers)
	case o.Partitions <= 0:
		return fmt.Errorf("-partitions %d: must be positive", o.Partitions)
	case o.DrainRepeats <= 0:
		return fmt.Errorf("-drain-repeats %d: must be positive", o.DrainRepeats)
	case o.RelayBatch <= 0:
		return fmt.Errorf("-relay-batch %d: must be positive", o.RelayBatch)
	}
	for _, n := range o.TxSizes {
		if o.Events%n != 0 {
			return fmt.Errorf("-events %d is not a multiple of transaction size %d", o.Events, n)
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	return o.Capacity.validate()
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseInts(name, s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(strings.ReplaceAll(p, "_", ""))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive integer", name, p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-%s: empty list", name)
	}
	return out, nil
}

func (o options) has(scenario string) bool { return slices.Contains(o.Scenarios, scenario) }

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "outbox-bench:", err)
		os.Exit(2)
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(opts.LogLevel)) // validated by parseFlags
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	run := run
	if opts.Replot != "" {
		run = func(context.Context, options, *slog.Logger) error { return replot(opts, log) }
	}
	if err := run(ctx, opts, log); err != nil {
		log.Error("benchmark failed", "err", err)
		cancel()
		stop()
		os.Exit(1)
	}
}

// run sets up the servers, runs the scenarios and writes the results. A
// failed scenario does not stop the others; it makes run return an error
// after the results are written.
func run(ctx context.Context, opts options, log *slog.Logger) error {
	started := time.Now()
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return err
	}
	res := &Results{StartedAt: started.UTC(), Params: paramsOf(opts)}
	if opts.Micro != "" {
		micro, err := parseMicroFile(opts.Micro)
		if err != nil {
			return fmt.Errorf("micro-benchmarks: %w", err)
		}
		res.Micro = micro
	}

	e, err := startEnv(ctx, opts, log)
	if err != nil {
		return err
	}
	defer e.close()
	res.Env = e.info(ctx)
	res.DebeziumSkipped = e.debeziumSkipped

	if opts.has("drain") {
		for _, size := range opts.TxSizes {
			d, err := runDrain(ctx, e, opts, size, log)
			if err != nil {
				res.fail(fmt.Sprintf("drain, %d-event transactions", size), err, log)
			}
			if d != nil {
				res.Drains = append(res.Drains, *d)
			}
		}
	}
	if opts.has("steady") {
		runSteadyScenario(ctx, e, opts, res, log)
	}
	if opts.has("capacity") {
		res.Capacity = runCapacity(ctx, e, opts, res, log)
	}

	res.Targets = evaluateTargets(res)
	res.WallSeconds = time.Since(started).Seconds()
	if err := writeResults(opts, res, log); err != nil {
		return err
	}
	if len(res.Failures) > 0 {
		return fmt.Errorf("%d scenario(s) failed: %s", len(res.Failures), strings.Join(res.Failures, "; "))
	}
	return nil
}

// runSteadyScenario runs every system at every rate, in each transaction
// shape.
func runSteadyScenario(ctx context.Context, e *env, opts options, res *Results, log *slog.Logger) {
	for _, rows := range opts.TxRows {
		for _, rate := range opts.Rates {
			for _, sys := range steadySystems(opts, rate, e.debeziumLibs != "", rows) {
				s, err := runSystem(ctx, e, opts, sys, rate, log)
				if err != nil {
					res.fail(fmt.Sprintf("steady, %s at %d events/s", sys.label(), rate), err, log)
				}
				if s != nil {
					res.Steady = append(res.Steady, *s)
				}
			}
		}
	}
}

// parseDurations parses a comma list of durations of at least least.
func parseDurations(flag, list string, least time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	for _, s := range splitList(list) {
		d, err := time.ParseDuration(s)
		if err != nil || d < least {
			return nil, fmt.Errorf("-%s: %q is not a duration of at least %v", flag, s, least)
		}
		out = append(out, d)
	}
	return out, nil
}
