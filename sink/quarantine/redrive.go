package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// A redrive is carried out by the connector, the only writer of the key's
// events, so that lifting a quarantine races with nothing: outbox-cdc
// redrive writes a request on the state topic, redriveLoop carries it out
// and answers with a tombstone or a failure record.

// Redrive results, as outbox_cdc_redrives_total counts them.
const (
	RedriveDone    = "redriven"
	RedriveSkipped = "skipped"
	RedriveFailed  = "failed"
)

// redriveLoop follows the state topic until Close: it carries out the
// requests (pending ones first) while this process owns the slot, and
// follows what another process of the slot (an active-standby peer) saves
// and lifts.
func (s *Set) redriveLoop() {
	st := s.state
	prefix := st.source + "/"
	for {
		if st.owns() {
			keys := slices.Sorted(maps.Keys(st.pending))
			for _, k := range keys {
				if !st.owns() {
					break
				}
				req := st.pending[k]
				delete(st.pending, k)
				if s.transactional() {
					s.redriveTxn(req)
				} else {
					s.redrive(req)
				}
			}
		}
		// A bound on the poll, to look at ownership again.
		pctx, cancel := context.WithTimeout(s.ctx, time.Second)
		fs := st.cons.PollFetches(pctx)
		cancel()
		if s.ctx.Err() != nil {
			return
		}
		if err := fetchErr(fs); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			s.log.Error("reading the quarantine topic", "topic", st.name, "err", err)
			backoff.Sleep(s.ctx, time.Second)
			continue
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < st.restoredTo[r.Partition] {
				return // the restore took it in
			}
			if key, ok := strings.CutPrefix(string(r.Key), prefix); ok {
				s.follow(key, r)
			}
		})
	}
}

// follow takes in a state record of this source: a request to carry out,
// or a quarantine another process of the slot saved or lifted.
func (s *Set) follow(key string, r *kgo.Record) {
	st := s.state
	if r.Value == nil {
		delete(st.pending, key)
		if s.transactional() {
			return // the set changes with its own commits only (txn.go)
		}
		s.mu.Lock()
		q := s.quarantined[key]
		lifted := q != nil && q.state != nil && !q.holding && r.Offset > q.stateAt
		if lifted {
			delete(s.quarantined, key)
		}
		n := len(s.quarantined)
		s.mu.Unlock()
		if lifted {
			s.reportQuarantines("", n)
		}
		return
	}
	var rec StateRecord
	if json.Unmarshal(r.Value, &rec) != nil {
		return
	}
	rec.Key = key
	s.mu.Lock()
	// A request adds no quarantine: one for a key not in the set was
	// written for a quarantine lifted since, and is answered as such.
	// A transactional set changes with its own commits: it reads in only
	// a quarantine another writer began (verify --repair, not
	// transactional), and none its redrive lifted since (liftedAt).
	lifted, ok := s.liftedAt[key]
	added := s.quarantined[key] == nil && !rec.Request() && (!ok || r.Offset > lifted) &&
		!(s.transactional() && r.Attrs.IsTransactional())
	if added {
		s.quarantined[key] = &quarantined{Quarantine: rec.Quarantine, state: &rec, stateAt: r.Offset}
	}
	n := len(s.quarantined)
	s.mu.Unlock()
	if added {
		s.reportQuarantines("", n)
	}
	switch p := st.pending[key]; {
	case rec.Request():
		st.pending[key] = &rec
	case rec.State == StateFailed && p != nil && !rec.answers(p):
		// The answer to an earlier request: this one is still to do.
	default:
		delete(st.pending, key)
	}
}

