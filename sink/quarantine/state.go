package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// The quarantine state topic (kafka.quarantine_topic) is compacted, keyed
// by Source + "/" + aggregate key. Its last record for a key is
// the quarantine as saved (StateQuarantined), an operator's request, or a
// failed redrive; a tombstone lifts it. The dead letter that starts a
// quarantine gets its outcome only once the record is acknowledged, so
// neither the slot nor the checkpoint passes an event whose quarantine
// could be lost (docs/architecture.md, "Ordering in the failure path").

// Quarantine states on the state topic.
const (
	StateQuarantined = "quarantined"
	StateRedrive     = "redrive_requested"
	StateSkip        = "skip_requested"
	StateFailed      = "failed" // a redrive failed; the quarantine stays
)

// StateRecord is a state topic record's value.
type StateRecord struct {
	State string `json:"state"`
	Quarantine
	// Where the dead letter sits, and where each parking partition ended
	// when the quarantine began: a redrive reads from there, never a whole
	// topic.
	DLQPartition int32           `json:"dlq_partition"`
	DLQOffset    int64           `json:"dlq_offset"`
	ParkingStart map[int32]int64 `json:"parking_start"`
	// ParkingTopicID is the parking topic's id then ("" if it did not exist
	// yet): one deleted and created again since holds none of the records.
	ParkingTopicID string     `json:"parking_topic_id,omitempty"`
	Requested      *time.Time `json:"requested,omitempty"`
	Failure        string     `json:"failure,omitempty"`
}

// Request reports whether r asks for a redrive (or a skip).
func (r *StateRecord) Request() bool { return r.State == StateRedrive || r.State == StateSkip }

// answers reports whether r, a failed redrive, answers req: the connector
// copies the request's time into its answer (an answer without one, from an
// older version, answers any).
func (r *StateRecord) answers(req *StateRecord) bool {
	return r.Requested == nil || req.Requested == nil || r.Requested.Equal(*req.Requested)
}

// Source is the state topic's key prefix of one connector: the cluster,
// database and slot, as offsets.Identity names them (several connectors
// may share the topic).
func Source(systemID, database, slot string) string {
	return kafka.SourceKey(systemID, database, slot)
}

// NotCompactedError is a state topic that would delete quarantines.
type NotCompactedError struct{ Topic, Policy string }

func (e *NotCompactedError) Error() string {
	return fmt.Sprintf("quarantine topic %s has cleanup.policy %q, not compact", e.Topic, e.Policy)
}

// stateTopic is the set's side of the state topic.
type stateTopic struct {
	name, source string
	cons         *kgo.Client             // follows the topic (redriveLoop)
	restoredTo   map[int32]int64         // per partition, the end the restore read to
	pending      map[string]*StateRecord // requests not carried out yet, by key; the loop's
	owner        func() bool             // nil: always
}

// owns reports whether this process may carry out requests now.
func (st *stateTopic) owns() bool { return st.owner == nil || st.owner() }

func (st *stateTopic) key(agg string) string { return st.source + "/" + agg }

// consumerOpts are the options of the set's own clients: the producer's
// cluster and security, nothing about producing.
func (s *Set) consumerOpts(extra ...kgo.Opt) []kgo.Opt {
	return append(append(append([]kgo.Opt{}, s.connOpts...), kgo.WithLogger(kgo.BasicLogger(discard{}, kgo.LogLevelNone, nil))), extra...)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Start creates or checks the state topic, restores this connector's
// quarantines from it and starts following it for redrive requests (until
// the producer closes). Call it before the first Produce; without a state
// topic it does nothing.
//
// No record reaches the client before the set is restored (rule c): the
// producer's topic workers wait for it (Ready). A Kafka that cannot be
// used yet (down, credentials not valid yet) does not stop the start, as
// it does not stop the producer: records wait, in order, while the
// restore is retried. A topic that is not compacted is an error, at once
// when Kafka answers now, else through Config.Fail.
func (s *Set) Start(ctx context.Context) error {
	st := s.state
	if st == nil {
		return nil
	}
	s.started.Store(true)
	first, cancel := context.WithTimeout(ctx, 10*time.Second)
	latest, err := s.readStateTopic(first)
	cancel()
	var nc *NotCompactedError
	switch {
	case err == nil:
		s.restore(latest)
		return nil
	case errors.As(err, &nc) || ctx.Err() != nil:
		return err
	}
	s.log.Warn("kafka: cannot read the quarantine topic yet; records wait until the quarantined aggregates are restored",
		"topic", st.name, "err", err)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.restoreLater()
	}()
	return nil
}

