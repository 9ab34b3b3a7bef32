package sink

import (
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// newRecord copies rec (which the caller may reuse) into a record: one
// allocation carries the event (kafka.Event) and its state in the sink.
func newRecord(rec *router.Record, dlq string) *record {
	r := &record{}
	r.Init(rec, dlq)
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

// Class is what to do about a produce error (the kernel's classes, for
// the pipeline).
type Class = kafka.Class

// The classes of Classify.
const (
	ClassFatal         = kafka.ClassFatal
	ClassUnpublishable = kafka.ClassUnpublishable
	ClassShutdown      = kafka.ClassShutdown
)

// Classify decides, once, what a produce error means (kafka.Classify).
func Classify(err error) Class { return kafka.Classify(err) }
