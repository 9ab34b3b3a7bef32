package pipeline

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
)

// boundary is what the processor tells the sink about PostgreSQL
// transactions, chosen once at start (newSink): exactly_once's hand-over
// (eos), or nothing (atLeastOnce). The processor never looks at the mode.
type boundary interface {
	// begin: the transaction xid, committing at final, begins; plain says
	// no gap repair depends on it, so that it may be committed in parts.
	// resumed: some of its events were committed before (a part).
	begin(xid uint32, final lsn.LSN, plain bool) (resumed bool)
	// resuming: a transaction committed in part (before the start, or
	// before a reconnect) is yet to end.
	resuming() bool
	// note: an outbox transaction (xid, committing at final) was decoded,
	// published or skipped.
	note(xid uint32, final lsn.LSN)
	// end: the transaction handed over since the last call ends at end.
	end(end lsn.LSN)
	// abort: the transaction was cut short (a reconnect).
	abort()
	// decoded: the stream delivered everything before pos.
	decoded(pos lsn.LSN)
	// pass: the stream is at pos between transactions.
	pass(pos lsn.LSN)
	// holdUntil keeps the open Kafka transaction until the stream passes pos.
	holdUntil(pos lsn.LSN)
	// inKafka: rec was published before (the read-back, readback.go).
	inKafka(ctx context.Context, rec *router.Record, commit time.Time) (bool, error)
	// repairing switches the read-back to the repair's rule; repaired
	// counts the repair's rows found in Kafka (readback_repair.go).
	repairing(on bool)
	repaired() int
	// holdAt is the highest position that may be confirmed (hold.go).
	holdAt() lsn.LSN
	// freezer freezes the hand-over when a gap is recorded (nil: none).
	freezer() func() lsn.LSN
}

// atLeastOnce is the boundary of kafka.delivery at_least_once: the sink
// sees records only.
type atLeastOnce struct{}

func (atLeastOnce) begin(uint32, lsn.LSN, bool) bool { return false }
func (atLeastOnce) resuming() bool                   { return false }
func (atLeastOnce) note(uint32, lsn.LSN)             {}
func (atLeastOnce) end(lsn.LSN)                      {}
func (atLeastOnce) abort()                           {}
func (atLeastOnce) decoded(lsn.LSN)                  {}
func (atLeastOnce) pass(lsn.LSN)                     {}
func (atLeastOnce) holdUntil(lsn.LSN)                {}
func (atLeastOnce) inKafka(context.Context, *router.Record, time.Time) (bool, error) {
	return false, nil
}
func (atLeastOnce) repairing(bool)          {}
func (atLeastOnce) repaired() int           { return 0 }
func (atLeastOnce) holdAt() lsn.LSN         { return lsn.LSN(math.MaxUint64) }
func (atLeastOnce) freezer() func() lsn.LSN { return nil }

// txnBoundary is the transactional sink's side of the processor: it is
// told where each PostgreSQL transaction ends, or that it was cut short.
type txnBoundary interface {
	BeginTxn(id exactlyonce.TxnID, allowed bool)
	Resumes(id exactlyonce.TxnID) bool
	Resuming() bool
	KeepWhole()
	Allow()
	HeldBack()
	PartFloor() lsn.LSN
	SetFloor(pos lsn.LSN)
	EndTxn(end lsn.LSN)
	AbortTxn()
	// HoldUntil keeps the Kafka transaction open until a PostgreSQL
	// transaction ending at or past pos is handed over, or Pass(pos).
	HoldUntil(pos lsn.LSN)
	Pass(pos lsn.LSN)
}

// eos is exactly_once's side of a run: the hand-over to the transactional
// sink, the hold-back of the slot and the checkpoint (hold.go) and the
// read-back of what Kafka holds already (readback.go). Its fields are set
// at start (newSink, begin) and then owned by the processor, but for the
// hand-over's freeze (the checkpoint writer) under its lock.
type eos struct {
	p        *Pipeline // read-only: the plan, the tracker, the repair
	txn      txnBoundary
	handover handover
	hold     *holdBack // set by begin
	readBack *readBack // set at start when Kafka may hold the first transactions
	// splittable: the open transaction may be committed in parts once no
	// read-back decides its events (begin).
	splittable bool
	// heldEnd is the end of the last transaction the read-back held back
	// whole (its events all in Kafka): a part's position must not lie below
	// it (inKafka).
	heldEnd lsn.LSN
}

// handover is exactly_once's hand-over of ended PostgreSQL transactions to
// the sink. Once this run records a gap, a restart repairs it where the
// stream reaches Since and tells a committed repair by a position past
// Since; so the run freezes the hand-over, raises Since to the highest end
// handed over (nothing later can commit), and hands nothing more over.
type handover struct {
	mu     sync.Mutex
	frozen bool
	max    lsn.LSN // highest end handed over (from the position committed at start)
}

// freeze stops the hand-over and returns the highest end handed over.
func (h *handover) freeze() lsn.LSN {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.frozen = true
	return h.max
}

