package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// The commit loop and one Kafka transaction: what waits is committed in
// one, retried until it commits, a fatal error, or the context ends.

// errBegin: the client cannot begin a transaction (its producer id failed
// for good); only a new client, after a restart, can.
var errBegin = errors.New("begin transaction")

// errRefused: the broker refused a record; the transaction is aborted and
// done again with it sent alone or dead-lettered.
var errRefused = errors.New("kafka refused a record of the transaction")

// loop commits what waits once it has waited Interval, and checks for
// fencing when idle.
func (t *Txn) loop() {
	defer t.wg.Done()
	check := time.NewTicker(t.cfg.FenceCheck)
	defer check.Stop()
	// The interval's wait is a timer of the same select, so the idle
	// probe also runs while a batch waits (an unconfirmed commit a Flush
	// gave up on is settled by it).
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-check.C:
			t.probe()
			continue
		case <-t.kick:
		case <-due.C:
		}
		t.mu.Lock()
		pending, at := len(t.batch) > 0 && t.hold == 0, t.since.Add(t.cfg.Interval)
		t.mu.Unlock()
		if !pending {
			continue
		}
		if wait := time.Until(at); wait > 0 {
			due.Reset(wait)
			continue
		}
		_ = t.commit(t.ctx) // outcomes went to the events' Done
	}
}

// probe commits the last position again, alone, when nothing was tried for
// FenceCheck: a fenced instance finds out and stops without waiting for an
// event. The position cannot go back: only the owner of the id commits.
func (t *Txn) probe() {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	pos := lsn.LSN(t.committed.Load())
	if t.fatal != nil || pos == 0 || time.Since(t.lastTry) < t.cfg.FenceCheck {
		return
	}
	if u := t.unsure; u != nil {
		// A commit left unconfirmed by a Flush that gave up: its events
		// are settled with their own end, and go again with it if needed.
		pos = u.end
	}
	var b []*entry
	_, err := t.try(t.ctx, &b, pos)
	if err != nil && fatal(err) {
		t.setFatal(err)
	}
	if len(b) > 0 {
		// Not committed by this try: back to the front of what waits.
		t.mu.Lock()
		t.batch = append(b, t.batch...)
		t.mu.Unlock()
	}
}

// fatal: no further attempt of this producer can succeed (kafka.IsFatalTxn,
// a client that cannot begin, a hanging transaction only an operator ends).
func fatal(err error) bool {
	return kafka.IsFatalTxn(err) || errors.Is(err, errBegin) || errors.Is(err, errHanging) || errors.Is(err, errFull)
}

// setFatal records the first fatal error and reports it. Called with
// commitMu held.
func (t *Txn) setFatal(err error) {
	if t.fatal != nil {
		return
	}
	t.fatal = kafka.FatalTxnError(t.txnID, err)
	if errors.Is(err, errHanging) {
		t.fatal = err // says what to do itself
	}
	t.log.Error("kafka: the transactional producer cannot commit again", "transactional_id", t.txnID, "err", err)
	if t.cfg.Fail != nil {
		t.cfg.Fail(t.fatal)
	}
}

// commit publishes what waits in one Kafka transaction, retrying until it
// commits, a fatal error, or ctx ends; the outcomes go to the events' Done.
func (t *Txn) commit(ctx context.Context) error { return t.commitShrinking(ctx, t.shrinkBatch) }

// commitShrinking is commit; after a transaction timeout (timeout.go)
// shrink makes what waits smaller.
func (t *Txn) commitShrinking(ctx context.Context, shrink shrinkFunc) error {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	for {
		// What a timeout gave back (shrinkBatch) goes in the next one.
		t.gaveBack = false
		if err := t.commitBatch(ctx, shrink); err != nil || !t.gaveBack {
			return err
		}
	}
}

