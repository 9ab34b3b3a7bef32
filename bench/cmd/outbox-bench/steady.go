package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/bench/relay"
)

// system is what carries events to Kafka in a steady run.
type system struct {
	Name     string        // "outbox-cdc", "outbox-cdc-linger2ms", "relay-1s", ...
	Interval time.Duration // poll interval; 0 for outbox-cdc
	Fixed    bool          // a fixed kafka.linger (Linger, possibly 0) with the budget off
	Linger   time.Duration // outbox-cdc's kafka.linger
	Budget   time.Duration // outbox-cdc's kafka.latency_budget (0 with Fixed false: the default)
	// Retention is outbox-cdc's outbox.retention (0: off), deleting the
	// run's delivered rows while the writers write.
	Retention time.Duration
	Debezium  bool   // Debezium on Kafka Connect
	Floor     bool   // a floor: pg_recvlogical or the bare producer
	Minimal   bool   // the minimal connector (bench/minimal)
	Delivery  string // outbox-cdc's kafka.delivery; "" is at_least_once
	// TxRows is rows per writer transaction (0 or 1: one-row transactions).
	TxRows int
	// Probe marks a capacity probe: its names differ from the steady runs'.
	Probe bool
}

func (s system) isRelay() bool { return s.Interval > 0 }

// label is the name with the transaction shape, for logs and failures.
func (s system) label() string { return shapeLabel(s.Name, s.TxRows) }

func shapeLabel(name string, rows int) string {
	if rows > 1 {
		return fmt.Sprintf("%s (%d-row txns)", name, rows)
	}
	return name
}

// aggType names a run's events, and through them its topic and slot: one
// per system, rate, shape and scenario, so no run meets another's leftovers.
func (s system) aggType(rate int) string {
	scenario := "steady"
	if s.Probe {
		scenario = "cap"
	}
	a := fmt.Sprintf("%s_%s_%d", scenario, strings.NewReplacer("-", "", ".", "").Replace(s.Name), rate)
	if s.TxRows > 1 {
		a += fmt.Sprintf("_tx%d", s.TxRows)
	}
	return a
}

// steadySystems are the systems run at rate in transactions of rows: the
// floors and the minimal connector first, so that each rate's rows compare
// with references measured just before. The bare producer has no
// transactions: it runs in the one-row shape only.
func steadySystems(opts options, rate int, debezium bool, rows int) []system {
	var out []system
	if opts.Floors {
		out = append(out, system{Name: floorRecv, Floor: true})
		if rows <= 1 {
			out = append(out, system{Name: floorProducer, Floor: true})
		}
	}
	if opts.Minimal {
		out = append(out, system{Name: minimalSystem, Minimal: true})
	}
	out = append(out, system{Name: "outbox-cdc"})
	for _, l := range opts.Lingers {
		out = append(out, system{Name: "outbox-cdc-linger" + l.String(), Fixed: true, Linger: l})
	}
	for _, b := range opts.Budgets {
		out = append(out, system{Name: "outbox-cdc-budget" + b.String(), Budget: b})
	}
	for _, r := range opts.Retentions {
		out = append(out, system{Name: retentionPrefix + r.String(), Retention: r})
	}
	if opts.eos() {
		out = append(out, system{Name: eosSystem, Delivery: exactlyOnce})
	}
	if debezium && slices.Contains(opts.DebeziumRates, rate) {
		out = append(out, system{Name: "debezium", Debezium: true})
	}
	for _, d := range opts.RelayIntervals {
		out = append(out, system{Name: "relay-" + d.String(), Interval: d})
	}
	for i := range out {
		out[i].TxRows = rows
	}
	return out
}

// runSystem runs one system at one offered load.
func runSystem(ctx context.Context, e *env, opts options, sys system, rate int, log *slog.Logger) (*SteadyResult, error) {
	switch sys.Name {
	case floorRecv:
		return runRecvFloor(ctx, e, opts, rate, sys.TxRows, log)
	case floorProducer:
		return runProducerFloor(ctx, e, opts, rate, log)
	}
	return runSteady(ctx, e, opts, sys, rate, log)
}

