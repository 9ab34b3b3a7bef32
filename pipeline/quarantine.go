package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// openSink creates the producer and, in dlq.mode quarantine, restores the
// quarantined aggregates saved on kafka.quarantine_topic before anything
// is produced: replayed events of a quarantined aggregate are parked again.
func (p *Pipeline) openSink(ctx context.Context) (*sink.Sink, error) {
	cfg := p.cfg.Sink
	if p.cfg.Replay != nil {
		// A replay must not take requests meant for the running connector:
		// its quarantines stay in memory.
		cfg.QuarantineTopic = ""
	}
	// The sink is the one source of the quarantined count, in memory too.
	cfg.Redrives = func(result string, quarantined int) {
		if result != "" {
			p.m.Redrives.WithLabelValues(result).Inc()
		}
		p.m.Quarantined.Set(float64(quarantined))
	}
	if cfg.QuarantineTopic != "" && cfg.ParkingTopic != "" {
		srv, err := p.cfg.Source.DB.Identify(ctx)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		cfg.QuarantineSource = sink.QuarantineSource(srv.SystemID, srv.Database, p.cfg.Source.Slot)
		// Requests are carried out only while this process streams from the
		// slot: a standby waiting for it must not lift what the active one parks.
		cfg.Owner = p.Streaming
		// Kafka not usable at start: the restore goes on in the sink, and a
		// topic found not compacted then stops the connector.
		cfg.Fail = func(err error) { p.fail(notCompacted(err)) }
	}
	s, err := sink.New(cfg, p.log)
	if err != nil {
		return nil, err
	}
	if err := s.StartQuarantines(ctx); err != nil {
		s.Close()
		return nil, notCompacted(err)
	}
	return s, nil
}

// notCompacted turns the sink's NotCompactedError into the prerequisite
// error with the fix; other errors get context.
func notCompacted(err error) error {
	var nc *sink.NotCompactedError
	if errors.As(err, &nc) {
		return &replication.PrerequisiteError{
			Problem: fmt.Sprintf("kafka.quarantine_topic %s has cleanup.policy %s: quarantines would be deleted with old segments", nc.Topic, nc.Policy),
			Fix:     fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact (or name a new topic: it is created compacted)", nc.Topic),
		}
	}
	return fmt.Errorf("quarantine: %w", err)
}