// started is told where the stream starts and what it skips up to.
func (e *eos) started(stream, skip lsn.LSN) {
	e.hold = newHoldBack(stream)
	e.handover.max = skip
	e.txn.SetFloor(skip)
}

// startReadBack has the first transactions looked up in Kafka before they
// are published (readback.go).
func (e *eos) startReadBack(ctx context.Context, floor time.Time) {
	if e.readBack != nil {
		return
	}
	cfg := e.p.cfg.Sink
	e.readBack = newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadRange(ctx, cfg, topics, since, fn)
	}, floor, e.p.log)
	for _, side := range []string{cfg.DLQTopic, cfg.ParkingTopic} {
		if side != "" {
			e.readBack.side = append(e.readBack.side, side)
		}
	}
	if !appTimestamps(e.p.cfg) {
		e.readBack.margin = time.Minute // clock skew between the server and the broker
	}
}

// appTimestamps reports whether a record's timestamp may come from an outbox
// column (outbox.timestamp_column), the application's clock.
func appTimestamps(cfg Config) bool {
	if cfg.Routes.TimestampColumn != "" {
		return true
	}
	for _, t := range cfg.More {
		if t.Routes.TimestampColumn != "" {
			return true
		}
	}
	return false
}

// begin lets the sink commit a transaction too large for one Kafka
// transaction in parts, unless a gap repair or the read-back could make it
// decode to other events on another run, or the hand-over froze. One
// committed in part before is split on: the repair waits for its commit
// (process.go), and its rows are the same on every run.
func (e *eos) begin(xid uint32, final lsn.LSN, plain bool) bool {
	h := &e.handover
	h.mu.Lock()
	frozen := h.frozen
	h.mu.Unlock()
	id := exactlyonce.TxnID{Final: final, Xid: xid}
	readBack := e.readBack != nil && !e.readBack.done
	e.splittable = (plain || e.txn.Resumes(id)) && !frozen
	e.txn.BeginTxn(id, e.splittable && !readBack)
	return e.txn.Resumes(id)
}

func (e *eos) resuming() bool { return e.txn.Resuming() }

func (e *eos) note(xid uint32, final lsn.LSN) { e.hold.add(xid, final) }

func (e *eos) end(end lsn.LSN) {
	h := &e.handover
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.frozen {
		// A gap was recorded: this transaction goes after the restart.
		e.txn.AbortTxn()
		e.readBack.abort()
		return
	}
	e.txn.EndTxn(end)
	h.max = max(h.max, end)
	if r := e.readBack; r != nil {
		whole := r.txns
		r.commit()
		if r.txns > whole {
			e.heldEnd = max(e.heldEnd, end)
		}
	}
}

func (e *eos) abort() {
	e.txn.AbortTxn()
	e.readBack.abort()
}

func (e *eos) decoded(pos lsn.LSN) { e.hold.decoded(pos) }

// pass tells the sink the stream is at pos between transactions, unless
// the hand-over froze: the transactions before pos were not handed over
// then, and a repair's Kafka transaction the pass would release would
// commit rows of theirs with a position below their commits (a restart
// decodes them again). Under the hand-over's lock, as end: a freeze
// between the check and the pass would let a position past the gap commit.
func (e *eos) pass(pos lsn.LSN) {
	h := &e.handover
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.frozen {
		e.txn.Pass(pos)
	}
}

// holdUntil keeps the repair's Kafka transaction open until the stream
// passes clearAt: every PostgreSQL transaction whose rows the repair read
// commits before it, so its table-less events and its rows of other
// outbox tables, which the stream decodes later, join the repair's rows.
func (e *eos) holdUntil(clearAt lsn.LSN) { e.txn.HoldUntil(clearAt) }

// inKafka asks the read-back; the events it holds back count as decoded
// for the positions of parts, and once it ends inside the open transaction
// (an event not found: everything after it is published) the rest may be
// split, unless it held whole transactions back that end past the position
// a part would carry (nothing of theirs moved it): a restart without a
// read-back would publish them again. Those below it (a restart's read-back
// of what it committed before) do not matter.
func (e *eos) inKafka(ctx context.Context, rec *router.Record, commit time.Time) (bool, error) {
	held, err := e.readBack.inKafka(ctx, rec, commit)
	switch r := e.readBack; {
	case err != nil || r == nil || r.repair:
	case held:
		e.txn.HeldBack()
	case r.cut && e.splittable && e.heldEnd <= e.txn.PartFloor():
		e.txn.Allow()
	}
	return held, err
}

// repairing also keeps the rest of the open transaction whole: the
// repair's rows are no part of what the stream decodes again.
func (e *eos) repairing(on bool) {
	e.readBack.repairing(on)
	if on {
		e.txn.KeepWhole()
	}
}
func (e *eos) repaired() int           { return e.readBack.repaired() }
func (e *eos) freezer() func() lsn.LSN { return e.handover.freeze }