// SteadyResult is one system at one offered load.
type SteadyResult struct {
	System string `json:"system"`
	// TxRows is rows per writer transaction; omitted for one-row ones.
	TxRows          int     `json:"tx_rows,omitempty"`
	PollInterval    string  `json:"poll_interval,omitempty"`
	Linger          string  `json:"linger,omitempty"`
	Budget          string  `json:"latency_budget,omitempty"`
	Retention       string  `json:"retention,omitempty"`
	OfferedRate     int     `json:"offered_rate"`
	DurationSeconds float64 `json:"duration_seconds"`
	Committed       int     `json:"committed"`
	AchievedRate    float64 `json:"achieved_rate"`
	Received        int64   `json:"received"`
	Duplicates      int64   `json:"duplicates"`
	// CommitToConsume is per event: the consumer's receive time minus the
	// moment the writer's COMMIT returned (same clock, µs precision).
	CommitToConsume Percentiles `json:"commit_to_consume"`
	// CommitToConsumeTS is per event: receive time minus the record's
	// timestamp (ms precision): the commit time for outbox-cdc, created_at
	// (transaction start) for the relay.
	CommitToConsumeTS Percentiles `json:"commit_to_consume_record_ts"`
	// Write is per event: the writer's INSERT and COMMIT (one round trip,
	// autocommit) as the application sees it.
	Write Percentiles `json:"write"`
	// RowsDeleted is what outbox.retention deleted during the run.
	RowsDeleted int64 `json:"rows_deleted,omitempty"`
	// CommitToAck is the connector's histogram over the run (warm-up excluded).
	CommitToAck *HistQuantiles `json:"commit_to_ack,omitempty"`
	// PeakRSSBytes is the connector process's VmHWM (its whole life: start,
	// warm-up and this run).
	PeakRSSBytes int64    `json:"peak_rss_bytes,omitempty"`
	CPU          CPUUsage `json:"cpu"`
	// WALSender is the connector's walsender over the run (outbox-cdc only).
	WALSender *WALSenderStats `json:"walsender,omitempty"`
	// RelayStats are the relay's counters.
	RelayStats *relay.Stats `json:"relay_stats,omitempty"`
}

// label is the system with the transaction shape.
func (s SteadyResult) label() string { return shapeLabel(s.System, s.TxRows) }

// oneRow reports a run in the one-row shape, the one targets are set for.
func (s SteadyResult) oneRow() bool { return s.TxRows <= 1 }

// wrote records what the measured load achieved.
func (s *SteadyResult) wrote(events int, window time.Duration) {
	s.Committed, s.DurationSeconds = events, window.Seconds()
	s.AchievedRate = float64(events) / window.Seconds()
}

// warmup events go through the whole path (connections, metadata, the
// topic's partitions) before the measured run; they use sequence numbers
// after the run's and are excluded from every statistic.
const warmup = 12

func runSteady(ctx context.Context, e *env, opts options, sys system, rate int, log *slog.Logger) (*SteadyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.Duration+opts.SettleWait+3*time.Minute)
	defer cancel()
	aggType := sys.aggType(rate)
	table, topic := outboxTable, "outbox.event."+aggType
	if sys.isRelay() {
		table, topic = pollTable, "relay."+aggType
	}
	log = log.With("scenario", "steady", "system", sys.label(), "rate", rate)
	spec := loadSpec{dsn: e.dsn, table: table, aggType: aggType, rate: rate, writers: opts.Writers, duration: opts.Duration, txRows: sys.TxRows}
	n := spec.maxEvents()
	res := &SteadyResult{System: sys.Name, OfferedRate: rate}
	if sys.TxRows > 1 {
		res.TxRows = sys.TxRows
	}
	if sys.Fixed {
		res.Linger = sys.Linger.String()
	}
	if sys.Budget > 0 {
		res.Budget = sys.Budget.String()
	}
	if sys.Retention > 0 {
		res.Retention = sys.Retention.String()
	}
	if sys.isRelay() {
		res.PollInterval = sys.Interval.String()
	}

	defer func() {
		e.deleteTopics(ctx, topic)
		if err := e.exec(context.WithoutCancel(ctx), "TRUNCATE "+table); err != nil {
			log.Warn("truncate", "err", err)
		}
	}()
	if err := e.createTopics(ctx, topic); err != nil {
		return nil, err
	}
	arr := newArrivals(n + warmup)
	cons, err := startConsumer(ctx, e.brokers, topic, arr, log, isolation(sys.Delivery == exactlyOnce)...)
	if err != nil {
		return nil, err
	}
	defer cons.stop()

	car, err := e.startCarrier(ctx, sys, aggType, topic, opts, log)
	if err != nil {
		return nil, err
	}
	defer car.close()
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	car.account(&probe)

	// Warm-up, then the measured run.
	if err := warmUp(ctx, e, table, aggType, n, arr, car); err != nil {
		return nil, err
	}
	commitNs, writeNs := make([]int64, n), make([]int64, n)
	e.waitQuiet(ctx, sys.label()+" at "+thousands(rate)+"/s")
	a := probe.snap()
	committed, window, err := runLoad(ctx, spec, commitNs, writeNs)
	res.wrote(committed, window)
	res.Write = writeLatency(writeNs)
	if err != nil {
		return res, err
	}
	log.Info("written", "committed", committed, "achieved_rate", int(res.AchievedRate))

	return res, settle(ctx, e, opts, aggType, topic, committed, commitNs, arr, car, cons, probe, a, res, log)
}