// redrive lifts the quarantine of key as its last state record asks: it
// holds the key's new records, waits for its parked records in flight,
// republishes the dead letter (unless skipped) and the parked records in
// their order to their topics, writes the tombstone and releases the held
// records to their topics. A failure leaves the quarantine in place, with a
// failure record. A stop in between leaves the request for the next start.
func (s *Set) redrive(req *StateRecord) {
	key := req.Key
	s.mu.Lock()
	q := s.quarantined[key]
	if q == nil || q.state == nil {
		s.mu.Unlock()
		if q == nil { // lifted already (a repeated request): say so again
			s.answerLifted(key)
		}
		return
	}
	if first := q.state.FirstID; first != req.FirstID {
		// Written for a quarantine lifted since: its --skip (or its
		// parking start) is not this one's.
		s.mu.Unlock()
		s.refuseRedrive(q, req, fmt.Sprintf("the request was for the quarantine that began with event %s, lifted since; "+
			"the aggregate's quarantine now began with event %s: check outbox-cdc redrive --list, then ask again", req.FirstID, first))
		return
	}
	q.holding = true
	rec := *q.state // where the quarantine's records are, as this connector saved it
	s.mu.Unlock()
	skip := req.State == StateSkip
	s.log.Info("redrive: lifting a quarantine", "aggregate", key, "first_id", rec.FirstID, "skip_dead_letter", skip)
	for q.inflight.Load() > 0 { // parked records before the hold must be on the parking topic
		backoff.Sleep(s.ctx, 10*time.Millisecond)
	}
	n, err := s.republish(s.ctx, &rec, skip)
	if s.ctx.Err() != nil {
		return // the request stays: the next start carries it out again
	}
	if err != nil {
		s.refuseRedrive(q, req, err.Error())
		s.releaseHeld(q, passPark, false)
		return
	}
	if !s.state.owns() { // another process may be parking the key's events now
		s.log.Warn("redrive: the connector lost the slot; the request stays for the one streaming", "aggregate", key)
		s.state.pending[key] = req
		s.releaseHeld(q, passPark, false)
		return
	}
	if _, err := s.writeState(s.ctx, key, nil); err != nil {
		if s.ctx.Err() == nil {
			s.log.Error("redrive: lifting the quarantine; the request stays for the next start", "aggregate", key, "err", err)
			s.releaseHeld(q, passPark, false)
		}
		return
	}
	s.releaseHeld(q, passRelease, true)
	s.log.Info("redrive: quarantine lifted", "aggregate", key, "republished", n)
	if skip {
		s.countRedrive(RedriveSkipped)
	} else {
		s.countRedrive(RedriveDone)
	}
}

// refuseRedrive answers req, a redrive of q that was not carried out, with
// a failure record naming why (and req's time: the answer to that request,
// not to a later one); the quarantine stays as it was.
func (s *Set) refuseRedrive(q *quarantined, req *StateRecord, why string) {
	s.log.Error("redrive failed; the aggregate stays quarantined", "aggregate", q.Key, "err", why)
	s.mu.Lock()
	rec := *q.state
	s.mu.Unlock()
	rec.State, rec.Failure, rec.Requested = StateFailed, why, req.Requested
	if at, err := s.writeState(s.ctx, q.Key, &rec); err != nil {
		s.log.Error("redrive: saving the failure", "aggregate", q.Key, "err", err)
	} else {
		s.mu.Lock()
		q.state, q.stateAt = &rec, at
		s.mu.Unlock()
	}
	s.countRedrive(RedriveFailed)
}

func (s *Set) countRedrive(result string) {
	s.mu.Lock()
	n := len(s.quarantined)
	s.mu.Unlock()
	s.reportQuarantines(result, n)
}

