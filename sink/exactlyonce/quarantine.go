package exactlyonce

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// dlq.mode quarantine in exactly_once. Every attempt routes its events
// from the quarantines committed before it (quarantine.Set, changed only
// by commits) and those it begins itself: a dead letter of a key not
// quarantined begins one, a later event of a quarantined key is parked.
// The dead letters, the parked records and the state records of the
// quarantines begun are in the attempt's Kafka transaction, with the
// events around them and the position: an aborted attempt leaves nothing,
// and the set takes the quarantines in only once it committed (settle).

// errFull: dlq.max_quarantined is reached; no attempt can commit without
// breaking order.
var errFull = errors.New("quarantine full")

// quarantines is what one attempt does to the set: the quarantines it
// begins (each with the entry of its dead letter), and a write of the set
// (Transact). Their state records' outcomes are filled in by the attempt.
type quarantines struct {
	began []*quarantine.Began
	dls   []*entry
	saved []*quarantine.StateRecord // the began ones' state records, as sent
	write *quarantine.Write

	at  []int64 // offsets of the state records sent: saved's, then write's
	err error   // the first refusal of a state record
}

// openQuarantine makes the set in dlq.mode quarantine (a parking topic).
func (t *Txn) openQuarantine() error {
	sc := t.cfg.Sink
	if sc.ParkingTopic == "" {
		return nil
	}
	conn, err := sc.ConnOpts()
	if err != nil {
		return err
	}
	codec, err := kafkaopt.CodecFor(sc.Compression)
	if err != nil {
		return err
	}
	qc := sc.QuarantineConfig(append(conn, sc.TestOpts...), codec, t.meta.Replication())
	qc.Tx = t
	t.q = quarantine.New(t.ctx, qc, t.base, t.log)
	return nil
}

// StartQuarantines restores the quarantines saved on the state topic and
// follows it for redrive requests (quarantine.Set.Start); call it after
// Start, which fenced any earlier instance: its open transactions, which
// may hold state records, are ended then. Without quarantine it does
// nothing.
func (t *Txn) StartQuarantines(ctx context.Context) error {
	if t.q == nil {
		return nil
	}
	return t.q.Start(ctx)
}

