// Package exactlyonce is kafka.delivery exactly_once: a transactional
// producer that commits whole PostgreSQL transactions together with their
// end position in one Kafka transaction (Txn). It shares with package sink
// what both producers need (sink.Config's connection and producer options,
// the topic metadata, the event and its dead-letter copy, the error
// classes, the committed-log reader); sink does not import it.
package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Config configures the exactly-once producer (kafka.delivery exactly_once).
type Config struct {
	// Sink is the kafka section: the cluster, its security, the producer
	// settings, the dead-letter topic and the topic lookup.
	Sink sink.Config
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
	// Sink.BufferedRecords().
	MaxRecords int
	// TransactionTimeout is the broker's bound on an open transaction
	// (kafka.transaction_timeout); 0 means kafkaopt.DefaultTxnTimeout.
	TransactionTimeout time.Duration
	// FenceCheck: after this long without a commit the position is
	// committed again, alone, so that a fenced instance learns it (and
	// stops) even when it has nothing to publish; 0 means 2s.
	FenceCheck time.Duration
	// Fail receives the fatal error once (fenced, not authorized), also
	// when no event is waiting to carry it.
	Fail func(error)
	// Proof returns the history mark that proves positions up to at are in
	// the server's history (replication/marks.go); it is recorded with each
	// position. Nil, or a zero mark: none.
	Proof func() (mark uint64, at lsn.LSN, commit time.Time)
	// Acknowledged is the highest position PostgreSQL was told is delivered
	// when the run starts (the slot's confirmed position, a later
	// checkpoint's): a hanging transaction whose position it reaches was
	// acknowledged, and an abort would lose its events (decideHang). 0:
	// not known; the runbook then asks the operator to check the slot.
	Acknowledged lsn.LSN
}

// Txn is the exactly-once producer. The pipeline hands it each PostgreSQL
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
	cl   *kgo.Client // transactional: every attempt is one of its transactions
	adm  *kadm.Client
	meta *kafka.Metadata // the topic lookup both producers use
	// base is the first client, which adm and meta use; cl replaces it as
	// the transactional client after a fence that was the broker's answer
	// to this instance's own commit (settleFenced).
	base     *kgo.Client
	instance string // stamped on position records: this process
	log      *slog.Logger
	cfg      Config
	txnID    string

	// unknownTimeout and poll: how long a missing topic is waited for, and
	// how often it is looked for meanwhile (sink.Config.TopicWait).
	unknownTimeout, poll time.Duration

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
	topics    map[string]*topicInfo
	fatal     error
	committed atomic.Uint64 // last position committed
	// prior is the proof of the position read at start: a position this run
	// did not hand over (the probe commits it again) keeps it, never the
	// run's own proof, which proves only what this run decoded.
	prior   Position
	lastTry time.Time // last transaction attempted
	txnSeq  uint64    // Position.Txn of the last attempt
	// unsure is the last attempt when its commit was not confirmed: it may
	// have committed, and nothing is produced before that is known.
	unsure *unconfirmed
	// aborting: an abort failed without an answer; the client still counts
	// itself in the transaction until an abort succeeds (franz-go's
	// EndTransaction: retry with TryAbort), so no attempt begins before.
	aborting bool
	// claimDue: a claim began and did not finish (claim); nothing uses the
	// client before one does. Guarded by commitMu.
	claimDue bool
	// hang is the hang check's state (hanging.go); guarded by commitMu
	// after Start.
	hang hangState
	// lastPart is the Part of the last position committed (split.go);
	// guarded by commitMu.
	lastPart *Part
	// attempted: the last try reached its attempt (timeout.go); gaveBack:
	// a timeout gave events back to what waits (shrinkBatch). Guarded by
	// commitMu.
	attempted, gaveBack bool
	// splitErr is set once a split transaction does not come back as it
	// was committed (split.go): no try commits anything after it.
	splitErr atomic.Pointer[error]
	// split is the open PostgreSQL transaction's state (split.go), the
	// caller's of the hand-over only.
	split split

	// q is the quarantined set (dlq.mode quarantine, quarantine.go); nil
	// in skip mode. write is the set's write a try carries (Transact), and
	// lastQ what the last attempt did to the set; both guarded by commitMu.
	q     *quarantine.Set
	write *quarantine.Write
	lastQ *quarantines

	partMax  atomic.Int64  // events per part now (timeout.go); 0: MaxRecords
	timeline atomic.Int32  // stamped on position records (SetTimeline)
	floor    atomic.Uint64 // where the run starts (SetFloor)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// entry is one event in the producer's hands until its transaction commits.
type entry struct {
	rec     *kafka.Event // its own topic, or its dead-letter copy
	done    sink.Done
	suspect bool  // refused together with others: sent alone next time
	alone   bool  // sent alone in this attempt
	err     error // this attempt's outcome
	// sp marks an event of a split transaction (split.go); idx is its
	// index in that transaction; topic, key and value are as the router
	// made them (rec may become a dead letter), for its fingerprint, which
	// only a part's last event needs.
	sp         *splitMark
	idx        int
	topic      string
	key, value []byte
	// txnEnd is the end LSN of its PostgreSQL transaction when it is the
	// last event handed over of it (a batch may be cut there, timeout.go).
	txnEnd lsn.LSN
	// parked is its copy for the parking topic in this attempt, nil when
	// its key is not quarantined (quarantine.go); out is the record this
	// attempt sent, with its partition and offset once acknowledged.
	parked *kafka.Event
	out    *kgo.Record
}

