package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// producer is the sink as the pipeline uses it: records handed over in
// order, each outcome reported once to its Done; Flush waits for every
// outcome.
type producer interface {
	Produce(ctx context.Context, rec *router.Record, done sink.Done) error
	Flush(ctx context.Context) error
}

// errReplayDone ends the processor when a replay reached its end.
var errReplayDone = errors.New("replay reached its end")

// errSessionDropped: the gap repair lost its server and dropped the
// stream's session (backfill.go); the processor passes over what that
// session sent until the next one's Reset.
var errSessionDropped = errors.New("the gap repair dropped the replication session")

// process is the processor goroutine: it decodes, routes and produces, in WAL
// order, and tells the tracker where each transaction ends. produceCtx
// governs records handed to the sink; it outlives ctx so a stop drains them.
func (p *Pipeline) process(ctx, produceCtx context.Context, queue <-chan *replication.Batch) error {
	pl, w := p.plan, p.proc
	if pl.snapshot != nil {
		if err := w.snapshot(ctx, produceCtx, pl.snapshot); err != nil {
			return err
		}
	}
	w.pl, w.ctx, w.produceCtx, w.dec = pl, ctx, produceCtx, decode.NewTablesDecoder(mappings(p.cfg, pl.relIDs))
	w.bf, w.dispatched, w.decoded = p.rep.bf, pl.start, pl.stream.StartLSN
	var b *replication.Batch
	for {
		if b != nil {
			b.Release() // handled: its bytes may be queued again
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b = <-queue:
		}
		for i := range b.Msgs {
			err := w.handle(&b.Msgs[i])
			if errors.Is(err, errSessionDropped) {
				w.awaitReset = true
				continue
			}
			if err != nil {
				return err
			}
		}
	}
}

// processor decodes, routes and produces, in WAL order (the one goroutine
// that does), and owns what that needs: the routers, the per-table
// metrics, the commit times, the messages not published, and between
// messages the open transaction and how far the stream was handled.
type processor struct {
	p       *Pipeline             // read-only: the configuration, the plan, the tracker, the sink, the boundary
	routers []*router.Router      // one per outbox table (Event.Table)
	tables  []metrics.TableEvents // the per-event metrics of each outbox table
	// commits are recent commit times, for the checkpoint's CommitTime and
	// the oldest unacknowledged event's age (their readers).
	commits offsets.CommitTimes
	ignored ignoredMessages // the logical messages not published (messages.go)
	// contracts checks each routed event (contracts.go); nil when off.
	contracts *contractGate

	// Set when the run starts (process).
	pl              *plan
	ctx, produceCtx context.Context
	dec             *decode.Decoder
	bf              *backfill

	txn        *offsets.Txn
	skip       bool // transaction delivered before (below the start)
	commitTime time.Time
	xid        uint32
	txnFinal   lsn.LSN // commit LSN of the open transaction
	rows       bool    // the open transaction has outbox rows
	msgs       bool    // the open transaction has table-less outbox events
	// again: the open transaction as decoded again after a reconnect
	// (history.redecoded); unknown or forgotten ones stop the run at their
	// first event.
	again      again
	dispatched lsn.LSN // end of the last transaction fully handed to the sink
	// decoded is where the stream resumes after a reconnect: past the last
	// commit it sent, from its start. Below pl.start (exactly_once streams
	// from the slot, under the position committed to Kafka) transactions are
	// skipped, but decoded: the hold and the repair need them.
	decoded lsn.LSN
	rec     router.Record
	// awaitReset: the session was dropped (errSessionDropped); its
	// messages are passed over until the Reset.
	awaitReset bool
}