// republish sends the dead letter (unless skip) and the quarantine's
// parked records, first occurrence of each event id, to their topics, one
// at a time: a refused one stops the redrive before anything overtakes it.
func (s *Set) republish(ctx context.Context, rec *StateRecord, skip bool) (int, error) {
	out, err := s.redriveRecords(ctx, rec, skip)
	if err != nil {
		return 0, err
	}
	// A client of its own: the sink's caps each partition's batches at the
	// limit it knew when it first produced there, which the operator may
	// have raised since to make the redrive possible.
	biggest := int32(kafka.DefaultBatchMax)
	for _, r := range out {
		biggest = max(biggest, int32(min(kafka.BatchSize(r)+4, 1<<30)))
	}
	cl, err := kgo.NewClient(s.consumerOpts(kgo.RecordPartitioner(kafka.NewPartitioner()),
		kgo.ProducerBatchMaxBytes(biggest), kgo.ProducerBatchCompression(s.codec), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for i, r := range out {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return i, fmt.Errorf("republish event %s to %s: %w", kafka.Header(r, wire.HeaderID), r.Topic, err)
		}
	}
	return len(out), nil
}

// redriveRecords are the records a redrive republishes: the dead letter
// (unless skip) and the quarantine's parked records, first occurrence of
// each event id, restored to their own topics, in order.
func (s *Set) redriveRecords(ctx context.Context, rec *StateRecord, skip bool) ([]*kgo.Record, error) {
	seen := map[string]bool{rec.FirstID: true} // parked again after a restart: a duplicate
	var out []*kgo.Record
	if !skip {
		dl, err := s.readDeadLetter(ctx, rec)
		if err != nil {
			return nil, err
		}
		if err := s.revalidate(ctx, dl, contractDeadLetter(dl)); err != nil {
			return nil, fmt.Errorf("the dead-lettered %w", err)
		}
		out = append(out, dl)
	}
	parked, err := s.readParked(ctx, rec, skip)
	if err != nil {
		return nil, err
	}
	for _, r := range parked {
		id := kafka.Header(r, wire.HeaderID)
		if id != "" && seen[id] {
			continue
		}
		seen[id] = true
		if err := s.revalidate(ctx, r, false); err != nil {
			return nil, fmt.Errorf("the parked %w (nothing is republished)", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// readDeadLetter reads the quarantine's dead letter and restores the
// event: its own topic, its headers without error and topic.
func (s *Set) readDeadLetter(ctx context.Context, rec *StateRecord) (*kgo.Record, error) {
	from := map[int32]int64{rec.DLQPartition: rec.DLQOffset}
	to := map[int32]int64{rec.DLQPartition: rec.DLQOffset + 1}
	gone, err := deleted(ctx, s.adm, s.dlq, from, to)
	if err != nil {
		return nil, fmt.Errorf("read the dead letter at %s/%d@%d: %w", s.dlq, rec.DLQPartition, rec.DLQOffset, err)
	}
	var dl *kgo.Record
	if gone == nil {
		// Written by a transaction (exactly_once), its marker is past it.
		held := func(r *kgo.Record) bool { return r.Offset == rec.DLQOffset }
		err = s.readRange(ctx, s.dlq, from, to, held, func(r *kgo.Record) {
			if r.Offset == rec.DLQOffset {
				dl = r
			}
		})
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("read the dead letter at %s/%d@%d: %w", s.dlq, rec.DLQPartition, rec.DLQOffset, err)
	case dl == nil || string(dl.Key) != rec.Key:
		return nil, fmt.Errorf("the dead letter at %s/%d@%d is gone (retention?); redrive with --skip", s.dlq, rec.DLQPartition, rec.DLQOffset)
	case kafka.Header(dl, wire.HeaderPayloadOmitted) != "":
		return nil, fmt.Errorf("the dead letter at %s/%d@%d lost its payload (%s): publish event %s yourself, then redrive with --skip",
			s.dlq, rec.DLQPartition, rec.DLQOffset, kafka.Header(dl, wire.HeaderPayloadOmitted), rec.FirstID)
	}
	topic := kafka.Header(dl, wire.HeaderTopic)
	if topic == "" {
		return nil, fmt.Errorf("event %s was dead-lettered by the router (%s), it has no topic to go to: fix the row's event and publish it yourself, then redrive with --skip",
			rec.FirstID, rec.Reason)
	}
	return restored(dl, topic, wire.HeaderError), nil
}

// readParked reads the quarantine's parked records, from where the parking
// partitions ended when it began to where they end now. Records deleted
// from there (retention) refuse the redrive, naming them, unless skip: the
// operator then lifts it without them (and without the dead letter).
func (s *Set) readParked(ctx context.Context, rec *StateRecord, skip bool) ([]*kgo.Record, error) {
	ends, err := s.adm.ListEndOffsets(ctx, s.parking)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", s.parking, err)
	}
	to := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			to[o.Partition] = o.Offset
		}
	})
	from := map[int32]int64{}
	maps.Copy(from, rec.ParkingStart)
	gone, err := deleted(ctx, s.adm, s.parking, from, to)
	if err == nil && rec.ParkingTopicID != "" {
		var id string
		if id, err = topicIDOf(ctx, s.adm, s.parking); err == nil && id != rec.ParkingTopicID {
			// Everything parked before is gone; what is parked since is on
			// the new topic, from its start.
			gone, from = &GoneError{Topic: s.parking, Recreated: true}, map[int32]int64{}
		}
	}
	switch {
	case err != nil:
		return nil, fmt.Errorf("read the parked records on %s: %w", s.parking, err)
	case gone != nil && !skip:
		return nil, fmt.Errorf("%w: the quarantine's events among them cannot be republished; publish those yourself "+
			"(the outbox table has them unless outbox.retention deleted them: a parked event's row counts as delivered), then redrive with --skip to lift the quarantine without them and without the dead letter", gone)
	case gone != nil:
		s.log.Warn("redrive --skip: parked records deleted before the redrive are not republished", "aggregate", rec.Key, "deleted", gone.Error())
		for _, g := range gone.Ranges {
			from[g.Partition] = g.To
		}
	}
	var out []*kgo.Record
	ours := func(r *kgo.Record) bool { return string(r.Key) == rec.Key && kafka.Header(r, Header) == rec.FirstID }
	// A transaction that parked some of them may be committed without its
	// marker written yet (Kafka answers the commit first): read on to it.
	err = s.readRange(ctx, s.parking, from, to, ours, func(r *kgo.Record) {
		if ours(r) {
			out = append(out, restored(r, kafka.Header(r, wire.HeaderTopic), Header))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the parked records on %s: %w", s.parking, err)
	}
	return out, nil
}

// GoneError names records a redrive needs that the topic deleted: each
// partition's log starts past where the read begins, or (Recreated) the
// topic was deleted and created again.
type GoneError struct {
	Topic     string
	Ranges    []GoneRange
	Recreated bool
}

// GoneRange is offsets From to To-1 of Partition, deleted.
type GoneRange struct {
	Partition int32
	From, To  int64
}

func (e *GoneError) Error() string {
	if e.Recreated {
		return fmt.Sprintf("%s was deleted and created again since the quarantine began: the records parked before are gone", e.Topic)
	}
	parts := make([]string, len(e.Ranges))
	for i, g := range e.Ranges {
		parts[i] = fmt.Sprintf("partition %d offsets %d-%d", g.Partition, g.From, g.To-1)
	}
	return fmt.Sprintf("records of %s were deleted (retention.ms?) before this redrive: %s", e.Topic, strings.Join(parts, ", "))
}

// deleted lists, for each partition of topic read from from[p] (0 when
// missing) up to to[p], the offsets below its log start: nil when none.
func deleted(ctx context.Context, adm *kadm.Client, topic string, from, to map[int32]int64) (*GoneError, error) {
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("start offsets of %s: %w", topic, err)
	}
	gone := &GoneError{Topic: topic}
	for _, p := range slices.Sorted(maps.Keys(to)) {
		o, ok := starts.Lookup(topic, p)
		if !ok || o.Err != nil {
			return nil, fmt.Errorf("start offset of %s/%d: %v", topic, p, o.Err)
		}
		if f := from[p]; f < to[p] && o.Offset > f {
			gone.Ranges = append(gone.Ranges, GoneRange{Partition: p, From: f, To: min(o.Offset, to[p])})
		}
	}
	if len(gone.Ranges) == 0 {
		return nil, nil
	}
	return gone, nil
}

// restored is the event r carries with first and topic (the headers put
// in front of it: Route's, or the dead letter's) removed, bound for topic.
func restored(r *kgo.Record, topic, first string) *kgo.Record {
	h := r.Headers
	if len(h) >= 2 && h[0].Key == first && h[1].Key == wire.HeaderTopic {
		h = h[2:]
	}
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: h, Timestamp: r.Timestamp, Partition: -1}
}

// readRange reads topic's partitions from from[p] (0 when missing) up to
// to[p], exclusive, calling fn in offset order for each partition
// (topicread: records deleted before they are read are an error). A
// transaction open at the end that holds a record hold accepts is read on
// to its marker (topicread.Await).
func (s *Set) readRange(ctx context.Context, topic string, from, to map[int32]int64, hold func(*kgo.Record) bool, fn func(*kgo.Record)) error {
	ranges := topicread.Ranges{}
	for p, end := range to {
		ranges.Add(topic, p, topicread.Span{From: from[p], Until: end})
	}
	rd, err := topicread.New(s.consumerOpts()...)
	if err != nil {
		return err
	}
	defer rd.Close()
	return rd.ReadAwaiting(ctx, ranges, topicread.Await{Holds: hold}, func(r *kgo.Record) error {
		fn(r)
		return nil
	})
}

// answerLifted answers a request for a key that is not quarantined (lifted
// already: a repeated request) with a tombstone again.
func (s *Set) answerLifted(key string) {
	if _, err := s.writeState(s.ctx, key, nil); err != nil && s.ctx.Err() == nil {
		s.log.Error("redrive: answering a request for an aggregate that is not quarantined", "aggregate", key, "err", err)
	}
}
