package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// loadSpec is one paced write load: transactions of txRows rows (0: one)
// at rate events/s for duration, from writers connections.
type loadSpec struct {
	dsn, table, aggType string
	rate, writers       int
	duration            time.Duration
	txRows              int
}

// rows is the number of rows per transaction.
func (s loadSpec) rows() int { return max(1, s.txRows) }

// maxEvents is how many events the load can offer (it never runs ahead of
// its schedule).
func (s loadSpec) maxEvents() int { return int(float64(s.rate) * s.duration.Seconds()) }

// writeLatency summarises the write times of the events that committed.
func writeLatency(writeNs []int64) Percentiles {
	var msList []float64
	for _, ns := range writeNs {
		if ns > 0 {
			msList = append(msList, float64(ns)/1e6)
		}
	}
	return percentiles(msList)
}

// connectWriters opens s.writers connections with the insert prepared, so
// the first insert of each writer is not slower; on error, the ones opened.
func connectWriters(ctx context.Context, s loadSpec) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, s.writers)
	for range s.writers {
		c, err := pgx.Connect(ctx, s.dsn)
		if err != nil {
			return conns, fmt.Errorf("writer: %w", err)
		}
		conns = append(conns, c)
		if _, err := c.Prepare(ctx, "insert", insertSQL(s.table)); err != nil {
			return conns, fmt.Errorf("writer: prepare: %w", err)
		}
	}
	return conns, nil
}

// runLoad offers event i at start + i/rate, taking the next transaction
// (s.rows() events, offered at its first event's time) from a shared
// counter, so concurrent writers share one schedule; a writer that falls
// behind inserts at once until it catches up. It stops at start + duration
// whatever was achieved. commitNs[i] is set to the time event i's COMMIT
// returned (0 for events not offered), and writeNs[i], if writeNs is not
// nil, to how long its transaction took. It returns how many committed and
// the measured window.
func runLoad(ctx context.Context, s loadSpec, commitNs, writeNs []int64) (int, time.Duration, error) {
	conns, err := connectWriters(ctx, s)
	defer func() {
		for _, c := range conns {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	maxN := min(s.maxEvents(), len(commitNs))
	nsPerEvent := 1e9 / float64(s.rate)
	start := time.Now().Add(20 * time.Millisecond)
	end := start.Add(s.duration)
	var (
		next      atomic.Int64
		committed atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		errs      []error
	)
	for _, c := range conns {
		wg.Go(func() {
			timer := time.NewTimer(0)
			defer timer.Stop()
			<-timer.C
			for {
				i := int(next.Add(1)-1) * s.rows()
				if i >= maxN {
					return
				}
				j := min(i+s.rows(), maxN) // events [i, j)
				at := start.Add(time.Duration(float64(i) * nsPerEvent))
				if d := time.Until(at); d > 0 {
					timer.Reset(d)
					select {
					case <-ctx.Done():
						return
					case <-timer.C:
					}
				}
				if !time.Now().Before(end) {
					return
				}
				began := time.Now()
				if err := insertTx(ctx, c, s.aggType, i, j); err != nil {
					if ctx.Err() == nil {
						cancel()
						mu.Lock()
						errs = append(errs, fmt.Errorf("writer: insert events %d..%d: %w", i, j-1, err))
						mu.Unlock()
					}
					return
				}
				done := time.Now()
				for k := i; k < j; k++ {
					commitNs[k] = done.UnixNano()
					if writeNs != nil {
						writeNs[k] = int64(done.Sub(began))
					}
				}
				committed.Add(int64(j - i))
			}
		})
	}
	wg.Wait()
	window := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return int(committed.Load()), window, err
	}
	if err := ctx.Err(); err != nil {
		return int(committed.Load()), window, err
	}
	return int(committed.Load()), min(window, s.duration), nil
}

// insertTx commits events [i, j) in one transaction: one autocommit insert
// for a single event, else a pipelined batch, which PostgreSQL runs as one
// implicit transaction (one Sync), in one round trip as an application
// would with pgx.
func insertTx(ctx context.Context, c *pgx.Conn, aggType string, i, j int) error {
	if j-i == 1 {
		_, err := c.Exec(ctx, "insert", insertArgs(aggType, i)...)
		return err
	}
	var b pgx.Batch
	for k := i; k < j; k++ {
		b.Queue("insert", insertArgs(aggType, k)...)
	}
	return c.SendBatch(ctx, &b).Close()
}
