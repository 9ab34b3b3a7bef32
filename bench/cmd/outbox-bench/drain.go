package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// DrainResult is the backlog drain for one transaction size.
type DrainResult struct {
	TxSize         int     `json:"tx_size"`
	Events         int     `json:"events"`
	Transactions   int     `json:"transactions"`
	PreloadSeconds float64 `json:"preload_seconds"`
	WALBytes       int64   `json:"wal_bytes"`

	// Each reader drains its own slot Repeats times, alternating; the
	// headline numbers are each reader's fastest run (interference from
	// other processes only ever slows a run down).
	RecvLogicalRuns []ReaderRun    `json:"pg_recvlogical_runs"`
	ConnectorRuns   []ConnectorRun `json:"connector_runs"`
	RecvLogical     ReaderRun      `json:"pg_recvlogical"`
	Connector       ConnectorRun   `json:"connector"`
	// Ratio is the connector's best rate over pg_recvlogical's best.
	Ratio float64 `json:"ratio"`
	// PeakRSSBytes is the highest VmHWM of the connector runs.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`

	// Debezium drains one more slot, once, timed from process start until
	// the benchmark's consumer has every event; DebeziumRatio is the
	// connector's best rate over Debezium's.
	Debezium      *ConnectorRun `json:"debezium,omitempty"`
	DebeziumRatio float64       `json:"debezium_ratio,omitempty"`

	// ExactlyOnceRuns are the connector with kafka.delivery: exactly_once
	// on slots of its own, one right after each at_least_once run;
	// ExactlyOnce is the fastest (nil when -delivery leaves it out).
	ExactlyOnceRuns []ConnectorRun `json:"exactly_once_runs,omitempty"`
	ExactlyOnce     *ConnectorRun  `json:"exactly_once,omitempty"`

	// MinimalRuns are the minimal connector (bench/minimal) on slots of its
	// own, one right after each connector run, timed from process start to
	// its exit once it confirmed every event; Minimal is the fastest and
	// MinimalRatio the connector's best rate over it (issue 39).
	MinimalRuns  []ConnectorRun `json:"minimal_runs,omitempty"`
	Minimal      *ConnectorRun  `json:"minimal,omitempty"`
	MinimalRatio float64        `json:"minimal_ratio,omitempty"`

	// Profiled is the in-process drain of one more identical slot under the
	// CPU profiler (its rate is a cross-check, not the headline).
	Profiled *ProfileResult `json:"profiled,omitempty"`
}

// ConnectorRun is one drain by the connector process.
type ConnectorRun struct {
	ReaderRun
	// ReadySeconds is start-up (process start to /readyz), included in
	// Seconds.
	ReadySeconds float64  `json:"ready_seconds"`
	PeakRSSBytes int64    `json:"peak_rss_bytes"`
	Verified     Verified `json:"verified"`
}

// Verified is what a consumer found on the drain's topic afterwards.
type Verified struct {
	Distinct     int64 `json:"distinct"`
	Records      int64 `json:"records"`
	Duplicates   int64 `json:"duplicates"`
	DeadLettered int64 `json:"dead_lettered"`
}

// drainSlots names the slots of one drain: all are created before the
// preload, so each holds the same WAL.
type drainSlots struct {
	recv, cdc []string
	eos       []string // exactly_once connector runs; nil without them
	min       []string // minimal connector runs; nil without them
	prof      string
	dbz       string // "" without Debezium
}

func (d drainSlots) all() []string {
	out := append(append(append(append(append([]string(nil), d.recv...), d.cdc...), d.eos...), d.min...), d.prof)
	if d.dbz != "" {
		out = append(out, d.dbz)
	}
	return out
}

