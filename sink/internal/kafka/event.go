package kafka

import (
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Event is one event as both producers hold it (the idempotent sink's
// record embeds it; sink/exactlyonce keeps one per event): the kgo.Record
// with room for the usual headers, and its dead-letter copy once it has one
// (ToDeadLetter, Shrink, deadletter.go).
type Event struct {
	kgo.Record
	hdr [8]kgo.RecordHeader

	size   int    // BatchSize: what the broker counts against its limit
	dead   bool   // bound for the dead-letter topic
	reason string // why it is dead-lettered
	orig   string // topic it was meant for ("" for the router's dead letters but a contract's)
	level  int    // dead-letter copy: 0 whole, 1 without payload, 2 minimal
}

// NewEvent copies rec (which the caller may reuse) into an Event; a record
// for dlq is the router's dead letter, with its error header.
func NewEvent(rec *router.Record, dlq string) *Event {
	e := &Event{}
	e.Init(rec, dlq)
	return e
}

// Init is NewEvent for an Event embedded in a producer's record: one
// allocation carries the event and its state in the producer.
func (e *Event) Init(rec *router.Record, dlq string) {
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
		e.dead, e.reason = true, Header(&e.Record, wire.HeaderError)
		if len(h) > 1 && h[0].Key == wire.HeaderError && h[1].Key == wire.HeaderTopic {
			e.orig = string(h[1].Value) // a contract dead letter names its topic
		}
	}
	e.size = BatchSize(&e.Record)
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

// Orig is the topic it was meant for, once it goes elsewhere (a dead
// letter, a parked record); "" for the router's dead letters.
func (e *Event) Orig() string { return e.orig }

// Rerouted records that the event now goes to another topic than orig
// (the parking topic, with headers in front) and sizes it again.
func (e *Event) Rerouted(orig string) {
	e.orig = orig
	e.size = BatchSize(&e.Record)
}

// recordBatchOverhead is the size of a v2 record batch without records
// (Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD, log overhead included).
const recordBatchOverhead = 61

// BatchSize is what a broker counts against max.message.bytes for r sent
// alone: the batch header and the record (attributes, timestamp and offset
// deltas of 0, varint-framed key, value and headers). Uncompressed, as
// franz-go caps batches.
func BatchSize(r *kgo.Record) int {
	n := 1 + 1 + 1 + // attributes, timestamp delta, offset delta
		kbin.VarintLen(int32(len(r.Key))) + len(r.Key) +
		kbin.VarintLen(int32(len(r.Value))) + len(r.Value) +
		kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		n += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + kbin.VarintLen(int32(n)) + n
}

// DefaultBatchMax is franz-go's default batch cap, Kafka's default
// max.message.bytes; used while a topic's limit is unknown.
const DefaultBatchMax = 1_000_012

// BatchCap is the batch cap for a topic limit (0: unknown): both
// producers' ProducerBatchMaxBytesFn. franz-go counts a batch with a
// length prefix the broker does not count: 4 bytes until it knows the
// produce version, a uvarint (1 to 3 bytes here) after. Allowing 4 lets
// every record that passed the size check through; the rare batch that
// ends up 1 to 3 bytes over is refused and repaired, which beats
// dead-lettering a record that fits.
func BatchCap(limit int32) int32 {
	if limit <= 0 {
		return DefaultBatchMax
	}
	return min(max(limit+4, 512), 1<<30)
}