// handle handles one message of the stream.
func (w *processor) handle(m *replication.Message) error {
	if w.awaitReset && m.Kind != replication.Reset {
		return nil // sent again after the Reset, from w.decoded
	}
	switch m.Kind {
	case replication.Reset:
		w.awaitReset = false
		if w.txn != nil {
			w.bf.undo(w.txn)
			w.p.tracker.Abort(w.txn)
			w.p.b.abort()
			w.txn = nil
		}
		m.Resume(w.p.history.resume(w.decoded))
		return nil
	case replication.Keepalive:
		return w.keepalive(m.WALEnd)
	}
	res, err := w.dec.Decode(m.Data)
	if errors.Is(err, decode.ErrTableRenamed) { // replay: no known OID
		return fmt.Errorf("%w: set outbox.table to the new name (and update the publication), or rename it back; "+
			"rows inserted under the new name were not published", err)
	}
	if err != nil {
		return fmt.Errorf("decode message at %v: %w", m.WALStart, err)
	}
	switch res.Kind {
	case decode.KindBegin:
		return w.begin(&res.Begin)
	case decode.KindCommit:
		if w.txn == nil {
			return fmt.Errorf("commit at %v without begin", m.WALStart)
		}
		return w.commit(res.Commit.EndLSN)
	case decode.KindRelation:
		return w.relation(&res.Relation)
	case decode.KindEvent:
		if w.txn == nil {
			return fmt.Errorf("insert at %v outside a transaction", m.WALStart)
		}
		w.rows = true
		if err := w.redecodedEvent(); err != nil {
			return err
		}
		w.bf.note(&res.Event)
		if w.skip || w.bf.delivered(w.txnFinal, &res.Event) {
			return nil // a row the backfill read: only rows, never the transaction's messages
		}
		src := router.Source{Commit: w.commitTime, Xid: w.xid, LSN: m.WALStart}
		return w.publish(w.produceCtx, w.txn, src, &res.Event, m.Data, &w.rec)
	case decode.KindMessage:
		return w.message(m, &res.Message)
	}
	return nil
}

// keepalive is a position between transactions (none open) or inside one.
func (w *processor) keepalive(end lsn.LSN) error {
	p := w.p
	if w.txn != nil {
		return nil // only a position between transactions is one
	}
	if w.bf.idle(end) && !p.b.resuming() {
		// The repair alone, committing the keepalive's position (after a
		// transaction committed in part is decoded again: it would read
		// its rows).
		t := p.tracker.Begin()
		if err := w.runBackfill(w.ctx, w.produceCtx, w.bf, t); err != nil {
			if errors.Is(err, errSessionDropped) { // no Reset aborts t: it is no open transaction
				p.tracker.Abort(t)
				p.b.abort()
			}
			return err
		}
		p.tracker.Commit(t, end)
		w.recordRepair(t, end)
		p.b.end(end)
		w.dispatched, w.decoded = max(w.dispatched, end), max(w.decoded, end)
	}
	p.b.decoded(end)
	p.history.reached(end)
	p.b.pass(end)
	if w.pl.stopAt != 0 && end >= w.pl.stopAt {
		return errReplayDone
	}
	p.tracker.Idle(end)
	return nil
}

func (w *processor) begin(b *decode.Begin) error {
	p := w.p
	if w.pl.stopAt != 0 && b.FinalLSN >= w.pl.stopAt {
		return errReplayDone
	}
	w.txn = p.tracker.Begin()
	resumed := p.b.begin(b.Xid, b.FinalLSN, w.bf.quiet())
	if w.bf.due(b.FinalLSN) && !resumed && !p.b.resuming() {
		// The repair's rows first, in this transaction: they were written
		// before it committed. While a transaction committed in part is
		// yet to end (resuming: from the start or a reconnect) the repair
		// waits, here, at its commit and at keepalives, and runs at the
		// first point after it: its rows are decoded (seen) by then, so the
		// repair leaves them out, and the gap's rows follow it.
		if err := w.runBackfill(w.ctx, w.produceCtx, w.bf, w.txn); err != nil {
			return err
		}
	}
	w.txnFinal, w.rows, w.msgs = b.FinalLSN, false, false
	w.commitTime, w.xid = b.CommitTime, b.Xid
	// PostgreSQL skips these when streaming starts at the checkpoint; a
	// reconnect resumes at the proof (history.go), below what was decoded:
	// what was published then is skipped now.
	w.again = p.history.redecoded(w.id())
	w.skip = b.FinalLSN < w.pl.start || w.again == published
	p.m.Transactions.Inc()
	return nil
}

