package sink

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// deadLetter turns r into its dead-letter copy and produces it: headers
// error (the reason) and topic first, then its own; key, value and
// timestamp as they were. cause is the refusal that led here, if any.
func (s *Sink) deadLetter(r *record, reason string, cause error) {
	if r.parked { // refused by the parking topic: back to the event as it was
		r.Topic, r.parked = r.Orig(), false
		quarantine.Unpark(&r.Record)
	}
	s.log.Warn("dead-lettering record", "topic", r.Topic, "reason", reason)
	r.ToDeadLetter(s.dlq, reason, cause)
	seq := r.seq // its place in Produce order: the records before it are not parked behind it
	r.err, r.alone, r.resent, r.seq = nil, false, false, 0
	if err := s.quarantine(r, reason, max(seq, 1)); err != nil {
		r.finish(Outcome{Err: err})
		return
	}
	_ = s.submit(r, false)
}

// tooLarge handles r over t's limit before it is sent: a record is
// dead-lettered, a dead letter made smaller.
func (s *Sink) tooLarge(t *topicState, r *record) {
	why := kafka.TooLargeReason(r.Size(), t.limit.Load(), t.name)
	if !r.DeadLettered() {
		s.deadLetter(r, why, nil)
		return
	}
	r.Shrink(why, nil)
	_ = s.submit(r, false)
}

// refusedAlone handles r refused on its own (or for a reason of the whole
// topic): a record is dead-lettered; a dead letter is sent again smaller,
// and its refusal once minimal is fatal, never a silent drop.
func (s *Sink) refusedAlone(t *topicState, r *record) {
	if !r.DeadLettered() {
		s.deadLetter(r, kafka.RefusedReason(r.Topic, r.err), r.err)
		return
	}
	if r.Minimal() || kafka.TopicWide(r.err) {
		r.finish(Outcome{Err: fmt.Errorf("dead-letter topic %s refused the record: %w", s.dlq, r.err)})
		return
	}
	s.log.Warn("dead-letter topic refused the record; sending it smaller", "topic", s.dlq, "err", r.err)
	r.Shrink(r.err.Error(), r.err)
	// Back to the repair, to be sent alone again.
	r.alone = false
	s.mu.Lock()
	t.retry = append(t.retry, r)
	s.mu.Unlock()
}

// missingDeadLetter handles r whose topic did not appear in time.
func (s *Sink) missingDeadLetter(t *topicState, r *record) {
	if r.DeadLettered() {
		r.finish(Outcome{Err: fmt.Errorf("dead-letter topic %s did not exist for %v (kafka.unknown_topic_timeout): %w",
			t.name, s.unknownTimeout, kerr.UnknownTopicOrPartition)})
		return
	}
	s.mu.Lock()
	diverted := s.divert(r) // an earlier record of its key was dead-lettered
	s.mu.Unlock()
	switch diverted {
	case quarantine.Park:
		_ = s.submit(r, false)
		return
	case quarantine.Hold:
		return
	}
	s.deadLetter(r, fmt.Sprintf("topic %s did not exist for %v (kafka.unknown_topic_timeout): %v",
		t.name, s.unknownTimeout, kerr.UnknownTopicOrPartition), nil)
}
