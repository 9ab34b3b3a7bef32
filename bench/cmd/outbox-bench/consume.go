package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// arrivals records, per event sequence number, when the benchmark's consumer
// received the event and the record's timestamp. Only the consumer goroutine
// writes the slices; read them after it has returned.
type arrivals struct {
	at []int64 // receive time, unix ns; 0 = not received
	ts []int64 // record timestamp, unix ms

	distinct atomic.Int64 // events received at least once
	records  atomic.Int64 // records received, duplicates included
	foreign  atomic.Int64 // records without a benchmark id in range
}

func newArrivals(n int) *arrivals {
	return &arrivals{at: make([]int64, n), ts: make([]int64, n)}
}

func (a *arrivals) add(r *kgo.Record, now int64) {
	a.records.Add(1)
	for _, h := range r.Headers {
		if h.Key != wire.HeaderID {
			continue
		}
		seq, ok := seqOf(h.Value)
		if !ok || seq >= len(a.at) {
			break
		}
		if a.at[seq] == 0 {
			a.at[seq] = now
			a.ts[seq] = r.Timestamp.UnixMilli()
			a.distinct.Add(1)
		}
		return
	}
	a.foreign.Add(1)
}

// waitDistinct waits until n distinct events have arrived.
func (a *arrivals) waitDistinct(ctx context.Context, n int64) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for a.distinct.Load() < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d events: %w", a.distinct.Load(), n, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// consumer reads one topic from its start into arrivals until stopped.
type consumer struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// extra options follow the defaults (isolation for an exactly_once topic).
func startConsumer(ctx context.Context, brokers []string, topic string, a *arrivals, log *slog.Logger, extra ...kgo.Opt) (*consumer, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("outbox-bench-consumer"),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A fetch returns as soon as one byte is there (fetch.min.bytes=1);
		// the wait only bounds an empty fetch.
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.FetchMaxBytes(64 << 20),
		kgo.FetchMaxPartitionBytes(16 << 20),
	}, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &consumer{cancel: cancel, done: make(chan error, 1)}
	go func() {
		defer cl.Close()
		c.done <- poll(ctx, cl, a, log.With("topic", topic))
	}()
	return c, nil
}

func poll(ctx context.Context, cl *kgo.Client, a *arrivals, log *slog.Logger) error {
	warned := 0
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return nil
		}
		now := time.Now().UnixNano()
		fs.EachError(func(topic string, p int32, err error) {
			// Retriable fetch errors (a leader moving, the topic's metadata
			// not there yet) are retried by the client; log the first few.
			if warned < 5 {
				warned++
				log.Warn("fetch error", "partition", p, "err", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) { a.add(r, now) })
	}
}

// stop ends the consumer and waits for it; it may be called again.
func (c *consumer) stop() error {
	c.once.Do(func() {
		c.cancel()
		c.err = <-c.done
	})
	return c.err
}