func (w *processor) commit(end lsn.LSN) error {
	p := w.p
	if w.bf.ends(end) && !p.b.resuming() {
		// Its commit record straddles Since: the repair joins it.
		if err := w.runBackfill(w.ctx, w.produceCtx, w.bf, w.txn); err != nil {
			return err
		}
	}
	if w.rows {
		p.b.note(w.xid, w.txnFinal)
	}
	p.history.committed(w.id(), end, (w.rows || w.msgs) && !w.skip)
	p.tracker.Commit(w.txn, end)
	w.recordRepair(w.txn, end)
	p.b.end(end)
	w.commits.Add(end, w.commitTime)
	w.dispatched, w.decoded = max(w.dispatched, end), max(w.decoded, end)
	p.b.decoded(end)
	w.bf.passed(w.dispatched)
	p.prog.at.Store(uint64(end))
	w.txn = nil
	return nil
}

func (w *processor) relation(r *decode.RelationInfo) error {
	if !r.Outbox || r.Invalid == "" {
		return nil
	}
	// A table that lacks a mapped column now is a schema problem and
	// blocks; one that lacked it only when this transaction was written
	// (fixed since, as the start-up check found) leaves rows that can never
	// be mapped: those are dead-lettered.
	if t := r.Table; t >= len(w.pl.schemaFrom) || w.txnFinal >= w.pl.schemaFrom[t] {
		return schemaError(r.Invalid)
	}
	w.p.log.Error("rows written while the outbox table lacked a mapped column go to the dead-letter topic",
		"table", r.Namespace+"."+r.Name, "problem", r.Invalid)
	return nil
}

// redecodedEvent stops the run at an event of a transaction decoded again
// that is not known to have been published (history.redecoded).
func (w *processor) redecodedEvent() error {
	switch w.again {
	case unknown:
		return diverged(w.id(), w.p.history.redo)
	case forgotten:
		return behind(w.id(), w.p.history.forgot)
	}
	return nil
}

// id is the open transaction's identity.
func (w *processor) id() txnID { return txnID{final: w.txnFinal, xid: w.xid, commit: w.commitTime} }

func (w *processor) message(m *replication.Message, msg *decode.Message) error {
	if msg.Prefix == replication.MarkPrefix {
		if id, ok := replication.ParseMark(msg.Content, w.p.cfg.Source.Slot); ok && msg.Transactional && w.txn != nil {
			w.p.history.mark(id)
		}
		return nil // another slot's marks too
	}
	if msg.Prefix == replication.HeartbeatPrefix {
		return nil // the heartbeat only moves the WAL
	}
	if !w.publishable(msg) {
		return nil // heartbeats and other applications' messages
	}
	if w.txn == nil {
		return fmt.Errorf("transactional message at %v outside a transaction", m.WALStart)
	}
	w.msgs = true
	if err := w.redecodedEvent(); err != nil {
		return err
	}
	if w.skip {
		return nil
	}
	ev := decode.ParseMessage(msg.Content)
	src := router.Source{Commit: w.commitTime, Xid: w.xid, LSN: msg.LSN}
	return w.publish(w.produceCtx, w.txn, src, &ev, msg.Content, &w.rec)
}