// runDrain preloads events behind the slots, then drains them with
// pg_recvlogical and the connector process in turn (opts.DrainRepeats each)
// and, if asked, with the in-process connector under the profiler.
func runDrain(ctx context.Context, e *env, opts options, txSize int, log *slog.Logger) (*DrainResult, error) {
	n := opts.Events
	d := newDrainNames(opts, txSize, e.debeziumLibs != "")
	log = log.With("scenario", "drain", "tx_size", txSize)
	res := &DrainResult{TxSize: txSize, Events: n, Transactions: n / txSize}

	defer func() {
		e.dropSlots(ctx, d.slots.all()...)
		e.deleteTopics(ctx, append(d.topics, d.positions...)...)
		if err := e.exec(context.WithoutCancel(ctx), "TRUNCATE "+outboxTable); err != nil {
			log.Warn("truncate", "err", err)
		}
	}()
	if err := e.exec(ctx, "TRUNCATE "+outboxTable); err != nil {
		return nil, err
	}
	if err := e.createTopics(ctx, d.topics...); err != nil {
		return nil, err
	}
	for _, s := range d.slots.all() {
		if _, err := e.createSlot(ctx, s); err != nil {
			return nil, err
		}
	}
	endpos, err := e.preloadDrain(ctx, opts, d.aggType, res, log)
	if err != nil {
		return nil, err
	}
	for i := range opts.DrainRepeats {
		if err := drainRound(ctx, e, opts, d, i, endpos, res, log); err != nil {
			return res, err
		}
	}
	log.Info("drain rates", "pg_recvlogical", int(res.RecvLogical.EventsPerSec), "connector", int(res.Connector.EventsPerSec),
		"ratio", round(res.Ratio, 3))

	if d.slots.dbz != "" {
		e.waitQuiet(ctx, "debezium drain")
		dr, err := drainDebezium(ctx, e, opts, d.slots.dbz, "dbz."+d.aggType, n, log)
		if err != nil {
			return res, fmt.Errorf("debezium: %w", err)
		}
		res.Debezium = &dr
		if dr.EventsPerSec > 0 {
			res.DebeziumRatio = res.Connector.EventsPerSec / dr.EventsPerSec
		}
		log.Info("debezium drained", "seconds", round(dr.Seconds, 2), "events_per_sec", int(dr.EventsPerSec),
			"peak_rss_mb", dr.PeakRSSBytes>>20)
	}

	if opts.Profile {
		p, err := e.profileDrain(ctx, opts, d.slots.prof, d.aggType, n, log)
		if err != nil {
			return res, fmt.Errorf("profiled drain: %w", err)
		}
		res.Profiled = p
		log.Info("profiled in-process drain", "seconds", round(p.Seconds, 2), "events_per_sec", int(p.EventsPerSec))
	}
	return res, nil
}

// drainNames are one transaction size's slots, topics and positions
// topics: topics[i] is run i's connector topic; the exactly_once ones come
// after the others.
type drainNames struct {
	aggType   string
	slots     drainSlots
	topics    []string
	positions []string
}

func newDrainNames(opts options, txSize int, debezium bool) drainNames {
	d := drainNames{aggType: fmt.Sprintf("drain_tx%d", txSize)}
	for i := range opts.DrainRepeats {
		d.slots.recv = append(d.slots.recv, fmt.Sprintf("recv%d_%s", i+1, d.aggType))
		d.slots.cdc = append(d.slots.cdc, fmt.Sprintf("cdc%d_%s", i+1, d.aggType))
		d.topics = append(d.topics, fmt.Sprintf("drain%d.%s", i+1, d.aggType))
	}
	if opts.Minimal {
		for i := range opts.DrainRepeats {
			d.slots.min = append(d.slots.min, fmt.Sprintf("min%d_%s", i+1, d.aggType))
			d.topics = append(d.topics, minimalDrainPrefix(i)+d.aggType)
		}
	}
	if opts.eos() {
		for i := range opts.DrainRepeats {
			d.slots.eos = append(d.slots.eos, fmt.Sprintf("eos%d_%s", i+1, d.aggType))
			d.topics = append(d.topics, fmt.Sprintf("eos%d.%s", i+1, d.aggType))
			d.positions = append(d.positions, fmt.Sprintf("bench-positions.eos%d.%s", i+1, d.aggType))
		}
	}
	d.slots.prof = "prof_" + d.aggType
	d.topics = append(d.topics, "prof."+d.aggType)
	if debezium {
		d.slots.dbz = "dbz_" + d.aggType
		d.topics = append(d.topics, "dbz."+d.aggType)
	}
	return d
}

