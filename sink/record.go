package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// Event is one event as both producers hold it (the idempotent sink's
// record embeds it; sink/exactlyonce keeps one per event): the kgo.Record
// with room for the usual headers, and its dead-letter copy once it has one
// (ToDeadLetter, Shrink, deadletter.go).
type Event struct {
	kgo.Record
	hdr [8]kgo.RecordHeader

	size   int    // batchSize: what the broker counts against its limit
	dead   bool   // bound for the dead-letter topic
	reason string // why it is dead-lettered
	orig   string // topic it was meant for ("" for the router's dead letters)
	level  int    // dead-letter copy: 0 whole, 1 without payload, 2 minimal
}

// NewEvent copies rec (which the caller may reuse) into an Event; a record
// for dlq is the router's dead letter, with its error header.
func NewEvent(rec *router.Record, dlq string) *Event {
	e := &Event{}
	e.init(rec, dlq)
	return e
}

// newRecord is NewEvent for the idempotent sink: one allocation carries
// the event and its state in the sink.
func newRecord(rec *router.Record, dlq string) *record {
	r := &record{}
	r.init(rec, dlq)
	return r
}

func (e *Event) init(rec *router.Record, dlq string) {
	e.Topic = rec.Topic
	e.Key = rec.Key
	e.Value = rec.Value
	e.Timestamp = rec.Timestamp
	e.Partition = -1
	if rec.HasPartition {
		e.Partition = rec.Partition
	}
	h := e.hdr[:0]
	for _, x := range rec.Headers {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: x.Value})
	}
	e.Headers = h
	if e.Topic == dlq {
		e.dead, e.reason = true, topicread.Header(&e.Record, wire.HeaderError)
	}
	e.size = batchSize(&e.Record)
}

// DeadLettered reports whether the event is bound for the dead-letter topic.
func (e *Event) DeadLettered() bool { return e.dead }

// Reason says why it is dead-lettered.
func (e *Event) Reason() string { return e.reason }

// Size is what a broker counts against max.message.bytes for it sent alone.
func (e *Event) Size() int { return e.size }

// Minimal reports a dead letter made as small as it gets (Shrink): it is
// sent whatever the limit, and only a refusal of it is fatal.
func (e *Event) Minimal() bool { return e.dead && e.level >= 2 }

// Outcome is the final state of one produced record.
type Outcome struct {
	// DeadLettered is true when the record was delivered to the dead-letter
	// topic instead of its own.
	DeadLettered bool
	// Reason says why it was dead-lettered.
	Reason string
	// Parked is true when the record was delivered to the parking topic
	// because its key is quarantined.
	Parked bool
	// Err is a fatal error: the record was not delivered anywhere and the
	// pipeline must stop without confirming it.
	Err error
}

// Done receives a record's outcome, on a client goroutine. Delivered must
// not block.
type Done interface{ Delivered(Outcome) }

// defaultBatchMax is franz-go's default batch cap, Kafka's default
// max.message.bytes; used while a topic's limit is unknown.
const defaultBatchMax = 1_000_012