// sent is the event as this attempt sends it: parked, or to its topic.
func (e *entry) sent() *kafka.Event {
	if e.parked != nil {
		return e.parked
	}
	return e.rec
}

// New creates the transactional producer. It does not contact the
// brokers; call Start before Produce.
func New(cfg Config, log *slog.Logger) (*Txn, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = kafkaopt.DefaultTxnInterval
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = cfg.Sink.BufferedRecords()
	}
	if cfg.TransactionTimeout <= 0 {
		cfg.TransactionTimeout = kafkaopt.DefaultTxnTimeout
	}
	if cfg.FenceCheck <= 0 {
		cfg.FenceCheck = 2 * time.Second
	}
	t := &Txn{log: log, cfg: cfg, txnID: "outbox-cdc-" + cfg.Source, topics: make(map[string]*topicInfo),
		kick: make(chan struct{}, 1)}
	t.unknownTimeout, t.poll = cfg.Sink.TopicWait()
	cl, err := t.newClient()
	if err != nil {
		return nil, err
	}
	t.cl, t.base, t.adm, t.meta = cl, cl, kadm.NewClient(cl), kafka.NewMetadata(cl, kafka.Creation{Auto: cfg.Sink.AutoCreateTopics,
		Partitions: cfg.Sink.TopicPartitions, Replication: cfg.Sink.TopicReplicationFactor}, log)
	t.instance = strconv.FormatUint(rand.Uint64(), 36)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if err := t.openQuarantine(); err != nil {
		cl.Close()
		return nil, err
	}
	return t, nil
}

// newClient is the transactional client: the cluster's connection options
// and the producer settings both producers share, its transactional id,
// and batches capped at the limits this producer reads (prepare).
func (t *Txn) newClient() (*kgo.Client, error) {
	conn, err := t.cfg.Sink.ConnOpts()
	if err != nil {
		return nil, err
	}
	opts, err := t.cfg.Sink.ProducerOpts(conn, t.log, t.batchMax)
	if err != nil {
		return nil, err
	}
	opts = append(opts, kgo.TransactionalID(t.txnID), kgo.TransactionTimeout(t.cfg.TransactionTimeout))
	cl, err := kgo.NewClient(append(opts, t.cfg.Sink.TestOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// batchMax is franz-go's batch cap for topic (kafka.BatchCap of its limit).
func (t *Txn) batchMax(topic string) int32 {
	v, _ := t.limits.Load(topic)
	n, _ := v.(int32)
	return kafka.BatchCap(n)
}

// TransactionalID is the id this producer commits under.
func (t *Txn) TransactionalID() string { return t.txnID }

// Produce keeps rec (which may be reused when Produce returns) in the
// PostgreSQL transaction being handed over. It blocks only to commit a part
// of a transaction too large to keep whole (split.go); an event committed
// in a part before (a restart, a reconnect) is delivered at once.
func (t *Txn) Produce(ctx context.Context, rec *router.Record, done sink.Done) error {
	if err := ctx.Err(); err != nil {
		done.Delivered(sink.Outcome{Err: err})
		return err
	}
	if over, err := t.passOver(rec); over {
		done.Delivered(sink.Outcome{Err: err})
		return err
	}
	e := &entry{rec: kafka.NewEvent(rec, t.cfg.Sink.DLQTopic), done: done, idx: t.split.index - 1,
		topic: rec.Topic, key: rec.Key, value: rec.Value}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		done.Delivered(sink.Outcome{Err: kgo.ErrClientClosed})
		return nil
	}
	t.open = append(t.open, e)
	t.split.bytes += e.rec.Size()
	if t.due() {
		t.cut(ctx) // unlocks
		return nil
	}
	t.mu.Unlock()
	return nil
}

// EndTxn marks the end of the PostgreSQL transaction handed over since the
// last EndTxn or AbortTxn; end is its end LSN. It commits at once (blocking:
// backpressure) when MaxRecords events wait, else within Interval.
func (t *Txn) EndTxn(end lsn.LSN) {
	t.mu.Lock()
	t.endSplit()
	if len(t.open) == 0 && len(t.batch) == 0 {
		// Nothing of it to publish: the tracker moves past it alone.
		t.mu.Unlock()
		return
	}
	if len(t.batch) == 0 {
		t.since = time.Now()
	}
	if n := len(t.open); n > 0 {
		t.open[n-1].txnEnd = end
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

// Pass tells the producer that the stream is at pos between transactions:
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
		e.done.Delivered(sink.Outcome{Err: kgo.ErrAborting})
	}
	t.abortSplit()
}

// SetTimeline records the timeline the stream is on: the start's, then each
// connection's (the stream's OnTimeline), stamped on the positions committed
// from then on.
func (t *Txn) SetTimeline(tli int32) { t.timeline.Store(tli) }

// Committed is the last position committed to Kafka by this producer.
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
	t.cl.Close()
	if t.base != t.cl {
		t.base.Close()
	}
	var unsure []*entry
	if t.unsure != nil {
		unsure = t.unsure.entries // their commit may have happened: the next start reads it
	}
	t.commitMu.Unlock()
	if t.q != nil {
		// Not under commitMu: a redrive may be waiting for it (Transact),
		// and ends with t.ctx once it has it.
		t.q.Close()
	}
	t.mu.Lock()
	left := append(append(unsure, t.open...), t.batch...)
	t.open, t.batch = nil, nil
	t.mu.Unlock()
	for _, e := range left {
		e.done.Delivered(sink.Outcome{Err: kgo.ErrClientClosed})
	}
}
