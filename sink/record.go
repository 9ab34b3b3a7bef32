package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// newRecord copies rec (which the caller may reuse) into a record; a record
// for dlq is the router's dead letter, with its error header.
func newRecord(rec *router.Record, dlq string) *record {
	r := &record{}
	r.Topic = rec.Topic
	r.Key = rec.Key
	r.Value = rec.Value
	r.Timestamp = rec.Timestamp
	r.Partition = -1
	if rec.HasPartition {
		r.Partition = rec.Partition
	}
	h := r.hdr[:0]
	for _, x := range rec.Headers {
		h = append(h, kgo.RecordHeader{Key: x.Key, Value: x.Value})
	}
	r.Headers = h
	if r.Topic == dlq {
		r.dead, r.reason = true, headerValue(&r.Record, wire.HeaderError)
	}
	r.size = batchSize(&r.Record)
	return r
}

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