// minimalDrainPrefix is run i's topic prefix of the minimal connector.
func minimalDrainPrefix(i int) string { return fmt.Sprintf("minimal%d.", i+1) }

// drainRound is run i of each reader: pg_recvlogical, the connector, the
// minimal connector and, with exactly_once, the transactional connector.
func drainRound(ctx context.Context, e *env, opts options, d drainNames, i int, endpos string, res *DrainResult, log *slog.Logger) error {
	n := opts.Events
	e.waitQuiet(ctx, "pg_recvlogical drain")
	rr, err := e.recvLogical(ctx, d.slots.recv[i], endpos, n, opts.DrainTimeout)
	if err != nil {
		return err
	}
	res.RecvLogicalRuns = append(res.RecvLogicalRuns, rr)
	log.Info("pg_recvlogical drained", "run", i+1, "seconds", round(rr.Seconds, 2), "events_per_sec", int(rr.EventsPerSec))

	e.waitQuiet(ctx, "connector drain")
	template := fmt.Sprintf("drain%d.{aggregate_type}", i+1)
	cr, err := drainConnector(ctx, e, opts, connectorConfig{Slot: d.slots.cdc[i], Topic: template}, n, log)
	if err != nil {
		return err
	}
	log.Info("connector drained", "run", i+1, "seconds", round(cr.Seconds, 2), "events_per_sec", int(cr.EventsPerSec),
		"peak_rss_mb", cr.PeakRSSBytes>>20)
	err = verifyTopic(ctx, e, d.topics[i], n, &cr.Verified, false, log)
	res.ConnectorRuns = append(res.ConnectorRuns, cr)
	if err != nil {
		return err
	}
	res.summarize()
	if err := drainMinimalRound(ctx, e, opts, d, i, res, log); err != nil {
		return err
	}
	if !opts.eos() {
		return nil
	}
	e.waitQuiet(ctx, "exactly_once connector drain")
	cfg := connectorConfig{Slot: d.slots.eos[i], Topic: fmt.Sprintf("eos%d.{aggregate_type}", i+1),
		Delivery: exactlyOnce, Positions: d.positions[i]}
	xr, err := drainConnector(ctx, e, opts, cfg, n, log)
	if err != nil {
		return fmt.Errorf("exactly_once: %w", err)
	}
	log.Info("exactly_once connector drained", "run", i+1, "seconds", round(xr.Seconds, 2),
		"events_per_sec", int(xr.EventsPerSec), "peak_rss_mb", xr.PeakRSSBytes>>20)
	err = verifyTopic(ctx, e, fmt.Sprintf("eos%d.%s", i+1, d.aggType), n, &xr.Verified, true, log)
	res.ExactlyOnceRuns = append(res.ExactlyOnceRuns, xr)
	if err != nil {
		return fmt.Errorf("exactly_once: %w", err)
	}
	res.summarize()
	return nil
}

// drainMinimalRound is run i of the minimal connector, when it runs.
func drainMinimalRound(ctx context.Context, e *env, opts options, d drainNames, i int, res *DrainResult, log *slog.Logger) error {
	if i >= len(d.slots.min) {
		return nil
	}
	e.waitQuiet(ctx, "minimal connector drain")
	mr, err := drainMinimal(ctx, e, opts, d.slots.min[i], minimalDrainPrefix(i), opts.Events)
	if err != nil {
		return fmt.Errorf("minimal connector: %w", err)
	}
	log.Info("minimal connector drained", "run", i+1, "seconds", round(mr.Seconds, 2), "events_per_sec", int(mr.EventsPerSec),
		"peak_rss_mb", mr.PeakRSSBytes>>20)
	err = verifyTopic(ctx, e, minimalDrainPrefix(i)+d.aggType, opts.Events, &mr.Verified, false, log)
	res.MinimalRuns = append(res.MinimalRuns, mr)
	res.summarize()
	if err != nil {
		return fmt.Errorf("minimal connector: %w", err)
	}
	return nil
}

