package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// The set of a transactional producer (kafka.delivery exactly_once). Its
// membership changes only with a commit: a quarantine is added once the
// Kafka transaction holding its dead letter, its state record and the
// records parked after it has committed (Saved), and lifted once the one
// holding the redrive's records and its tombstone has (redriveTxn). The
// producer decides, at every attempt, from the committed set and what the
// attempt itself begins: an aborted attempt leaves nothing to undo, and a
// crash can neither park an event twice nor lose one.

// Transactor is the transactional producer, as the set writes through it.
type Transactor interface {
	// Transact runs build under the producer's commit lock, so that no
	// transaction of events commits between build's reads and the commit,
	// then produces what build returns in one Kafka transaction with the
	// producer's position, and calls its Committed before any later
	// transaction begins. An error of build is returned as is.
	Transact(ctx context.Context, build func(context.Context) (*Write, error)) error
}

// Write is what a Kafka transaction of the set holds: Records to their
// topics, in order, then State on the state topic.
type Write struct {
	Records []*kgo.Record
	State   *kgo.Record
	// Committed is called, under the producer's commit lock, with State's
	// offset once the transaction committed.
	Committed func(offset int64)
}

// RefusedError is a record of a Write the broker refused for itself (too
// large, say): the transaction is aborted and nothing of it is visible.
type RefusedError struct {
	Record *kgo.Record
	Err    error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("republish event %s to %s: %v", kafka.Header(e.Record, wire.HeaderID), e.Record.Topic, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// transactional reports whether the set writes through a Transactor.
func (s *Set) transactional() bool { return s.tx != nil }

// Lookup returns the id of the event whose dead letter began key's
// quarantine, as committed: the producer parks key's records under it.
func (s *Set) Lookup(key string) (firstID string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.quarantined[key]
	if q == nil {
		return "", false
	}
	return q.FirstID, true
}

// Room refuses key's quarantine past dlq.max_quarantined, counting begun
// quarantines an attempt began before it: dropping the rule silently would
// break order.
func (s *Set) Room(key string, begun int) error {
	s.mu.Lock()
	n := len(s.quarantined) + begun
	s.mu.Unlock()
	if n >= s.maxQuarantined {
		return fmt.Errorf("cannot quarantine aggregate %q: %d aggregates are quarantined already (dlq.max_quarantined); redrive or skip some, or raise the bound", key, n)
	}
	return nil
}

// Began is a quarantine a transaction begins: its dead letter is dl, sent
// in the same transaction (its partition and offset are known once it is
// acknowledged).
type Began struct {
	Quarantine
	start   map[int32]int64
	topicID string
}

// BeginTxn makes the quarantine dl's key enters as dl, the dead letter of the
// event meant for topic, is sent for reason. Where the parking partitions
// end now is where its records begin: call it before the transaction that
// parks them begins.
func (s *Set) BeginTxn(ctx context.Context, dl *kgo.Record, topic, reason string) (*Began, error) {
	id := kafka.Header(dl, wire.HeaderID)
	if id == "" {
		id = string(dl.Key)
	}
	rec := &StateRecord{}
	if err := s.parkingStart(ctx, rec); err != nil {
		return nil, err
	}
	return &Began{Quarantine: Quarantine{Key: string(dl.Key), FirstID: id, Reason: reason, Topic: topic, Since: time.Now()},
		start: rec.ParkingStart, topicID: rec.ParkingTopicID}, nil
}

// Record is b's state record, once its dead letter dl was acknowledged
// (with its partition and offset), for the transaction that began it.
func (s *Set) Record(b *Began, dl *kgo.Record) (*StateRecord, *kgo.Record, error) {
	rec := &StateRecord{State: StateQuarantined, Quarantine: b.Quarantine, DLQPartition: dl.Partition, DLQOffset: dl.Offset,
		ParkingStart: b.start, ParkingTopicID: b.topicID}
	kr, err := s.stateRecord(rec.Key, rec)
	return rec, kr, err
}

// Saved adds rec's quarantine, whose state record committed at offset.
// The producer calls it under its commit lock, before it plans again.
func (s *Set) Saved(rec *StateRecord, offset int64) {
	s.mu.Lock()
	q := s.quarantined[rec.Key]
	if q == nil {
		q = &quarantined{}
		s.quarantined[rec.Key] = q
	}
	// Over one another writer began meanwhile (verify --repair): this
	// state record is the later one on the topic.
	q.Quarantine, q.state, q.stateAt = rec.Quarantine, rec, offset
	n := len(s.quarantined)
	s.mu.Unlock()
	s.reportQuarantines("", n)
}

// Parked makes kr a record parked for the quarantine that began with
// event first: the quarantine and its own topic in front of its headers,
// bound for the parking topic; the key chooses the partition, as in the
// dead-letter topic. Unpark undoes it.
func Parked(kr *kgo.Record, first, parking string) {
	h := make([]kgo.RecordHeader, 0, len(kr.Headers)+2)
	h = append(h, kgo.RecordHeader{Key: Header, Value: []byte(first)},
		kgo.RecordHeader{Key: wire.HeaderTopic, Value: []byte(kr.Topic)})
	kr.Headers = append(h, kr.Headers...)
	kr.Topic = parking
	kr.Partition = -1
}

// ParkingTopic is the topic the set parks on.
func (s *Set) ParkingTopic() string { return s.parking }

// stateRecord is the state topic's record of rec for agg (nil rec: a
// tombstone).
func (s *Set) stateRecord(agg string, rec *StateRecord) (*kgo.Record, error) {
	r := &kgo.Record{Topic: s.state.name, Key: []byte(s.state.key(agg)), Partition: -1}
	if rec != nil {
		v, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		r.Value = v
	}
	return r, nil
}

// writeStateTxn is writeState through the Transactor: rec (nil: a
// tombstone) alone in a Kafka transaction.
func (s *Set) writeStateTxn(ctx context.Context, agg string, rec *StateRecord) (int64, error) {
	var at int64
	err := s.tx.Transact(ctx, func(context.Context) (*Write, error) {
		kr, err := s.stateRecord(agg, rec)
		if err != nil {
			return nil, err
		}
		return &Write{State: kr, Committed: func(off int64) { at = off }}, nil
	})
	return at, err
}

// redriveTxn is redrive for a transactional producer: under the
// producer's commit lock (Transact's build), so that no quarantine of the
// key begins or parks between the decision and the commit, it answers a
// request for a key not quarantined with a tombstone again, refuses one
// for another quarantine of the key, or reads the dead letter (unless
// skipped) and the parked records and republishes them with the tombstone
// in one Kafka transaction. A refusal leaves the quarantine, with a failure
// record; a stop in between leaves the request for the next start.
func (s *Set) redriveTxn(req *StateRecord) {
	key, skip := req.Key, req.State == StateSkip
	var d redriveDecision
	err := s.tx.Transact(s.ctx, func(ctx context.Context) (*Write, error) {
		d = s.decideRedrive(ctx, req)
		return d.write, d.err
	})
	var refused *RefusedError
	switch {
	case s.ctx.Err() != nil:
		return // the request stays: the next start carries it out again
	case err == nil && d.failure != "":
		s.countRedrive(RedriveFailed)
	case errors.As(err, &refused) || err != nil && !errors.Is(err, errTransact):
		s.mu.Lock()
		q := s.quarantined[key]
		s.mu.Unlock()
		if q != nil && q.state != nil {
			s.refuseRedrive(q, req, err.Error())
		}
	case err != nil:
		s.log.Error("redrive: the Kafka transaction did not commit; trying again", "aggregate", key, "err", err)
		s.state.pending[key] = req // the loop's own map: this runs on it
	case d.lifted:
		s.log.Info("redrive: quarantine lifted", "aggregate", key, "republished", d.republished)
		if skip {
			s.countRedrive(RedriveSkipped)
		} else {
			s.countRedrive(RedriveDone)
		}
	}
}

// redriveReadTimeout bounds a transactional redrive's read, which holds
// the producer's commit lock: the markers of committed transactions follow
// their commit within moments.
const redriveReadTimeout = time.Minute

// redriveDecision is what a redrive writes (write) or why it cannot be
// built (err); failure is the reason of a refusal it writes, lifted that
// it lifts the quarantine.
type redriveDecision struct {
	write       *Write
	err         error
	failure     string
	lifted      bool
	republished int
}

// decideRedrive builds req's write under the producer's commit lock.
func (s *Set) decideRedrive(ctx context.Context, req *StateRecord) redriveDecision {
	key := req.Key
	s.mu.Lock()
	q := s.quarantined[key]
	var rec StateRecord
	if q != nil && q.state != nil {
		rec = *q.state
	}
	s.mu.Unlock()
	if q == nil || q.state == nil {
		// Lifted already (a repeated request): say so again.
		tomb, err := s.stateRecord(key, nil)
		return redriveDecision{write: &Write{State: tomb}, err: err}
	}
	if rec.FirstID != req.FirstID {
		why := fmt.Sprintf("the request was for the quarantine that began with event %s, lifted since; "+
			"the aggregate's quarantine now began with event %s: check outbox-cdc redrive --list, then ask again", req.FirstID, rec.FirstID)
		return s.failureWrite(q, rec, req, why)
	}
	skip := req.State == StateSkip
	s.log.Info("redrive: lifting a quarantine", "aggregate", key, "first_id", req.FirstID, "skip_dead_letter", skip)
	// Every event transaction waits meanwhile; a marker that never comes
	// (a hanging transaction) must not hold them for ever.
	rctx, cancel := context.WithTimeout(ctx, redriveReadTimeout)
	out, err := s.redriveRecords(rctx, &rec, skip)
	cancel()
	switch {
	case ctx.Err() != nil:
		return redriveDecision{err: TransactError(ctx.Err())}
	case errors.Is(err, context.DeadlineExceeded):
		return s.failureWrite(q, rec, req, fmt.Sprintf("reading the dead letter and the parked events took more than %v: "+
			"a transaction on %s or %s has no marker yet (a hanging transaction, docs/operations.md); ask again later", redriveReadTimeout, s.dlq, s.parking))
	case err != nil:
		return s.failureWrite(q, rec, req, err.Error())
	}
	tomb, err := s.stateRecord(key, nil)
	return redriveDecision{lifted: true, republished: len(out), err: err, write: &Write{Records: out, State: tomb,
		Committed: func(at int64) {
			s.mu.Lock()
			delete(s.quarantined, key)
			s.liftedAt[key] = at
			s.mu.Unlock()
		}}}
}

// failureWrite is the answer to req that q, whose state is rec, stays
// quarantined for why (refuseRedrive's record).
func (s *Set) failureWrite(q *quarantined, rec StateRecord, req *StateRecord, why string) redriveDecision {
	s.log.Error("redrive failed; the aggregate stays quarantined", "aggregate", q.Key, "err", why)
	rec.State, rec.Failure, rec.Requested = StateFailed, why, req.Requested
	kr, err := s.stateRecord(q.Key, &rec)
	return redriveDecision{failure: why, err: err, write: &Write{State: kr, Committed: func(at int64) {
		s.mu.Lock()
		q.state, q.stateAt = &rec, at
		s.mu.Unlock()
	}}}
}

// errTransact marks the producer's own failures (ErrTransact wraps it),
// as opposed to the redrive's: the request then stays.
var errTransact = errors.New("kafka transaction")

// TransactError is a Transact that failed for the producer's reasons (not
// committed, fenced, closed): the redrive stays requested.
func TransactError(err error) error { return fmt.Errorf("%w: %w", errTransact, err) }