// readStateTopic creates or checks the state topic and reads it to its end
// from the start: an attempt that failed may have read part of the topic.
// On success it makes the consumer redriveLoop follows the topic with; it
// passes over what the read took in (restoredTo).
func (s *Set) readStateTopic(ctx context.Context) (map[string]stateAt, error) {
	if err := s.ensureStateTopic(ctx); err != nil {
		return nil, err
	}
	st := s.state
	latest, ends, err := readState(ctx, s.consumerOpts(), st.name, st.source)
	if err != nil {
		return nil, err
	}
	// The whole topic, partitions added later too; the restored part is
	// small (a record per key).
	// Committed records only: a transactional producer's aborted attempts
	// wrote some too (txn.go).
	cons, err := kgo.NewClient(s.consumerOpts(kgo.ConsumeTopics(st.name), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return nil, fmt.Errorf("quarantine topic consumer: %w", err)
	}
	st.cons, st.restoredTo = cons, ends // closed by Close, after the restore and the loop
	return latest, nil
}

// restoreLater retries the restore until it succeeds or the producer closes;
// a topic that is not compacted is reported to Config.Fail and the records
// keep waiting (the pipeline stops).
func (s *Set) restoreLater() {
	for attempt := 1; ; attempt++ {
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(backoff.Nth(time.Second, 10*time.Second, attempt-1)):
		}
		latest, err := s.readStateTopic(s.ctx)
		var nc *NotCompactedError
		switch {
		case err == nil:
			s.restore(latest)
			return
		case s.ctx.Err() != nil:
			return
		case errors.As(err, &nc):
			s.log.Error("kafka: the quarantine topic is not compacted; records are held", "topic", s.state.name, "err", err)
			if s.fail != nil {
				s.fail(err)
			}
			return
		case attempt%10 == 0:
			s.log.Warn("kafka: still cannot read the quarantine topic; records wait", "topic", s.state.name, "attempts", attempt, "err", err)
		}
	}
}

// restore installs the quarantines read from the state topic, lets the
// producer hand records over (Ready), and starts following the topic.
func (s *Set) restore(latest map[string]stateAt) {
	st := s.state
	s.mu.Lock()
	for _, l := range latest {
		rec := l.rec
		if !l.stale {
			s.quarantined[rec.Key] = &quarantined{Quarantine: rec.Quarantine, state: rec, stateAt: l.offset}
		}
		if rec.Request() {
			st.pending[rec.Key] = rec // a stale one is answered as lifted
		}
	}
	n := len(s.quarantined)
	s.mu.Unlock()
	close(s.restored)
	if n > 0 {
		s.log.Info("restored quarantined aggregates; their events are parked", "topic", st.name, "quarantined", n, "redrives_pending", len(st.pending))
	}
	s.reportQuarantines("", n)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.redriveLoop()
	}()
}

// ensureStateTopic creates the state topic compacted, or checks it is.
func (s *Set) ensureStateTopic(ctx context.Context) error {
	name := s.state.name
	// One partition: a handful of records, each key's in one order.
	got, err := kafka.EnsureTopic(ctx, s.adm, kafka.TopicSpec{Name: name, Label: "quarantine topic " + name,
		Partitions: 1, Replication: s.replication, Configs: StateTopicConfigs, KeepLast: true})
	var nk *kafka.NotKeptError
	switch {
	case errors.As(err, &nk):
		return &NotCompactedError{Topic: name, Policy: nk.Policy}
	case err != nil:
		return err
	case got.Found != kafka.Exists:
		s.log.Info("kafka: created the quarantine topic", "topic", name, "cleanup.policy", StateTopicConfigs["cleanup.policy"])
	}
	return nil
}

// StateTopicConfigs are the quarantine state topic's settings, as the set
// and sink.EnsureOwnTopics create it: compacted, and tombstones kept for
// ever (a start reads the topic up to the last offset listed, which would
// never come if a tombstone there were cleaned away; one record per key
// ever quarantined is small).
var StateTopicConfigs = map[string]string{"cleanup.policy": "compact", "delete.retention.ms": "9223372036854775807"}

// stateAt is a state record and its offset.
type stateAt struct {
	rec    *StateRecord
	offset int64
	// stale: a request for a quarantine the log shows lifted (a tombstone
	// after one of its records): written by a redrive command that listed
	// it before the lift. It is answered as lifted, never carried out.
	// Compaction may remove the tombstone; such a request then reads as
	// pending (docs/operations.md, redrive).
	stale bool
}