// summarize picks each reader's fastest run and the peak RSS.
func (d *DrainResult) summarize() {
	for _, r := range d.RecvLogicalRuns {
		if d.RecvLogical.Seconds == 0 || r.Seconds < d.RecvLogical.Seconds {
			d.RecvLogical = r
		}
	}
	for _, r := range d.ConnectorRuns {
		if d.Connector.Seconds == 0 || r.Seconds < d.Connector.Seconds {
			d.Connector = r
		}
		d.PeakRSSBytes = max(d.PeakRSSBytes, r.PeakRSSBytes)
	}
	if d.RecvLogical.EventsPerSec > 0 {
		d.Ratio = d.Connector.EventsPerSec / d.RecvLogical.EventsPerSec
	}
	d.Minimal, d.MinimalRatio = nil, 0 // the slice may have moved
	for i, r := range d.MinimalRuns {
		if d.Minimal == nil || r.Seconds < d.Minimal.Seconds {
			d.Minimal = &d.MinimalRuns[i]
		}
	}
	if d.Minimal != nil && d.Minimal.EventsPerSec > 0 {
		d.MinimalRatio = d.Connector.EventsPerSec / d.Minimal.EventsPerSec
	}
	d.ExactlyOnce = nil // the slice may have moved
	for i, r := range d.ExactlyOnceRuns {
		if d.ExactlyOnce == nil || r.Seconds < d.ExactlyOnce.Seconds {
			d.ExactlyOnce = &d.ExactlyOnceRuns[i]
		}
	}
}

// preloadDrain commits the drain's events and returns the WAL position after
// them (pg_recvlogical's --endpos).
func (e *env) preloadDrain(ctx context.Context, opts options, aggType string, res *DrainResult, log *slog.Logger) (string, error) {
	from, err := e.currentLSN(ctx)
	if err != nil {
		return "", err
	}
	log.Info("preloading", "events", res.Events)
	pctx, cancel := context.WithTimeout(ctx, opts.DrainTimeout)
	defer cancel()
	d, err := timed(func() error { return e.preload(pctx, aggType, res.Events, res.TxSize) })
	if err != nil {
		return "", err
	}
	res.PreloadSeconds = d.Seconds()
	endpos, err := e.currentLSN(ctx)
	if err != nil {
		return "", err
	}
	if res.WALBytes, err = e.walBytes(ctx, from, endpos); err != nil {
		return "", err
	}
	log.Info("preloaded", "seconds", round(d.Seconds(), 1), "wal_mb", res.WALBytes>>20, "endpos", endpos)
	// Autovacuum would otherwise pick the fresh rows up during the first
	// drain and compete with it; the WAL this writes lies after endpos.
	if err := e.exec(pctx, "VACUUM (ANALYZE) "+outboxTable); err != nil {
		return "", fmt.Errorf("vacuum after preload: %w", err)
	}
	if err := e.exec(pctx, "CHECKPOINT"); err != nil {
		return "", fmt.Errorf("checkpoint after preload: %w", err)
	}
	return endpos, nil
}

// drainConnector runs the connector process on a preloaded slot (c.Slot,
// c.Topic and the delivery; the servers are e's) and times process start to
// the published counter reaching n.
func drainConnector(ctx context.Context, e *env, opts options, c connectorConfig, n int, log *slog.Logger) (ConnectorRun, error) {
	var run ConnectorRun
	ctx, cancel := context.WithTimeout(ctx, opts.DrainTimeout)
	defer cancel()
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	a := probe.snap()
	slot := c.Slot
	c.DSN, c.Brokers = e.dsn, e.brokers
	k, err := e.startConnector(ctx, slot, c)
	if err != nil {
		return run, err
	}
	defer k.Kill()
	run.ReadySeconds = time.Since(k.Started).Seconds()
	probe.clientPID, probe.pathPID = k.Pid(), e.slotPID(ctx, slot)
	doneAt, samples, err := k.waitDelivered(ctx, int64(n), 50*time.Millisecond, log)
	if err != nil {
		return run, err
	}
	b := probe.snap()
	run.ReaderRun = newReaderRun(doneAt.Sub(k.Started), n, usage(a, b))
	run.Verified.DeadLettered = int64(samples.Sum(metricDeadLettered))
	if run.PeakRSSBytes, _, err = k.Memory(); err != nil {
		return run, err
	}
	return run, k.stop(ctx)
}

