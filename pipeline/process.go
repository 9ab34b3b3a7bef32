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

// process is the processor goroutine: it decodes, routes and produces, in WAL
// order, and tells the tracker where each transaction ends. produceCtx
// governs records handed to the sink; it outlives ctx so a stop drains them.
func (p *Pipeline) process(ctx, produceCtx context.Context, queue <-chan *replication.Batch) error {
	pl := p.plan
	if pl.snapshot != nil {
		if err := p.snapshot(ctx, produceCtx, pl.snapshot); err != nil {
			return err
		}
	}
	dec := decode.NewTablesDecoder(p.mappings(pl.relIDs))
	var (
		txn        *offsets.Txn
		skip       bool // transaction delivered before (below the start)
		commitTime time.Time
		xid        uint32
		txnFinal   lsn.LSN    // commit LSN of the open transaction
		dispatched = pl.start // end of the last transaction fully handed to the sink
		// decoded is where the stream resumes after a reconnect: past the
		// last commit it sent, from its start. Below pl.start (exactly_once
		// streams from the slot, under the position committed to Kafka)
		// transactions are skipped, but decoded: the hold and the repair
		// need them.
		decoded = pl.stream.StartLSN
		rows    bool // the open transaction has outbox rows
		rec     router.Record
		bf      = pl.backfill
	)
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
			m := &b.Msgs[i]
			switch m.Kind {
			case replication.Reset:
				if txn != nil {
					bf.undo(txn)
					p.tracker.Abort(txn)
					p.abortTxn()
					txn = nil
				}
				m.Resume(decoded)
				continue
			case replication.Keepalive:
				if txn != nil {
					continue // only a position between transactions is one
				}
				if bf.idle(m.WALEnd) {
					// The repair alone, committing the keepalive's position.
					t := p.tracker.Begin()
					if err := p.runBackfill(ctx, produceCtx, bf, t); err != nil {
						return err
					}
					p.tracker.Commit(t, m.WALEnd)
					p.endTxn(m.WALEnd)
					p.backfillCommitted(bf, t, m.WALEnd)
					dispatched, decoded = max(dispatched, m.WALEnd), max(decoded, m.WALEnd)
				}
				if p.hold != nil {
					p.hold.decoded(m.WALEnd)
				}
				if pl.stopAt != 0 && m.WALEnd >= pl.stopAt {
					return errReplayDone
				}
				p.tracker.Idle(m.WALEnd)
				continue
			}
			res, err := dec.Decode(m.Data)
			if errors.Is(err, decode.ErrTableRenamed) { // replay: no known OID
				return fmt.Errorf("%w: set outbox.table to the new name (and update the publication), or rename it back; "+
					"rows inserted under the new name were not published", err)
			}
			if err != nil {
				return fmt.Errorf("decode message at %v: %w", m.WALStart, err)
			}
			switch res.Kind {
			case decode.KindBegin:
				if pl.stopAt != 0 && res.Begin.FinalLSN >= pl.stopAt {
					return errReplayDone
				}
				txn = p.tracker.Begin()
				if bf.due(res.Begin.FinalLSN) {
					// The repair's rows first, in this transaction: they were
					// written before it committed.
					if err := p.runBackfill(ctx, produceCtx, bf, txn); err != nil {
						return err
					}
				}
				txnFinal, rows = res.Begin.FinalLSN, false
				// PostgreSQL skips these when streaming starts at the checkpoint;
				// this also covers a reconnect that resumed lower.
				skip = res.Begin.FinalLSN < pl.start
				commitTime, xid = res.Begin.CommitTime, res.Begin.Xid
				p.m.Transactions.Inc()
			case decode.KindCommit:
				if txn == nil {
					return fmt.Errorf("commit at %v without begin", m.WALStart)
				}
				end := res.Commit.EndLSN
				if bf.ends(end) {
					// Its commit record straddles Since: the repair joins it.
					if err := p.runBackfill(ctx, produceCtx, bf, txn); err != nil {
						return err
					}
				}
				if rows && p.hold != nil {
					p.hold.add(xid, txnFinal)
				}
				p.tracker.Commit(txn, end)
				p.endTxn(end)
				p.backfillCommitted(bf, txn, end)
				p.commits.Add(end, commitTime)
				dispatched, decoded = max(dispatched, end), max(decoded, end)
				if p.hold != nil {
					p.hold.decoded(end)
				}
				bf.passed(dispatched)
				p.replayAt.Store(uint64(res.Commit.EndLSN))
				txn = nil
			case decode.KindRelation:
				if res.Relation.Outbox && res.Relation.Invalid != "" {
					// A table that lacks a mapped column now is a schema problem
					// and blocks; one that lacked it only when this transaction was
					// written (fixed since, as the start-up check found) leaves
					// rows that can never be mapped: those are dead-lettered.
					if t := res.Relation.Table; t >= len(pl.schemaFrom) || txnFinal >= pl.schemaFrom[t] {
						return schemaError(res.Relation.Invalid)
					}
					p.log.Error("rows written while the outbox table lacked a mapped column go to the dead-letter topic",
						"table", res.Relation.Namespace+"."+res.Relation.Name, "problem", res.Relation.Invalid)
				}
			case decode.KindEvent:
				if txn == nil {
					return fmt.Errorf("insert at %v outside a transaction", m.WALStart)
				}
				rows = true
				bf.note(&res.Event)
				if skip || bf.delivered(txnFinal, &res.Event) {
					continue // a row the backfill read: only rows, never the transaction's messages
				}
				src := router.Source{Commit: commitTime, Xid: xid, LSN: m.WALStart}
				if err := p.publish(produceCtx, txn, src, &res.Event, m.Data, &rec); err != nil {
					return err
				}
			case decode.KindMessage:
				msg := &res.Message
				if !p.publishable(msg) {
					continue // heartbeats and other applications' messages
				}
				if txn == nil {
					return fmt.Errorf("transactional message at %v outside a transaction", m.WALStart)
				}
				if skip {
					continue
				}
				ev := decode.ParseMessage(msg.Content)
				src := router.Source{Commit: commitTime, Xid: xid, LSN: msg.LSN}
				if err := p.publish(produceCtx, txn, src, &ev, msg.Content, &rec); err != nil {
					return err
				}
			}
		}
	}
}

// publish routes one event and hands it to the producer.
func (p *Pipeline) publish(ctx context.Context, txn *offsets.Txn, src router.Source, ev *decode.Event, msg []byte, rec *router.Record) error {
	d := deliveries.Get().(*delivery)
	*d = delivery{p: p, txn: txn, commit: src.Commit, m: p.tableMetrics[ev.Table]}
	r := p.routers[ev.Table]
	if reason := r.RouteFrom(ev, src, rec); reason != "" {
		r.DeadLetter(ev, src.Commit, reason, rec)
		d.reason, d.id = reason, string(ev.ID.Bytes)
	}
	rec.Topic = p.plan.topicPrefix + rec.Topic
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
	p.replayed.Add(1)
	p.tracker.Ack(d.txn)
	p.m.InFlight.Set(float64(p.tracker.InFlight()))
}

// deliveryError is a record that could be delivered neither to its topic nor
// to the dead-letter topic.
type deliveryError struct{ err error }

func (e *deliveryError) Error() string { return "deliver event: " + e.err.Error() }
func (e *deliveryError) Unwrap() error { return e.err }
