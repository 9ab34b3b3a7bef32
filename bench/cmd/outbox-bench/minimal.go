package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// The minimal connector (bench/minimal, issue 39) is the reference every
// issue-39 target is a ratio to: a pglogrepl stream into franz-go at its
// defaults with a 10 ms linger, measured in the same run as the connector,
// in the steady runs at every rate and in the drain.

// minimalSystem is its steady-run name (not prefixed outbox-cdc, so none
// of the connector's own targets picks it up).
const minimalSystem = "minimal"

// minimalBinary returns opts.MinimalBin or builds bench/cmd/minimal-connector
// into workDir (the Makefile builds only the connector and the benchmark).
func minimalBinary(ctx context.Context, opts options, workDir string, log *slog.Logger) (string, error) {
	if opts.MinimalBin != "" {
		return prebuilt("minimal-bin", opts.MinimalBin)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(workDir, "minimal-connector")
	log.Info("building the minimal connector", "out", out)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, opts.Go, "build", "-trimpath", "-o", out, "./cmd/minimal-connector")
	cmd.Dir = filepath.Join(root, "bench")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/minimal-connector: %w\n%s", err, b)
	}
	return out, nil
}

// startMinimal runs the minimal connector on an existing slot, records to
// prefix + aggregate_type; stopAfter > 0 makes it exit once that many events
// are confirmed. It returns once a walsender serves the slot.
func (e *env) startMinimal(ctx context.Context, name, slot, prefix string, stopAfter int) (*child, error) {
	cmd := cdctest.Command(e.minimalBin, nil, "-dsn", e.dsn, "-slot", slot, "-publication", publication,
		"-brokers", strings.Join(e.brokers, ","), "-topic-prefix", prefix, "-stop-after", strconv.Itoa(stopAfter),
		"-log-level", "warn")
	p, err := startChild(name, cmd, filepath.Join(e.workDir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("start minimal connector: %w", err)
	}
	if _, err := e.waitSlotActive(ctx, slot); err != nil {
		_ = p.Kill()
		return nil, fmt.Errorf("minimal connector %s: %w\n%s", name, err, p.LogTail(tailLines))
	}
	return p, nil
}

// drainMinimal runs the minimal connector on a preloaded slot until it has
// confirmed n events and exited by itself, timed from process start to its
// exit (like pg_recvlogical's --endpos); CPU and peak RSS come from its
// rusage, as it is gone before they could be read from /proc.
func drainMinimal(ctx context.Context, e *env, opts options, slot, prefix string, n int) (ConnectorRun, error) {
	var run ConnectorRun
	ctx, cancel := context.WithTimeout(ctx, opts.DrainTimeout)
	defer cancel()
	probe := cpuProbe{pgPID: e.pgPID, kafkaPID: e.kafkaPID}
	a := probe.snap()
	p, err := e.startMinimal(ctx, slot, slot, prefix, n)
	if err != nil {
		return run, err
	}
	defer p.Kill()
	run.ReadySeconds = time.Since(p.Started).Seconds()
	select {
	case <-p.Done():
	case <-ctx.Done():
		return run, fmt.Errorf("minimal connector: %w\n%s", ctx.Err(), p.LogTail(tailLines))
	}
	if err := p.Err(); err != nil {
		return run, fmt.Errorf("minimal connector exited: %w\n%s", err, p.LogTail(tailLines))
	}
	elapsed := p.ExitedAt().Sub(p.Started)
	if err := e.waitSlotInactive(ctx, slot); err != nil {
		return run, err
	}
	waitReaped(e.pgPID, 5*time.Second)
	cpu := usage(a, probe.snap())
	if ps := p.Cmd.ProcessState; ps != nil {
		cpu.Client = (ps.UserTime() + ps.SystemTime()).Seconds()
		cpu.Other = max(0, cpu.Other-cpu.Client)
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			run.PeakRSSBytes = ru.Maxrss << 10 // kB on Linux
		}
	}
	run.ReaderRun = newReaderRun(elapsed, n, cpu)
	return run, nil
}

// minimalCarrier is the minimal connector on its own slot in a steady run.
type minimalCarrier struct {
	e         *env
	p         *child
	slot      string
	walsender int
	sampler   *walSampler
	closed    bool
}

func (e *env) startMinimalCarrier(ctx context.Context, aggType string) (carrier, error) {
	slot := "min_" + aggType
	if _, err := e.createSlot(ctx, slot); err != nil {
		return nil, err
	}
	p, err := e.startMinimal(ctx, slot, slot, "outbox.event.", 0)
	if err != nil {
		e.dropSlots(ctx, slot)
		return nil, err
	}
	return &minimalCarrier{e: e, p: p, slot: slot, walsender: e.slotPID(ctx, slot)}, nil
}

func (c *minimalCarrier) account(p *cpuProbe) { p.clientPID, p.pathPID = c.p.Pid(), c.walsender }

func (c *minimalCarrier) mark(ctx context.Context) (err error) {
	c.sampler, err = startWALSampler(ctx, c.e.dsn, c.slot)
	return err
}

func (c *minimalCarrier) failed() error {
	if c.p.Exited() {
		return fmt.Errorf("minimal connector exited (%v):\n%s", c.p.Err(), c.p.LogTail(tailLines))
	}
	return nil
}

// finish reads the walsender summary and the peak RSS, then stops the
// process with SIGTERM and requires exit 0.
func (c *minimalCarrier) finish(_ context.Context, res *SteadyResult) error {
	var errs []error
	if s := c.sampler; s != nil {
		c.sampler = nil
		var err error
		res.WALSender, err = s.stop()
		errs = append(errs, err)
	}
	var err error
	res.PeakRSSBytes, _, err = c.p.Memory()
	errs = append(errs, err)
	if err := c.p.Stop(45 * time.Second); err != nil {
		errs = append(errs, fmt.Errorf("minimal connector %w:\n%s", err, c.p.LogTail(tailLines)))
	}
	c.close()
	return errors.Join(errs...)
}

func (c *minimalCarrier) close() {
	if c.closed {
		return
	}
	c.closed = true
	if c.sampler != nil {
		_, _ = c.sampler.stop()
	}
	_ = c.p.Kill()
	c.e.dropSlots(context.Background(), c.slot)
}
