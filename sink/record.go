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
