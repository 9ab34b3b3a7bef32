package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
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

// Quarantined lists the quarantined aggregates, in no particular order (for
// the tests until redrive reads them).
func (s *Sink) Quarantined() []quarantine.Quarantine {
	if s.q == nil {
		return []quarantine.Quarantine{}
	}
	return s.q.Quarantined()
}

// Holding reports whether key's new records wait: its quarantine is being
// saved or redriven.
func (s *Sink) Holding(key string) bool { return s.q != nil && s.q.Holding(key) }

// Client exposes the underlying client to tests that need admin or consume
// access to the same cluster.
func (s *Sink) Client() *kgo.Client { return s.cl }