// verifyTopic reads the drain's topic from the start and requires every one
// of n events, each at least once; duplicates are counted (at-least-once
// allows them, none are expected without failures). An exactly_once topic
// (committed) is read with read_committed and must hold no duplicate; its
// end offsets count transaction markers too, so its records are what the
// consumer received until nothing more came for a second.
func verifyTopic(ctx context.Context, e *env, topic string, n int, v *Verified, committed bool, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	a := newArrivals(n)
	c, err := startConsumer(ctx, e.brokers, topic, a, log, isolation(committed)...)
	if err != nil {
		return err
	}
	werr := a.waitDistinct(ctx, int64(n))
	if committed && werr == nil {
		werr = a.waitNoMore(ctx, time.Second)
	}
	if err := c.stop(); err != nil && werr == nil {
		werr = err
	}
	v.Distinct = a.distinct.Load()
	if committed {
		v.Records = a.records.Load()
	} else if v.Records, err = e.topicRecords(ctx, topic); err != nil {
		return fmt.Errorf("verify %s: %w", topic, err)
	}
	v.Duplicates = v.Records - v.Distinct
	if werr != nil || v.DeadLettered != 0 || a.foreign.Load() != 0 || (committed && v.Duplicates != 0) {
		return fmt.Errorf("%w: %s has %d of %d events (%d records, %d foreign, %d dead-lettered, read_committed %v): %v",
			errLost, topic, v.Distinct, n, v.Records, a.foreign.Load(), v.DeadLettered, committed, werr)
	}
	log.Info("verified", "topic", topic, "read_committed", committed, "distinct", v.Distinct, "duplicates", v.Duplicates)
	return nil
}

// drainDebezium runs Debezium on a preloaded slot and times process start
// until the benchmark's consumer has all n events on topic (Debezium has no
// delivered counter to poll; the consumer's lag after the last produce is
// part of the time, as it is not for the connector, at most a fetch).
func drainDebezium(ctx context.Context, e *env, opts options, slot, topic string, n int, log *slog.Logger) (ConnectorRun, error) {
	var run ConnectorRun
	ctx, cancel := context.WithTimeout(ctx, opts.DrainTimeout)
	defer cancel()
	arr := newArrivals(n)
	cons, err := startConsumer(ctx, e.brokers, topic, arr, log)
	if err != nil {
		return run, err
	}
	defer cons.stop()
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	a := probe.snap()
	d, err := e.startDebezium(ctx, slot, slot, "dbz.{aggregate_type}")
	if err != nil {
		return run, err
	}
	defer d.Kill()
	run.ReadySeconds = time.Since(d.Started).Seconds()
	probe.clientPID, probe.pathPID = d.Pid(), e.slotPID(ctx, slot)
	if err := arr.waitDistinct(ctx, int64(n)); err != nil {
		return run, fmt.Errorf("%w: %v\n%s", errLost, err, d.LogTail(tailLines))
	}
	doneAt := time.Now()
	b := probe.snap()
	run.ReaderRun = newReaderRun(doneAt.Sub(d.Started), n, usage(a, b))
	if run.PeakRSSBytes, _, err = d.Memory(); err != nil {
		return run, err
	}
	d.Kill()
	if err := cons.stop(); err != nil {
		return run, err
	}
	run.Verified.Distinct = arr.distinct.Load()
	if run.Verified.Records, err = e.topicRecords(ctx, topic); err != nil {
		return run, fmt.Errorf("verify %s: %w", topic, err)
	}
	run.Verified.Duplicates = run.Verified.Records - run.Verified.Distinct
	return run, nil
}