// readState reads topic to its current end with a reader of its own (opts)
// and returns the last record of each of source's keys, tombstoned keys
// left out, and the end it read each partition to.
func readState(ctx context.Context, opts []kgo.Opt, topic, source string) (map[string]stateAt, map[int32]int64, error) {
	rd, err := topicread.New(opts...)
	if err != nil {
		return nil, nil, err
	}
	defer rd.Close()
	ranges, _, err := rd.Whole(ctx, topic) // a topic not created yet holds none
	if err != nil {
		return nil, nil, fmt.Errorf("quarantine topic %s: %w", topic, err)
	}
	out := map[string]stateAt{}
	lifted := map[string]string{} // key → the first id of its last quarantine tombstoned
	prefix := source + "/"
	err = rd.Read(ctx, ranges, func(r *kgo.Record) error {
		key, ok := strings.CutPrefix(string(r.Key), prefix)
		if !ok {
			return nil
		}
		if r.Value == nil {
			if prev, ok := out[key]; ok {
				lifted[key] = prev.rec.FirstID
			}
			delete(out, key)
			return nil
		}
		var q StateRecord
		if json.Unmarshal(r.Value, &q) != nil {
			return nil // not ours to judge: another version's record
		}
		q.Key = key
		prev, had := out[key]
		stale := q.Request() && (!had && lifted[key] == q.FirstID || had && prev.stale)
		out[key] = stateAt{&q, r.Offset, stale}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read quarantine topic %s: %w", topic, err)
	}
	ends := map[int32]int64{}
	for p, sp := range ranges[topic] {
		ends[p] = sp.Until
	}
	return out, ends, nil
}

// fetchErr is a poll's first error that is not a retriable broker error.
func fetchErr(fs kgo.Fetches) error {
	var err error
	fs.EachError(func(_ string, _ int32, e error) {
		if err == nil && !kerr.IsRetriable(e) {
			err = e
		}
	})
	return err
}

// Save saves the quarantine dead letter r started, then calls deliver to
// report r's outcome, and lets the records of its key held meanwhile go to the
// parking topic. Runs on a goroutine of its own: the producer calls it from
// a promise, which must not block.
func (s *Set) Save(r Record, deliver func()) {
	q, kr := r.Mark().starts, r.Kafka()
	s.mu.Lock()
	rec := &StateRecord{State: StateQuarantined, Quarantine: q.Quarantine, DLQPartition: kr.Partition, DLQOffset: kr.Offset}
	s.mu.Unlock()
	rec.Parked = 0
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var at int64
		err := s.parkingStart(s.ctx, rec)
		if err == nil {
			at, err = s.writeState(s.ctx, rec.Key, rec)
		}
		if err != nil {
			r.Fail(fmt.Errorf("save the quarantine of aggregate %q on %s: %w", rec.Key, s.state.name, err))
			return
		}
		s.mu.Lock()
		q.state, q.stateAt = rec, at
		s.mu.Unlock()
		deliver()
		s.releaseHeld(q, passPark, false)
	}()
}

// parkingStart records where each parking partition ends now: nothing of
// the quarantine is parked yet, its records are held.
func (s *Set) parkingStart(ctx context.Context, rec *StateRecord) error {
	ends, err := s.adm.ListEndOffsets(ctx, s.parking)
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", s.parking, err)
	}
	rec.ParkingStart = map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			rec.ParkingStart[o.Partition] = o.Offset
		}
	})
	// A parking topic not created yet starts at 0, with no id.
	rec.ParkingTopicID, err = topicIDOf(ctx, s.adm, s.parking)
	return err
}

// topicIDOf is topic's id, "" when it does not exist.
func topicIDOf(ctx context.Context, adm *kadm.Client, topic string) (string, error) {
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("metadata of %s: %w", topic, err)
	}
	d, ok := td[topic]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return "", nil
	case d.Err != nil:
		return "", fmt.Errorf("metadata of %s: %w", topic, d.Err)
	}
	return d.ID.String(), nil
}

// writeState produces rec (nil: a tombstone) for agg, waits for its
// acknowledgement and returns its offset.
func (s *Set) writeState(ctx context.Context, agg string, rec *StateRecord) (int64, error) {
	if s.transactional() {
		return s.writeStateTxn(ctx, agg, rec)
	}
	r, err := writeState(ctx, s.cl, s.state.name, s.state.key(agg), rec)
	if err != nil {
		return 0, err
	}
	return r.Offset, nil
}

func writeState(ctx context.Context, cl *kgo.Client, topic, key string, rec *StateRecord) (*kgo.Record, error) {
	r := &kgo.Record{Topic: topic, Key: []byte(key), Partition: -1}
	if rec != nil {
		v, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		r.Value = v
	}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return nil, fmt.Errorf("produce to %s: %w", topic, err)
	}
	return r, nil
}

// releaseHeld hands q's held records on, in order, each passing divert as
// pass says (parked first for passPark: its own topic may be under repair,
// with later records of the key in its retry list); lift then removes q
// from the set. Records arriving meanwhile
// are held and handed on too: none overtakes another.
func (s *Set) releaseHeld(q *quarantined, pass passing, lift bool) {
	for {
		s.mu.Lock()
		held := q.held
		q.held = nil
		if len(held) == 0 {
			q.holding = false
			if lift {
				delete(s.quarantined, q.Key)
			}
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for _, r := range held {
			r.Mark().pass = pass
			r.Resubmit(pass == passPark)
		}
	}
}
