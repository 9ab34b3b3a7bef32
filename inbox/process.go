package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrHandlerPanic wraps the value of a handler's panic: the attempt failed
// like one that returned an error (rolled back, counted, retried).
var ErrHandlerPanic = errors.New("inbox: handler panicked")

// partition identifies a topic partition.
type partition struct {
	topic string
	p     int32
}

func partitionOf(r *kgo.Record) partition { return partition{r.Topic, r.Partition} }

// retry is a partition whose record at offset failed attempts times in a
// row; the partition is paused until its next attempt is due.
type retry struct {
	offset   int64
	attempts int
	backoff  time.Duration
	due      time.Time
	paused   bool
}

// outcome of one record in a batch.
type outcome int

const (
	handled outcome = iota // done: processed, a duplicate, or parked
	later                  // failed; its partition is paused until the retry is due
	stopped                // ctx ended
)

// processBatch handles recs in order and returns the ones that are done. A
// failed record pauses its partition: the partition's later records in the
// batch are left, the other partitions go on. It stops early when ctx ends
// or a rebalance is waiting. However it returns, even by a panic, every
// record not done is rewound (SetOffsets, while rebalancing is blocked), so
// the client fetches it again and nothing is skipped.
func (c *Consumer) processBatch(ctx context.Context, recs []*kgo.Record) (done []*kgo.Record) {
	done = make([]*kgo.Record, 0, len(recs))
	var left []*kgo.Record // records of failed partitions, in batch order
	blocked := map[partition]bool{}
	i := 0
	defer func() { c.rewind(append(left, recs[i:]...)) }()
	for ; i < len(recs); i++ {
		r := recs[i]
		if i > 0 && c.rebalanceWaiting() {
			return done
		}
		k := partitionOf(r)
		if blocked[k] {
			left = append(left, r)
			continue
		}
		switch c.process(ctx, r) {
		case handled:
			done = append(done, r)
		case later:
			blocked[k] = true
			left = append(left, r)
		case stopped:
			return done
		}
	}
	return done
}

func (c *Consumer) rebalanceWaiting() bool {
	select {
	case <-c.rebalance:
		return true
	default:
		return false
	}
}

// rewind makes the client fetch recs again: each partition restarts at its
// first record in recs.
func (c *Consumer) rewind(recs []*kgo.Record) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for _, r := range recs {
		ps := offsets[r.Topic]
		if ps == nil {
			ps = map[int32]kgo.EpochOffset{}
			offsets[r.Topic] = ps
		}
		if _, ok := ps[r.Partition]; !ok {
			ps[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	if len(offsets) > 0 {
		c.cl.SetOffsets(offsets)
	}
}

// process makes one attempt at rec. On a failure it pauses rec's partition
// until the next attempt is due, or parks rec once it has used up
// MaxAttempts (or the handler said it can never succeed).
func (c *Consumer) process(ctx context.Context, rec *kgo.Record) outcome {
	k := partitionOf(rec)
	st := c.retries[k]
	if st != nil && st.offset != rec.Offset { // another record: a rebalance or a rewind moved on
		st = nil
	}
	ev, id, dup, err := c.attempt(ctx, rec)
	if err == nil {
		delete(c.retries, k)
		if dup {
			c.m.duplicates.Inc()
			c.log.Debug("inbox: duplicate skipped", "event_id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
		} else {
			c.m.processed.Inc()
		}
		return handled
	}
	if ctx.Err() != nil {
		return stopped
	}
	c.m.failed.Inc()
	if st == nil {
		st = &retry{offset: rec.Offset, backoff: c.cfg.RetryBackoff}
		c.retries[k] = st
	} else {
		st.backoff = min(2*st.backoff, c.cfg.MaxRetryBackoff)
	}
	st.attempts++
	log := c.log.With("event_id", id, "aggregate_id", ev.AggregateID, "trace_id", c.trace.traceID(rec),
		"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", st.attempts)
	if errors.Is(err, ErrHandlerPanic) {
		log.Error("inbox: handler panicked; the attempt is rolled back", "err", err)
	}
	if errors.Is(err, errPoison) || (c.cfg.MaxAttempts > 0 && st.attempts >= c.cfg.MaxAttempts) {
		perr := c.park(ctx, rec, ev, id, st.attempts, err)
		if perr == nil {
			delete(c.retries, k)
			c.m.dead.Inc()
			log.Error("inbox: event parked in the dead-letter table", "table", DeadLetterTable(c.cfg.Table), "err", err)
			return handled
		}
		if ctx.Err() != nil {
			return stopped
		}
		err = fmt.Errorf("%w; parking it failed: %w", err, perr)
	}
	st.due, st.paused = time.Now().Add(st.backoff), true
	c.cl.PauseFetchPartitions(map[string][]int32{rec.Topic: {rec.Partition}})
	log.Warn("inbox: event failed, will retry", "retry_in", st.backoff, "err", err)
	return later
}

// resumeDue resumes the partitions whose retry is due at now.
func (c *Consumer) resumeDue(now time.Time) {
	resume := map[string][]int32{}
	for k, st := range c.retries {
		if st.paused && !now.Before(st.due) {
			st.paused = false
			resume[k.topic] = append(resume[k.topic], k.p)
		}
	}
	if len(resume) > 0 {
		c.cl.ResumeFetchPartitions(resume)
	}
}

// pollContext ends the next poll when the first paused partition is due,
// so its retry does not wait for records of other partitions.
func (c *Consumer) pollContext(ctx context.Context) (context.Context, context.CancelFunc) {
	var first time.Time
	for _, st := range c.retries {
		if st.paused && (first.IsZero() || st.due.Before(first)) {
			first = st.due
		}
	}
	if first.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, first)
}

// sleep waits d; false if ctx ended or wake fired first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-wake:
		return false
	}
}

