package quarantine

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// Revalidator checks, at a redrive, the records it republishes against
// their event contracts' current schemas (contracts.*; the pipeline
// implements it). Without one (contracts off) a redrive republishes them as
// they are, as the connector publishes every event then.
type Revalidator interface {
	// Revalidate checks value, the record value of an event of eventType
	// meant for topic, against its subject's latest version and returns the
	// value to republish. published: value is what the connector made of
	// the event when it let it through (a parked record, or a dead letter
	// the broker refused); otherwise it is the payload of a contract dead
	// letter, which the connector never published. An error refuses the
	// redrive: its text is the reason.
	Revalidate(ctx context.Context, topic, eventType string, value []byte, published bool) ([]byte, error)
}

// contractDeadLetter removes from dl, a dead letter restored to its topic,
// the contract headers the connector put right after error and topic
// (wire.HeaderContractSubject, then wire.HeaderContractVersion), and reports
// whether it had them: the event was dead-lettered for its contract, and
// its value is its payload.
func contractDeadLetter(dl *kgo.Record) bool {
	h := dl.Headers
	if len(h) == 0 || h[0].Key != wire.HeaderContractSubject {
		return false
	}
	h = h[1:]
	if len(h) > 0 && h[0].Key == wire.HeaderContractVersion {
		h = h[1:]
	}
	dl.Headers = h
	return true
}

// revalidate replaces r's value with the one its contract gives now
// (Revalidator); payload: r is a contract dead letter. A tombstone has no
// contract.
func (s *Set) revalidate(ctx context.Context, r *kgo.Record, payload bool) error {
	if s.contracts == nil || r.Value == nil {
		return nil
	}
	v, err := s.contracts.Revalidate(ctx, r.Topic, kafka.Header(r, wire.HeaderEventType), r.Value, !payload)
	if err != nil {
		return fmt.Errorf("event %s: %w", kafka.Header(r, wire.HeaderID), err)
	}
	r.Value = v
	return nil
}