// route prepares b's events, in order, against the topics they go to in
// this attempt: an event of a quarantined key is parked, a dead letter of
// a key not quarantined yet begins a quarantine (prepare may make one).
// Called with commitMu held, before the transaction begins.
func (t *Txn) route(ctx context.Context, b []*entry) (*quarantines, error) {
	if t.q != nil {
		// Nothing is routed before the saved quarantines are restored
		// (StartQuarantines; retried while Kafka cannot be read).
		select {
		case <-t.q.Ready():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	qs := &quarantines{write: t.write}
	var begun map[string]string // key → the id its quarantine began with, in this attempt
	for _, e := range b {
		e.parked = nil
		first, ok := t.quarantinedKey(e.rec.Key, begun)
		if ok && !e.rec.DeadLettered() {
			if err := t.park(ctx, e, first); err != nil {
				return nil, err
			}
			if e.parked != nil {
				continue
			}
		}
		if err := t.prepare(ctx, e.rec); err != nil {
			return nil, err
		}
		if ok || t.q == nil || !e.rec.DeadLettered() || len(e.rec.Key) == 0 {
			continue
		}
		key := string(e.rec.Key)
		if err := t.q.Room(key, len(qs.began)); err != nil {
			return nil, fmt.Errorf("%w: %w", errFull, err)
		}
		bg, err := t.q.BeginTxn(ctx, &e.rec.Record, e.rec.Orig(), e.rec.Reason())
		if err != nil {
			return nil, err
		}
		if begun == nil {
			begun = map[string]string{}
		}
		begun[key] = bg.FirstID
		qs.began, qs.dls = append(qs.began, bg), append(qs.dls, e)
	}
	return qs, nil
}

// quarantinedKey is the id key's quarantine began with, committed or begun
// in this attempt.
func (t *Txn) quarantinedKey(key []byte, begun map[string]string) (string, bool) {
	if t.q == nil || len(key) == 0 {
		return "", false
	}
	if first, ok := begun[string(key)]; ok {
		return first, true
	}
	return t.q.Lookup(string(key))
}

// park makes e's parked copy for this attempt and prepares it against the
// parking topic. One the parking topic cannot take (missing past
// kafka.unknown_topic_timeout, over its limit) is dead-lettered instead,
// as the idempotent sink does: its key is quarantined already.
func (t *Txn) park(ctx context.Context, e *entry, first string) error {
	p := *e.rec
	quarantine.Parked(&p.Record, first, t.q.ParkingTopic())
	p.Rerouted(e.rec.Topic)
	if err := t.prepare(ctx, &p); err != nil {
		return err
	}
	if !p.DeadLettered() {
		e.parked = &p
		return nil
	}
	t.log.Warn("dead-lettering record", "topic", e.rec.Topic, "reason", p.Reason())
	e.rec.ToDeadLetter(t.cfg.Sink.DLQTopic, p.Reason(), nil)
	return nil
}

// sideRecords produces, after b's events, what the attempt writes to the
// quarantine's topics: a write's records, then the state records of the
// quarantines begun and the write's. A state record names its dead
// letter's offset, so the events are flushed first. Called only when qs has
// something to write.
func (t *Txn) sideRecords(ctx context.Context, cl *kgo.Client, b []*entry, qs *quarantines) error {
	var sent []*kgo.Record
	var errs []error
	if w := qs.write; w != nil {
		sent, errs = make([]*kgo.Record, len(w.Records)), make([]error, len(w.Records))
		for i, r := range w.Records {
			rec := new(kgo.Record)
			*rec = *r // the client writes into it
			sent[i] = rec
			t.noteTopic(rec.Topic, t.txnSeq)
			cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { errs[i] = err })
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if err := t.refusals(b); err != nil {
		return err
	}
	for i, err := range errs {
		switch {
		case err == nil:
		case kafka.Classify(err) == kafka.ClassUnpublishable && !kafka.IsFatalTxn(err):
			return &quarantine.RefusedError{Record: sent[i], Err: err}
		default:
			return fmt.Errorf("republish to %s: %w", sent[i].Topic, err)
		}
	}
	var states []*kgo.Record
	qs.saved = qs.saved[:0]
	for i, bg := range qs.began {
		rec, kr, err := t.q.Record(bg, qs.dls[i].out)
		if err != nil {
			return err
		}
		qs.saved, states = append(qs.saved, rec), append(states, kr)
	}
	if w := qs.write; w != nil && w.State != nil {
		st := new(kgo.Record)
		*st = *w.State
		states = append(states, st)
	}
	qs.at, qs.err = make([]int64, len(states)), nil
	for i, kr := range states {
		t.noteTopic(kr.Topic, t.txnSeq)
		cl.Produce(ctx, kr, func(r *kgo.Record, err error) {
			if err != nil && qs.err == nil {
				qs.err = fmt.Errorf("save the quarantine on %s: %w", r.Topic, err)
			}
			qs.at[i] = r.Offset
		})
	}
	return nil
}

// writes reports whether qs has records for sideRecords.
func (qs *quarantines) writes() bool { return qs != nil && (len(qs.began) > 0 || qs.write != nil) }

// settle gives the set what qs's committed transaction changed. Called
// with commitMu held, before anything is routed again.
func (t *Txn) settle(qs *quarantines) {
	if qs == nil || len(qs.at) == 0 {
		return
	}
	for i, rec := range qs.saved {
		t.q.Saved(rec, qs.at[i])
	}
	if w := qs.write; w != nil && w.Committed != nil {
		w.Committed(qs.at[len(qs.at)-1])
	}
}

// Transact commits a write of the quarantine set (quarantine.Transactor)
// in a Kafka transaction of its own, with the last position committed
// again: build runs under commitMu, after an unconfirmed commit is
// settled, so what it reads of the parking topic is all the key has there.
// A record the broker refuses is a quarantine.RefusedError; the
// producer's own failures are quarantine.TransactError.
func (t *Txn) Transact(ctx context.Context, build func(context.Context) (*quarantine.Write, error)) error {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	if err := t.ctx.Err(); err != nil {
		return quarantine.TransactError(err) // closed
	}
	if t.fatal != nil {
		return quarantine.TransactError(t.fatal)
	}
	if t.unsure != nil {
		if err := t.tryAlone(ctx, t.unsure.end); err != nil {
			return quarantine.TransactError(err)
		}
	}
	w, err := build(ctx)
	if err != nil {
		return err
	}
	if err := t.freshLimits(ctx, w.Records); err != nil {
		return quarantine.TransactError(err)
	}
	t.write = w
	defer func() { t.write = nil }()
	err = t.commitWrite(ctx, len(w.Records))
	var refused *quarantine.RefusedError
	if errors.As(err, &refused) && (errors.Is(refused.Err, kerr.MessageTooLarge) || errors.Is(refused.Err, kerr.RecordListTooLarge)) {
		// franz-go caps a partition's batches at the limit read when it
		// first produced there; the operator may have raised it since, to
		// make this redrive possible. A new client reads it again.
		if _, err := t.claim(ctx); err != nil {
			if fatal(err) {
				t.setFatal(err)
			}
			return quarantine.TransactError(err)
		}
		err = t.commitWrite(ctx, len(w.Records))
	}
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused) || errors.Is(err, errWriteTooLong):
		return err
	}
	return quarantine.TransactError(err)
}

// errWriteTooLong: a write's Kafka transaction outlasted the transaction
// timeout; done again it would again.
var errWriteTooLong = errors.New("the Kafka transaction outlasted kafka.transaction_timeout")

// commitWrite commits t.write alone at the last position. A transaction
// the coordinator aborted for its age is told from a takeover as commit's
// are (afterTimeout), and not tried again: the write is as large the next
// time. Called with commitMu held.
func (t *Txn) commitWrite(ctx context.Context, records int) error {
	var b []*entry
	pos := lsn.LSN(t.committed.Load())
	done, err := t.try(ctx, &b, pos)
	if !done && err != nil && t.timedOut(err) {
		if done, err = t.afterTimeout(ctx, &b, &pos, nil); err == nil && !done {
			return fmt.Errorf("%w (%v) with %d records: raise it, up to the broker's transaction.max.timeout.ms, and ask again",
				errWriteTooLong, t.cfg.TransactionTimeout, records)
		}
	}
	if err != nil && fatal(err) {
		t.setFatal(err)
	}
	if !done && err == nil {
		err = errors.New("not committed")
	}
	return err
}

// tryAlone is one try without events at pos (the probe's): an unconfirmed
// commit is settled first, and what it held that did not commit goes back
// to the front of what waits. Called with commitMu held.
func (t *Txn) tryAlone(ctx context.Context, pos lsn.LSN) error {
	var b []*entry
	done, err := t.try(ctx, &b, pos)
	if err != nil && fatal(err) {
		t.setFatal(err)
	}
	if len(b) > 0 {
		t.mu.Lock()
		t.batch = append(b, t.batch...)
		t.mu.Unlock()
	}
	if !done && err == nil {
		err = errors.New("an unconfirmed commit's events are produced again first")
	}
	return err
}

// freshLimits reads again the limits of the topics recs go to: the
// operator may have raised one to make a redrive possible.
func (t *Txn) freshLimits(ctx context.Context, recs []*kgo.Record) error {
	read := map[string]bool{}
	for _, r := range recs {
		if read[r.Topic] {
			continue
		}
		read[r.Topic] = true
		if tp := t.topics[r.Topic]; tp != nil {
			tp.stale = true
		}
		if _, err := t.lookup(ctx, r.Topic); err != nil {
			return err
		}
	}
	return nil
}
