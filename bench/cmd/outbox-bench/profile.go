package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// ProfileResult is an in-process drain under runtime/pprof.
type ProfileResult struct {
	File         string   `json:"file"`
	Seconds      float64  `json:"seconds"`
	EventsPerSec float64  `json:"events_per_sec"`
	TopFlat      []string `json:"top_flat"`
	TopCum       []string `json:"top_cum"`
}

// profileDrain drains slot with the connector's pipeline in this process (the
// binary has no pprof endpoint) under the CPU profiler, publishing to
// prof.<aggregate_type> topics, and summarises the profile with go tool pprof.
func (e *env) profileDrain(ctx context.Context, opts options, slot, aggType string, n int, log *slog.Logger) (*ProfileResult, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.DrainTimeout)
	defer cancel()
	cfg := config.Default()
	cfg.Postgres.DSN = config.DSN(e.dsn)
	cfg.Postgres.Slot = slot
	cfg.Postgres.Publication = publication
	cfg.Outbox.Table = outboxTable
	cfg.Kafka.Brokers = e.brokers
	cfg.Kafka.Topic = "prof." + router.Placeholder
	cfg.Kafka.DLQTopic = dlqTopic
	cfg.HTTP.Listen = ""
	pc, err := cli.PipelineConfig(&cfg)
	if err != nil {
		return nil, err
	}
	m := metrics.New()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := pipeline.New(pc, m, quiet.With("component", "profiled-connector"))
	if err != nil {
		return nil, err
	}

	path, err := filepath.Abs(filepath.Join(opts.Out, "cpu-"+aggType+".pprof"))
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	elapsed, werr := waitCounter(ctx, m, int64(n), done)
	pprof.StopCPUProfile()
	stop()
	var runErr error
	if werr == nil || !errors.Is(werr, errPipelineEnded) {
		runErr = <-done
	}
	if err := errors.Join(werr, runErr); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	res := &ProfileResult{File: filepath.Base(path), Seconds: elapsed.Seconds(), EventsPerSec: float64(n) / elapsed.Seconds()}
	if res.TopFlat, err = pprofTop(ctx, opts.Go, path, false); err != nil {
		return nil, err
	}
	if res.TopCum, err = pprofTop(ctx, opts.Go, path, true); err != nil {
		return nil, err
	}
	return res, nil
}

var errPipelineEnded = errors.New("pipeline ended before the drain finished")

// waitCounter waits until the pipeline has published or dead-lettered n
// events and returns the time since it was called.
func waitCounter(ctx context.Context, m *metrics.Metrics, n int64, done <-chan error) (time.Duration, error) {
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if counterValue(m) >= n {
			return time.Since(start), nil
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("%w: %v", errPipelineEnded, err)
		case <-ctx.Done():
			return 0, fmt.Errorf("in-process drain: %d of %d events: %w", counterValue(m), n, ctx.Err())
		case <-tick.C:
		}
	}
}

func counterValue(m *metrics.Metrics) int64 {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return 0
	}
	var total float64
	for _, mf := range mfs {
		// Both counters are labelled by outbox table: every series counts.
		if n := mf.GetName(); n == metricPublished || n == metricDeadLettered {
			for _, c := range mf.GetMetric() {
				total += c.GetCounter().GetValue()
			}
		}
	}
	return int64(total)
}

// pprofTop runs go tool pprof -top on a profile and returns its lines.
func pprofTop(ctx context.Context, goCmd, path string, cum bool) ([]string, error) {
	args := []string{"tool", "pprof", "-top", "-nodecount=25"}
	if cum {
		args = append(args, "-cum")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goCmd, append(args, path)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof %s: %w", path, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if !strings.HasPrefix(l, "Build ID:") && !strings.HasPrefix(l, "File:") {
			lines = append(lines, l)
		}
	}
	return lines, nil
}
