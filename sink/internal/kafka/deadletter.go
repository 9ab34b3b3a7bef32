package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

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
	e.size = BatchSize(&e.Record)
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

// Shrink makes a dead letter smaller after why (a refusal or the size check):
// first without its payload; then a minimal record that fits any sensible
// limit: the reason, the topic and the event id (cut short), a cut key, no
// other header, and the current time, which the broker cannot find too old.
func (e *Event) Shrink(why string, cause error) {
	if e.level == 0 && !errors.Is(cause, kerr.InvalidTimestamp) {
		e.level = 1
		e.Value = nil
		e.Headers = append(e.Headers, kgo.RecordHeader{Key: wire.HeaderPayloadOmitted, Value: []byte(why)})
		e.size = BatchSize(&e.Record)
		return
	}
	e.level = 2
	h := []kgo.RecordHeader{{Key: wire.HeaderError, Value: clip(e.reason, 256)}}
	if e.orig != "" {
		h = append(h, kgo.RecordHeader{Key: wire.HeaderTopic, Value: []byte(e.orig)})
	}
	if id := Header(&e.Record, wire.HeaderID); id != "" {
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
	e.size = BatchSize(&e.Record)
}

func clip(s string, n int) []byte {
	if len(s) > n {
		s = s[:n]
	}
	return []byte(s)
}