// publish routes one event and hands it to the producer.
func (w *processor) publish(ctx context.Context, txn *offsets.Txn, src router.Source, ev *decode.Event, msg []byte, rec *router.Record) error {
	p := w.p
	d := deliveries.Get().(*delivery)
	*d = delivery{p: p, txn: txn, commit: src.Commit, m: w.tables[ev.Table]}
	r := w.routers[ev.Table]
	if reason := r.RouteFrom(ev, src, rec); reason != "" {
		r.DeadLetter(ev, src.Commit, reason, rec)
		d.reason, d.id = reason, string(ev.ID.Bytes)
	} else if reason, err := w.contracts.check(w.contractCtx(ctx), r, ev, src.Commit, rec); err != nil || reason != "" {
		if err != nil {
			*d = delivery{}
			deliveries.Put(d)
			return err // stopped while waiting for the registry, or contracts' fail
		}
		d.reason, d.id = reason, string(ev.ID.Bytes)
	}
	rec.Topic = p.plan.topicPrefix + rec.Topic
	if held, err := p.b.inKafka(ctx, rec, src.Commit); err != nil || held {
		*d = delivery{}
		deliveries.Put(d)
		return err // held: published before, not again (readback.go)
	}
	// The record must outlive this message's decoding: slices outside msg
	// (bytea values decoded into the decoder's buffer) are copied.
	rec.Key = own(rec.Key, msg)
	rec.Value = own(rec.Value, msg)
	for i := range rec.Headers {
		rec.Headers[i].Value = own(rec.Headers[i].Value, msg)
	}
	if p.cfg.Tracer != nil {
		d.endSpan = p.cfg.Tracer.Start(src.Commit, rec)
	}
	p.tracker.Add(txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
	return p.out.Produce(ctx, rec, d)
}

// own returns b if it lies inside buf, else a copy of it.
func own(b, buf []byte) []byte {
	if len(b) == 0 || len(buf) == 0 {
		return b
	}
	p, s := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if p >= s && p+uintptr(len(b)) <= s+uintptr(len(buf)) {
		return b
	}
	return append([]byte(nil), b...)
}

// delivery is one event's state while it is in flight.
type delivery struct {
	p      *Pipeline
	txn    *offsets.Txn
	commit time.Time
	m      metrics.TableEvents // of the event's outbox table
	reason string              // set when the router dead-lettered it
	id     string
	// endSpan ends the event's span (Config.Tracer); nil without one.
	endSpan func(sink.Outcome)
}

// Deliveries are recycled: one per event otherwise, and the sink reports
// each outcome once (its record's guard), after which d is not used.
var deliveries = sync.Pool{New: func() any { return new(delivery) }}

// Delivered runs on a franz-go goroutine.
func (d *delivery) Delivered(o sink.Outcome) {
	p := d.p
	defer func() {
		*d = delivery{}
		deliveries.Put(d)
	}()
	if d.endSpan != nil {
		d.endSpan(o)
	}
	if o.Err != nil {
		if sink.Classify(o.Err) != sink.ClassShutdown {
			p.fail(&deliveryError{o.Err})
		}
		// Not acknowledged: the watermark stays before this transaction.
		return
	}
	now := time.Now()
	switch {
	case o.DeadLettered:
		d.m.DeadLettered.Inc()
		if d.reason != "" {
			p.log.Warn("event dead-lettered", "id", d.id, "reason", d.reason, "topic", p.cfg.Routes.DLQTopic)
		}
	case o.Parked:
		d.m.Parked.Inc()
	default:
		d.m.Published.Inc()
		d.m.CommitToAck.Observe(now.Sub(d.commit).Seconds())
	}
	p.m.EventAcked(now)
	p.prog.events.Add(1)
	p.tracker.Ack(d.txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
}

// deliveryError is a record that could be delivered neither to its topic nor
// to the dead-letter topic.
type deliveryError struct{ err error }

func (e *deliveryError) Error() string { return "deliver event: " + e.err.Error() }
func (e *deliveryError) Unwrap() error { return e.err }

// recordRepair records the repair with the gap (repair.committed) when txn,
// ending at end, is its transaction: before the hand-over, so that no save
// between the two records a gap found meanwhile without it. A hand-over
// the freeze then refuses leaves a record whose end Kafka never reaches in
// this run: the next start reads the gap again.
func (w *processor) recordRepair(txn *offsets.Txn, end lsn.LSN) {
	if w.bf.handedOver(txn) {
		w.p.rep.committed(end, w.bf.clearAt, w.bf.read, w.bf.publishedAny)
	}
}
