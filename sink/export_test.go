package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// BatchSize is kafka.BatchSize for the tests: what a broker counts against
// max.message.bytes for rec sent alone.
func BatchSize(rec *router.Record) int {
	r := kgo.Record{Key: rec.Key, Value: rec.Value}
	for _, h := range rec.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return kafka.BatchSize(&r)
}

// Client exposes the underlying client to tests that need admin or consume
// access to the same cluster.
func (s *Sink) Client() *kgo.Client { return s.cl }