// warmUp inserts the warm-up events and waits for them, then marks the
// carrier's counters: the measured run starts from there.
func warmUp(ctx context.Context, e *env, table, aggType string, n int, arr *arrivals, car carrier) error {
	for i := range warmup {
		if err := e.exec(ctx, insertSQL(table), insertArgs(aggType, n+i)...); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err := arr.waitDistinct(wctx, warmup)
	wcancel()
	if err != nil {
		return fmt.Errorf("warm-up: %w", errors.Join(err, car.failed()))
	}
	if err := car.mark(ctx); err != nil {
		return err
	}
	return nil
}

// settle waits for every committed event, then takes the CPU, the
// duplicates and the latencies into res.
func settle(ctx context.Context, e *env, opts options, aggType, topic string, committed int, commitNs []int64,
	arr *arrivals, car carrier, cons *consumer, probe cpuProbe, a cpuSnap, res *SteadyResult, log *slog.Logger) error {
	// Every committed event must arrive.
	sctx, scancel := context.WithTimeout(ctx, opts.SettleWait)
	err := arr.waitDistinct(sctx, int64(committed+warmup))
	scancel()
	waitReaped(e.pgPID, 2*time.Second) // the writers' backends, so their time is counted
	res.CPU = usage(a, probe.snap())
	res.Received = arr.distinct.Load() - warmup
	if ferr := car.failed(); ferr != nil {
		return ferr
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errLost, err)
	}
	if err := car.finish(ctx, res); err != nil {
		return err
	}
	if err := cons.stop(); err != nil {
		return err
	}
	res.Duplicates = arr.records.Load() - arr.distinct.Load()
	if f := arr.foreign.Load(); f != 0 {
		return fmt.Errorf("%d records on %s that are not benchmark events", f, topic)
	}
	if opts.LatencyCSV != "" {
		if err := writeLatencyCSV(filepath.Join(opts.LatencyCSV, aggType+".csv"), commitNs, arr); err != nil {
			return err
		}
	}
	exact, ts := latencies(commitNs, arr)
	res.CommitToConsume, res.CommitToConsumeTS = percentiles(exact), percentiles(ts)
	log.Info("steady run", "p50_ms", round(res.CommitToConsume.P50Ms, 2), "p99_ms", round(res.CommitToConsume.P99Ms, 2),
		"max_ms", round(res.CommitToConsume.MaxMs, 1), "pg_cpu_s", round(res.CPU.Postgres, 2))
	return nil
}

// latencies pairs each committed event with its arrival, in ms.
func latencies(commitNs []int64, arr *arrivals) (exact, ts []float64) {
	for i, c := range commitNs {
		if c == 0 || arr.at[i] == 0 {
			continue
		}
		exact = append(exact, float64(arr.at[i]-c)/1e6)
		ts = append(ts, float64(arr.at[i]-arr.ts[i]*1e6)/1e6)
	}
	return exact, ts
}

// writeLatencyCSV writes one line per committed event: its sequence number,
// commit time and receive time (unix ns), for looking at latency over time.
func writeLatencyCSV(path string, commitNs []int64, arr *arrivals) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("seq,commit_ns,receive_ns\n")
	for i, c := range commitNs {
		if c != 0 {
			fmt.Fprintf(&b, "%d,%d,%d\n", i, c, arr.at[i])
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
