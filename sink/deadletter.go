package sink

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// recordBatchOverhead is the size of a v2 record batch without records
// (Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD, log overhead included).
const recordBatchOverhead = 61

// batchSize is what a broker counts against max.message.bytes for r sent
// alone: the batch header and the record (attributes, timestamp and offset
// deltas of 0, varint-framed key, value and headers). Uncompressed, as
// franz-go caps batches.
func batchSize(r *kgo.Record) int {
	n := 1 + 1 + 1 + // attributes, timestamp delta, offset delta
		kbin.VarintLen(int32(len(r.Key))) + len(r.Key) +
		kbin.VarintLen(int32(len(r.Value))) + len(r.Value) +
		kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		n += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + kbin.VarintLen(int32(n)) + n
}

// deadLetter turns r into its dead-letter copy and produces it: headers
// error (the reason) and topic first, then its own; key, value and
// timestamp as they were. cause is the refusal that led here, if any.
func (s *Sink) deadLetter(r *record, reason string, cause error) {
	if r.parked { // refused by the parking topic: back to the event as it was
		r.Topic, r.parked = r.orig, false
		quarantine.Unpark(&r.Record)
	}
	s.log.Warn("dead-lettering record", "topic", r.Topic, "reason", reason)
	r.ToDeadLetter(s.dlq, reason, cause)
	r.err, r.alone, r.resent, r.seq = nil, false, false, 0
	if err := s.quarantine(r, reason); err != nil {
		r.finish(Outcome{Err: err})
		return
	}
	_ = s.submit(r, false)
}

// ToDeadLetter turns e into its dead-letter copy for dlq: headers error
// (the reason) and topic first, then its own; key, value and timestamp as
// they were. cause is the refusal that led here, if any. Both producers use it.
func (e *Event) ToDeadLetter(dlq, reason string, cause error) {
	h := make([]kgo.RecordHeader, 0, len(e.Headers)+2)
	h = append(h, kgo.RecordHeader{Key: wire.HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: wire.HeaderTopic, Value: []byte(e.Topic)})
	e.Headers = append(h, e.Headers...)
	e.orig, e.Topic = e.Topic, dlq
	e.Partition = -1 // the key chooses, whatever partition the original had
	e.dead, e.reason, e.level = true, reason, 0
	if errors.Is(cause, kerr.InvalidTimestamp) {
		e.Timestamp = time.Now() // the dead-letter topic would refuse it too
	}
	e.size = batchSize(&e.Record)
}

// TooLargeReason is the dead letter's reason for a record over its topic's
// limit, checked before it is sent.
func TooLargeReason(size int, limit int32, topic string) string {
	return fmt.Sprintf("record of %d bytes exceeds max.message.bytes %d of topic %s (%s)",
		size, limit, topic, kerr.MessageTooLarge.Message)
}

// RefusedReason is the dead letter's reason for a record the broker refused
// on its own.
func RefusedReason(topic string, err error) string {
	return fmt.Sprintf("Kafka refused the record for topic %s: %v", topic, err)
}

// tooLarge handles r over t's limit before it is sent: a record is
// dead-lettered, a dead letter made smaller.
func (s *Sink) tooLarge(t *topicState, r *record) {
	why := TooLargeReason(r.size, t.limit.Load(), t.name)
	if !r.dead {
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
	if !r.dead {
		s.deadLetter(r, RefusedReason(r.Topic, r.err), r.err)
		return
	}
	if r.level >= 2 || TopicWide(r.err) {
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
	if r.dead {
		r.finish(Outcome{Err: fmt.Errorf("dead-letter topic %s did not exist for %v (kafka.unknown_topic_timeout): %w",
			t.name, s.unknownTimeout, kerr.UnknownTopicOrPartition)})
		return
	}
	s.mu.Lock()
	diverted := s.divert(r) // an earlier record of its key was dead-lettered
	s.mu.Unlock()
	switch diverted {
	case divertParked:
		_ = s.submit(r, false)
		return
	case divertHeld:
		return
	}
	s.deadLetter(r, fmt.Sprintf("topic %s did not exist for %v (kafka.unknown_topic_timeout): %v",
		t.name, s.unknownTimeout, kerr.UnknownTopicOrPartition), nil)
}

// Shrink makes a dead letter smaller after why (a refusal or the size check):
// first without its payload; then a minimal record that fits any sensible
// limit: the reason, the topic and the event id (cut short), a cut key, no
// other header, and the current time, which the broker cannot find too old.
func (e *Event) Shrink(why string, cause error) {
	if e.level == 0 && !errors.Is(cause, kerr.InvalidTimestamp) {
		e.level = 1
		e.Value = nil
		e.Headers = append(e.Headers, kgo.RecordHeader{Key: wire.HeaderPayloadOmitted, Value: []byte(why)})
		e.size = batchSize(&e.Record)
		return
	}
	e.level = 2
	h := []kgo.RecordHeader{{Key: wire.HeaderError, Value: clip(e.reason, 256)}}
	if e.orig != "" {
		h = append(h, kgo.RecordHeader{Key: wire.HeaderTopic, Value: []byte(e.orig)})
	}
	if id := topicread.Header(&e.Record, wire.HeaderID); id != "" {
		h = append(h, kgo.RecordHeader{Key: wire.HeaderID, Value: clip(id, 64)})
	}
	h = append(h, kgo.RecordHeader{Key: wire.HeaderPayloadOmitted, Value: clip(why, 256)},
		kgo.RecordHeader{Key: wire.HeaderTruncated, Value: []byte("key cut to 64 bytes, other headers dropped")})
	e.Headers = h
	if len(e.Key) > 64 {
		e.Key = e.Key[:64]
	}
	e.Value = nil
	e.Timestamp = time.Now()
	e.size = batchSize(&e.Record)
}

func clip(s string, n int) []byte {
	if len(s) > n {
		s = s[:n]
	}
	return []byte(s)
}