// attempt runs one delivery attempt of rec in its own transaction, within
// HandlerTimeout.
func (c *Consumer) attempt(ctx context.Context, rec *kgo.Record) (ev Event, id string, dup bool, err error) {
	ev, _ = EventOf(rec) // unreadable: the handler's EventOf says so
	id = dedupeKey(rec, ev, c.cfg.IDHeader)
	ctx, span := c.trace.start(ctx, rec, id)
	begun := time.Now()
	defer func() {
		c.m.processing.Observe(time.Since(begun).Seconds())
		end(span, dup, err)
	}()
	actx := ctx
	if c.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, c.cfg.HandlerTimeout)
		defer cancel()
	}
	var eventType any
	if ev.Type != "" {
		eventType = ev.Type
	}
	tx, err := c.cfg.DB.Begin(actx)
	if err != nil {
		return ev, id, false, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after Commit
	}()
	tag, err := tx.Exec(actx, c.insert, id, c.cfg.Consumer, eventType, rec.Topic, rec.Partition, rec.Offset, legacyKey(rec, ev))
	if err != nil {
		return ev, id, false, fmt.Errorf("insert into inbox: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ev, id, true, nil
	}
	start := time.Now()
	err = c.handle(actx, tx, rec)
	c.m.handler.Observe(time.Since(start).Seconds())
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("handler timeout %v: %w", c.cfg.HandlerTimeout, err)
		}
		return ev, id, false, fmt.Errorf("handler: %w", err)
	}
	// The handler succeeded: its transaction is committed even when a stop
	// began meanwhile, so the work is kept and its offset committed instead
	// of being redelivered after the rebalance. If Commit fails after the
	// server committed, the retry finds the inbox row and counts a
	// duplicate: nothing runs twice.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			// The handler returned nil after a statement of tx failed (it
			// "recorded and skipped" a poison record): no retry can commit
			// tx, so the record is parked with this error instead.
			return ev, id, false, Poison(errors.New("the handler returned nil, but a statement in its transaction had failed, so it rolled back"))
		}
		return ev, id, false, fmt.Errorf("commit: %w", err)
	}
	return ev, id, false, nil
}

// handle runs the handler, turning a panic into an error (ErrHandlerPanic,
// with the stack) so the attempt is rolled back and retried like any failed
// one, and the member goes on serving its other partitions and the group.
func (c *Consumer) handle(ctx context.Context, tx pgx.Tx, rec *kgo.Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrHandlerPanic, p, debug.Stack())
		}
	}()
	return c.cfg.Handler(ctx, tx, rec)
}
