package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/outbox-cdc/outbox-cdc/bench/relay"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// carrier is what moves a steady run's events from PostgreSQL to Kafka: the
// connector process, Debezium or the polling relay.
type carrier interface {
	// account names the carrier's processes for CPU accounting.
	account(p *cpuProbe)
	// mark is called after the warm-up, just before the measured run.
	mark(ctx context.Context) error
	// failed reports a carrier that stopped by itself.
	failed() error
	// finish stops the carrier cleanly and records what it measured.
	finish(ctx context.Context, res *SteadyResult) error
	// close releases whatever finish did not (after a failure); idempotent.
	close()
}

func (e *env) startCarrier(ctx context.Context, sys system, aggType, topic string, opts options, log *slog.Logger) (carrier, error) {
	if sys.isRelay() {
		return startRelay(ctx, e, relay.Config{DSN: e.dsn, Table: pollTable, Brokers: e.brokers, Topic: topic,
			PollInterval: sys.Interval, BatchSize: opts.RelayBatch, MaxBufferedRecords: defaults.Kafka.MaxBufferedRecords}, log)
	}
	if sys.Debezium {
		return e.startDebeziumCarrier(ctx, aggType)
	}
	if sys.Minimal {
		return e.startMinimalCarrier(ctx, aggType)
	}
	slot := "cdc_" + aggType
	cfg := connectorConfig{DSN: e.dsn, Slot: slot, Brokers: e.brokers, Fixed: sys.Fixed, Linger: sys.Linger, Budget: sys.Budget, Retention: sys.Retention, Delivery: sys.Delivery}
	if sys.Delivery == exactlyOnce {
		cfg.Positions = "bench-positions." + aggType
	}
	k, err := e.startConnector(ctx, slot, cfg)
	if err != nil {
		e.dropSlots(ctx, slot)
		e.deletePositions(ctx, cfg.Positions)
		return nil, err
	}
	return &cdcCarrier{e: e, k: k, slot: slot, positions: cfg.Positions, walsender: e.slotPID(ctx, slot)}, nil
}

// cdcCarrier is the connector process on its own slot.
type cdcCarrier struct {
	e         *env
	k         *connector
	slot      string
	positions string // kafka.positions_topic with exactly_once, else ""
	walsender int
	before    cdctest.Metrics
	sampler   *walSampler // the walsender's lag and waits over the measured run
	closed    bool
}

func (c *cdcCarrier) account(p *cpuProbe) { p.clientPID, p.pathPID = c.k.Pid(), c.walsender }

func (c *cdcCarrier) mark(ctx context.Context) (err error) {
	if c.before, err = c.k.scrape(ctx); err != nil {
		return err
	}
	c.sampler, err = startWALSampler(ctx, c.e.dsn, c.slot)
	return err
}

func (c *cdcCarrier) failed() error {
	if c.k.Exited() {
		return fmt.Errorf("connector exited (%v):\n%s", c.k.Err(), c.k.LogTail(tailLines))
	}
	return nil
}

func (c *cdcCarrier) finish(ctx context.Context, res *SteadyResult) error {
	after, err := c.k.scrape(ctx)
	if err != nil {
		return err
	}
	res.CommitToAck = quantiles(commitToAck(after).Minus(commitToAck(c.before)))
	res.RowsDeleted = int64(after.Sum(rowsDeletedMetric) - c.before.Sum(rowsDeletedMetric))
	if c.sampler != nil {
		s := c.sampler
		c.sampler = nil
		if res.WALSender, err = s.stop(); err != nil {
			return err
		}
	}
	if res.PeakRSSBytes, _, err = c.k.Memory(); err != nil {
		return err
	}
	err = c.k.stop(ctx)
	c.close()
	return err
}

func (c *cdcCarrier) close() {
	if c.closed {
		return
	}
	c.closed = true
	if c.sampler != nil {
		_, _ = c.sampler.stop()
	}
	c.k.Kill()
	c.e.dropSlots(context.Background(), c.slot)
	c.e.deletePositions(context.Background(), c.positions)
}

// deletePositions deletes an exactly_once run's positions topic (the
// connector created it); "" is none.
func (e *env) deletePositions(ctx context.Context, topic string) {
	if topic != "" {
		e.deleteTopics(ctx, topic)
	}
}

// relayCarrier is the polling relay running in this process.
type relayCarrier struct {
	r      *relay.Relay
	stop   context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
	closed sync.Once
}

func startRelay(ctx context.Context, e *env, cfg relay.Config, log *slog.Logger) (*relayCarrier, error) {
	r, err := relay.New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	c := &relayCarrier{r: r, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := r.Run(rctx); err != nil {
			c.err = fmt.Errorf("relay: %w", err)
		} else if rctx.Err() == nil {
			c.err = errors.New("relay: stopped by itself")
		}
	}()
	return c, nil
}

func (c *relayCarrier) account(p *cpuProbe) { p.pathPID = c.r.BackendPID() }

func (c *relayCarrier) mark(context.Context) error { return nil }

func (c *relayCarrier) failed() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

func (c *relayCarrier) finish(_ context.Context, res *SteadyResult) error {
	if err := c.failed(); err != nil {
		return err
	}
	st := c.r.Stats()
	res.RelayStats = &st
	c.close()
	return nil
}

func (c *relayCarrier) close() {
	c.closed.Do(func() {
		c.stop()
		<-c.done
		c.r.Close()
	})
}
