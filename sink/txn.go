package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TxnConfig configures the exactly-once sink (kafka.delivery exactly_once).
type TxnConfig struct {
	Sink Config
	// Positions is the compacted topic the position is committed to.
	Positions string
	// Source names the stream: the position record's key and the base of
	// the transactional id, so that a second connector on the same source
	// fences the first (PositionKey).
	Source string
	// Interval bounds how long committed PostgreSQL transactions wait for
	// their Kafka transaction; 0 means 5ms.
	Interval time.Duration
	// MaxRecords commits at once when this many events wait; 0 means
	// Sink.MaxBufferedRecords, or kafkaopt.DefaultMaxBufferedRecords when that is 0.
	MaxRecords int
	// TransactionTimeout is the broker's bound on an open transaction;
	// 0 means one minute.
	TransactionTimeout time.Duration
	// FenceCheck: after this long without a commit the position is
	// committed again, alone, so that a fenced instance learns it (and
	// stops) even when it has nothing to publish; 0 means 2s.
	FenceCheck time.Duration
	// Fail receives the fatal error once (fenced, not authorized), also
	// when no event is waiting to carry it.
	Fail func(error)
	// Prerequisite makes the error for a broker setting to change
	// (replication.PrerequisiteError in the connector; the sink does not
	// import the replication package).
	Prerequisite func(problem, fix string) error
}

// Txn is the exactly-once sink. The pipeline hands it each PostgreSQL
// transaction whole (Produce for every event, then EndTxn with its end LSN);
// it keeps them in memory and, at most every Interval (sooner once
// MaxRecords wait), produces them together with the position record in one
// Kafka transaction. Every outcome is reported after the commit, so the
// tracker never acknowledges, and the slot never confirms, past a committed
// position. A transaction that fails is aborted and its PostgreSQL
// transactions produced again in a new one; a record the broker refuses
// cannot be part of a committed transaction, so it is found (the records
// refused with others are sent alone the next time) and dead-lettered
// instead, in the same transaction as the rest.
type Txn struct {
	s     *Sink // its client is transactional; its topic helpers are shared, its Produce path unused
	log   *slog.Logger
	cfg   TxnConfig
	txnID string

	limits sync.Map // topic → int32 max.message.bytes, read by franz-go (batchMax)

	mu    sync.Mutex
	open  []*entry // the PostgreSQL transaction being handed over
	batch []*entry // whole PostgreSQL transactions waiting for a Kafka transaction
	end   lsn.LSN  // end of the last of them
	since time.Time
	// hold, when set, keeps what waits out of a Kafka transaction until a
	// PostgreSQL transaction ending at or past it is handed over (HoldUntil).
	hold   lsn.LSN
	closed bool
	kick   chan struct{} // wakes the commit loop

	// commitMu makes one Kafka transaction at a time; it guards topics,
	// fatal and unsure.
	commitMu  sync.Mutex
	topics    map[string]*txnTopic
	fatal     error
	committed atomic.Uint64 // last position committed
	lastTry   time.Time     // last transaction attempted
	txnSeq    uint64        // Position.Txn of the last attempt
	// unsure is the last attempt when its commit was not confirmed: it may
	// have committed, and nothing is produced before that is known.
	unsure *unconfirmed
	// aborting: an abort failed without an answer; the client still counts
	// itself in the transaction until an abort succeeds (franz-go's
	// EndTransaction: retry with TryAbort), so no attempt begins before.
	aborting bool

	timeline atomic.Int32 // stamped on position records (SetTimeline)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// entry is one event in the sink's hands until its transaction commits.
type entry struct {
	rec     *record // its own topic, or its dead-letter copy
	done    Done
	suspect bool  // refused together with others: sent alone next time
	alone   bool  // sent alone in this attempt
	err     error // this attempt's outcome
}

type txnTopic struct {
	known        bool
	stale        bool // re-read the limit: a refusal may mean it was lowered
	limit        int32
	missing      bool
	missingSince time.Time
}

// NewTxn creates the transactional producer. Call Start before Produce.
func NewTxn(cfg TxnConfig, log *slog.Logger) (*Txn, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = kafkaopt.DefaultTxnInterval
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = cfg.Sink.MaxBufferedRecords
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = kafkaopt.DefaultMaxBufferedRecords
	}
	if cfg.TransactionTimeout <= 0 {
		cfg.TransactionTimeout = time.Minute
	}
	if cfg.FenceCheck <= 0 {
		cfg.FenceCheck = 2 * time.Second
	}
	t := &Txn{log: log, cfg: cfg, txnID: "outbox-cdc-" + cfg.Source, topics: make(map[string]*txnTopic),
		kick: make(chan struct{}, 1)}
	sc := cfg.Sink
	sc.ParkingTopic = "" // quarantine is refused with exactly_once (config)
	sc.extra = append(append([]kgo.Opt(nil), sc.extra...),
		kgo.TransactionalID(t.txnID),
		kgo.TransactionTimeout(cfg.TransactionTimeout),
		// Batches are capped at the limits this sink reads (prepare).
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			v, _ := t.limits.Load(topic)
			n, _ := v.(int32)
			return batchCap(n)
		}),
	)
	s, err := New(sc, log)
	if err != nil {
		return nil, err
	}
	t.s = s
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// TransactionalID is the id this sink commits under.
func (t *Txn) TransactionalID() string { return t.txnID }