// commitBatch takes what waits and commits it (commitShrinking). Called
// with commitMu held.
func (t *Txn) commitBatch(ctx context.Context, shrink shrinkFunc) error {
	t.mu.Lock()
	// A part of a transaction (split.go) may be the first thing this run
	// hands over: its position is the one committed.
	b, end := t.batch, t.partFloorLocked()
	t.batch = nil
	t.mu.Unlock()
	if len(b) == 0 {
		return nil
	}
	var err error
	events := len(b)
	for attempt := 1; t.fatal == nil; attempt++ {
		var done bool
		done, err = t.try(ctx, &b, end)
		if !done && err != nil && t.timedOut(err) {
			if done, err = t.afterTimeout(ctx, &b, &end, shrink); err == nil && !done {
				continue
			}
		}
		switch {
		case done:
			t.growParts(events, time.Since(t.lastTry))
			return nil
		case ctx.Err() != nil:
			// Not committed: given back, so that a later Flush (or Close)
			// settles them.
			t.mu.Lock()
			t.batch = append(b, t.batch...)
			t.mu.Unlock()
			return ctx.Err()
		case fatal(err):
			t.setFatal(err)
		case errors.Is(err, errRefused):
			// The records to dead-letter or send alone are marked: at once.
		default:
			msg := "kafka transaction aborted; producing its PostgreSQL transactions again in a new one"
			if t.unsure != nil {
				msg = "kafka transaction commit not confirmed; learning whether it committed before producing again"
			}
			t.log.Warn(msg, "attempt", attempt, "events", len(b), "end_lsn", end, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(backoff.Jitter(backoff.Nth(100*time.Millisecond, 5*time.Second, attempt))):
			}
		}
	}
	err = t.fatal
	for _, e := range b {
		e.done.Delivered(sink.Outcome{Err: err})
	}
	return err
}

// attempt is one Kafka transaction: the events of b, what it writes to
// the quarantine's topics (quarantine.go), then the position end (none
// for a write of the set before any position).
func (t *Txn) attempt(ctx context.Context, b []*entry, end lsn.LSN) error {
	t.lastQ = nil
	qs, err := t.route(ctx, b)
	if err != nil {
		return err
	}
	t.lastQ = qs
	cl := t.cl
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("%w: %w", errBegin, err)
	}
	t.txnSeq++
	if err := t.produceEvents(ctx, cl, b); err != nil {
		return t.abort(ctx, err)
	}
	t.noteTopics(b, t.txnSeq)
	if qs.writes() {
		if err := t.sideRecords(ctx, cl, b, qs); err != nil {
			return t.abort(ctx, err)
		}
	}
	part := partOf(b)
	if len(b) == 0 {
		part = t.lastPart // the position again, alone (probe)
	}
	var posErr error
	if end != 0 || len(b) > 0 {
		pos, err := t.positionRecord(end, t.txnSeq, part)
		if err != nil {
			return t.abort(ctx, err)
		}
		cl.Produce(ctx, pos, func(_ *kgo.Record, err error) { posErr = err })
	}
	if err := cl.Flush(ctx); err != nil {
		return t.abort(ctx, err)
	}
	if err := t.refusals(b); err != nil {
		return t.abort(ctx, err)
	}
	if posErr != nil {
		return t.abort(ctx, fmt.Errorf("produce position to %s: %w", t.cfg.Positions, posErr))
	}
	if qs.err != nil {
		return t.abort(ctx, qs.err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		if !kafka.IsFatalTxn(err) && unconfirmedEnd(err) {
			// Producing the events again now could publish them twice:
			// the next try settles it first.
			return fmt.Errorf("commit transaction: %w: %w", errUnconfirmed, err)
		}
		return t.abort(ctx, fmt.Errorf("commit transaction: %w", err))
	}
	return nil
}

// produceEvents produces b's events in the open transaction; one marked
// suspect goes alone, so that a refusal is its own: the transaction is
// then to be aborted (the refusals error).
func (t *Txn) produceEvents(ctx context.Context, cl *kgo.Client, b []*entry) error {
	for _, e := range b {
		e.err, e.alone = nil, e.suspect
	}
	for _, e := range b {
		rec := new(kgo.Record)
		*rec = e.sent().Record // a copy per attempt: the client writes into it
		e.out = rec
		withPart(rec, e)
		if !e.alone {
			cl.Produce(ctx, rec, e.promise)
			continue
		}
		if err := cl.Flush(ctx); err != nil {
			return err
		}
		if e.err = cl.ProduceSync(ctx, rec).FirstErr(); e.err != nil {
			if err := cl.Flush(ctx); err != nil {
				return err
			}
			return t.refusals(b)
		}
	}
	return nil
}

func (e *entry) promise(_ *kgo.Record, err error) { e.err = err }