// Client exposes the client to tests in this module.
func (t *Txn) Client() *kgo.Client { return t.s.cl }

// Produce keeps rec (which may be reused when Produce returns) in the
// PostgreSQL transaction being handed over. It does not block.
func (t *Txn) Produce(ctx context.Context, rec *router.Record, done Done) error {
	if err := ctx.Err(); err != nil {
		done.Delivered(Outcome{Err: err})
		return err
	}
	e := &entry{rec: newRecord(rec, t.s.dlq), done: done}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		done.Delivered(Outcome{Err: kgo.ErrClientClosed})
		return nil
	}
	t.open = append(t.open, e)
	t.mu.Unlock()
	return nil
}

// EndTxn marks the end of the PostgreSQL transaction handed over since the
// last EndTxn or AbortTxn; end is its end LSN. It commits at once (blocking:
// backpressure) when MaxRecords events wait, else within Interval.
func (t *Txn) EndTxn(end lsn.LSN) {
	t.mu.Lock()
	if len(t.open) == 0 && len(t.batch) == 0 {
		// Nothing of it to publish: the tracker moves past it alone.
		t.mu.Unlock()
		return
	}
	if len(t.batch) == 0 {
		t.since = time.Now()
	}
	t.batch = append(t.batch, t.open...)
	t.open = nil
	t.end = max(t.end, end)
	t.release(t.end, len(t.batch))
	full := len(t.batch) >= t.cfg.MaxRecords && t.hold == 0
	t.mu.Unlock()
	if full {
		_ = t.commit(t.ctx)
		return
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// HoldUntil keeps every PostgreSQL transaction handed over from now on in
// the Kafka transaction that holds what waits, until one ending at or past
// pos is handed over or the stream passes pos (Pass). A gap repair's rows
// and the rest of their PostgreSQL transactions, which the stream decodes
// after the repair (table-less events, rows of other outbox tables), then
// commit together. It gives up, with a warning, once holdRecords events
// wait: memory stays bounded, and such a transaction may be split.
func (t *Txn) HoldUntil(pos lsn.LSN) {
	t.mu.Lock()
	t.hold = pos
	t.mu.Unlock()
}

// Pass tells the sink that the stream is at pos between transactions:
// every transaction ending before pos was handed over.
func (t *Txn) Pass(pos lsn.LSN) {
	t.mu.Lock()
	held := t.hold != 0
	t.release(pos, len(t.batch))
	released := held && t.hold == 0
	t.mu.Unlock()
	if released {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// errHeld: Flush found what waits under a hold.
var errHeld = errors.New("the gap repair's Kafka transaction waits for the stream to pass the gap")

// holdRecords bounds the events a hold keeps in memory.
func (t *Txn) holdRecords() int { return 10 * t.cfg.MaxRecords }

// release ends the hold once the stream reached it or it keeps too much.
// Called with mu held.
func (t *Txn) release(pos lsn.LSN, waiting int) {
	switch {
	case t.hold == 0:
	case pos >= t.hold:
		t.hold = 0
	case waiting >= t.holdRecords():
		t.log.Warn("kafka: the gap repair's Kafka transaction stops waiting for the rest of the gap's PostgreSQL transactions; "+
			"one that also wrote table-less events or rows of another outbox table during the gap may be split over two Kafka transactions",
			"events_waiting", waiting, "until", t.hold, "at", pos)
		t.hold = 0
	}
}

// AbortTxn forgets the PostgreSQL transaction being handed over (the
// stream reconnects; it comes again).
func (t *Txn) AbortTxn() {
	t.mu.Lock()
	open := t.open
	t.open = nil
	t.mu.Unlock()
	for _, e := range open {
		e.done.Delivered(Outcome{Err: kgo.ErrAborting})
	}
}

// SetTimeline records the timeline the stream is on: the start's, then each
// connection's (the stream's OnTimeline), stamped on the positions committed
// from then on.
func (t *Txn) SetTimeline(tli int32) { t.timeline.Store(tli) }

// Committed is the last position committed to Kafka by this sink.
func (t *Txn) Committed() lsn.LSN { return lsn.LSN(t.committed.Load()) }

// Flush commits the whole PostgreSQL transactions handed over, or gives up
// when ctx ends (they are not acknowledged then).
func (t *Txn) Flush(ctx context.Context) error {
	t.mu.Lock()
	held := t.hold != 0 && len(t.batch) > 0
	t.mu.Unlock()
	if held {
		// Committing now could split a PostgreSQL transaction of the gap:
		// nothing is acknowledged, and the restart repairs the gap again.
		return errHeld
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	if err := t.commit(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// Close stops the commit loop and closes the client; events not committed
// get a shutdown outcome. An open Kafka transaction is aborted by the
// broker (timeout) or by the next instance's start, whichever is first.
func (t *Txn) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	t.commitMu.Lock() // a commit in progress ends with the context
	t.s.Close()
	var unsure []*entry
	if t.unsure != nil {
		unsure = t.unsure.entries // their commit may have happened: the next start reads it
	}
	t.commitMu.Unlock()
	t.mu.Lock()
	left := append(append(unsure, t.open...), t.batch...)
	t.open, t.batch = nil, nil
	t.mu.Unlock()
	for _, e := range left {
		e.done.Delivered(Outcome{Err: kgo.ErrClientClosed})
	}
}

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
	if err != nil && (isFatalTxn(err) || errors.Is(err, errBegin)) {
		t.setFatal(err)
	}
	if len(b) > 0 {
		// Not committed by this try: back to the front of what waits.
		t.mu.Lock()
		t.batch = append(b, t.batch...)
		t.mu.Unlock()
	}
}

// setFatal records the first fatal error and reports it. Called with
// commitMu held.
func (t *Txn) setFatal(err error) {
	if t.fatal != nil {
		return
	}
	t.fatal = fatalTxnError(t.txnID, err)
	t.log.Error("kafka: the transactional producer cannot commit again", "transactional_id", t.txnID, "err", err)
	if t.cfg.Fail != nil {
		t.cfg.Fail(t.fatal)
	}
}

// commit publishes what waits in one Kafka transaction, retrying until it
// commits, a fatal error, or ctx ends; the outcomes go to the events' Done.
func (t *Txn) commit(ctx context.Context) error {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	t.mu.Lock()
	b, end := t.batch, t.end
	t.batch = nil
	t.mu.Unlock()
	if len(b) == 0 {
		return nil
	}
	var err error
	for attempt := 1; t.fatal == nil; attempt++ {
		var done bool
		done, err = t.try(ctx, &b, end)
		switch {
		case done:
			return nil
		case ctx.Err() != nil:
			// Not committed: given back, so that a later Flush (or Close)
			// settles them.
			t.mu.Lock()
			t.batch = append(b, t.batch...)
			t.mu.Unlock()
			return ctx.Err()
		case isFatalTxn(err) || errors.Is(err, errBegin):
			t.setFatal(err)
		case errors.Is(err, errRefused):
			// The records to dead-letter or send alone are marked: at once.
		default:
			d := min(100*time.Millisecond<<min(attempt, 6), 5*time.Second)
			msg := "kafka transaction aborted; producing its PostgreSQL transactions again in a new one"
			if t.unsure != nil {
				msg = "kafka transaction commit not confirmed; learning whether it committed before producing again"
			}
			t.log.Warn(msg, "attempt", attempt, "events", len(b), "end_lsn", end, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(d/2 + rand.N(d/2+1)):
			}
		}
	}
	err = t.fatal
	for _, e := range b {
		e.done.Delivered(Outcome{Err: err})
	}
	return err
}

// attempt is one Kafka transaction: the events of b, then the position end.
func (t *Txn) attempt(ctx context.Context, b []*entry, end lsn.LSN) error {
	for _, e := range b {
		if err := t.prepare(ctx, e); err != nil {
			return err
		}
	}
	cl := t.s.cl
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("%w: %w", errBegin, err)
	}
	t.txnSeq++
	for _, e := range b {
		e.err, e.alone = nil, e.suspect
	}
	for _, e := range b {
		rec := new(kgo.Record)
		*rec = e.rec.Record // a copy per attempt: the client writes into it
		if !e.alone {
			cl.Produce(ctx, rec, e.promise)
			continue
		}
		// Alone in its batch: a refusal is its own.
		if err := cl.Flush(ctx); err != nil {
			return t.abort(ctx, err)
		}
		if e.err = cl.ProduceSync(ctx, rec).FirstErr(); e.err != nil {
			if err := cl.Flush(ctx); err != nil {
				return t.abort(ctx, err)
			}
			return t.abort(ctx, t.refusals(b))
		}
	}
	pos, err := t.positionRecord(end, t.txnSeq)
	if err != nil {
		return t.abort(ctx, err)
	}
	var posErr error
	cl.Produce(ctx, pos, func(_ *kgo.Record, err error) { posErr = err })
	if err := cl.Flush(ctx); err != nil {
		return t.abort(ctx, err)
	}
	if err := t.refusals(b); err != nil {
		return t.abort(ctx, err)
	}
	if posErr != nil {
		return t.abort(ctx, fmt.Errorf("produce position to %s: %w", t.cfg.Positions, posErr))
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		if !isFatalTxn(err) && unconfirmedEnd(err) {
			// Producing the events again now could publish them twice:
			// the next try settles it first.
			return fmt.Errorf("commit transaction: %w: %w", errUnconfirmed, err)
		}
		return t.abort(ctx, fmt.Errorf("commit transaction: %w", err))
	}
	return nil
}

func (e *entry) promise(_ *kgo.Record, err error) { e.err = err }
