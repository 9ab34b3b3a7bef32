package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// openSink creates the producer and, in dlq.mode quarantine, restores the
// quarantined aggregates saved on kafka.quarantine_topic before anything
// is produced: replayed events of a quarantined aggregate are parked again.
func (su *starter) openSink(ctx context.Context) (*sink.Sink, error) {
	p := su.p
	cfg := p.cfg.Sink
	if p.cfg.Replay != nil {
		// A replay must not take requests meant for the running connector:
		// its quarantines stay in memory.
		cfg.QuarantineTopic = ""
	}
	cfg = p.quarantining(cfg)
	key := func(ctx context.Context) (string, error) {
		srv, err := su.identify(ctx)
		return sourceKey(srv, p.cfg.Source.Slot), err
	}
	return startSink(ctx, cfg, key, p.log)
}

// quarantining is cfg with what the quarantined set of either producer
// reports to, and asks of, the run.
func (p *Pipeline) quarantining(cfg sink.Config) sink.Config {
	// The producer is the one source of the quarantined count, in memory too.
	cfg.Redrives = func(result string, quarantined int) {
		if result != "" {
			p.m.Redrives.WithLabelValues(result).Inc()
		}
		p.m.Quarantined.Set(float64(quarantined))
	}
	// Requests are carried out only while this process streams from the
	// slot: a standby waiting for it must not lift what the active one parks.
	cfg.Owner = p.Streaming
	// Kafka not usable at start: the restore goes on in the producer, and a
	// topic found not compacted then stops the connector.
	cfg.Fail = func(err error) { p.fail(notCompacted(err)) }
	// A redrive re-checks event contracts against their latest versions.
	if rv := revalidator(p.cfg.Contracts, p.cfg.Routes.Format); rv != nil {
		cfg.Contracts = rv
	}
	return cfg
}

// OpenRepairSink opens the sink that verify --repair republishes missing
// rows through. It restores the connector's quarantines, so a missing row
// of a quarantined aggregate is parked rather than put before its dead
// letter, and it never carries out redrive requests: the connector
// streaming from the slot does. fail is told of a quarantine topic found
// not compacted after the start.
func OpenRepairSink(ctx context.Context, cfg Config, fail func(error), log *slog.Logger) (*sink.Sink, error) {
	sc := cfg.Sink
	// A row it cannot publish goes to the dead-letter or parking topic: on
	// a cluster that does not create topics, they exist only if it makes
	// them, as run does (a missing one would hold the row until the end).
	if err := sink.EnsureOwnTopics(ctx, sc, true, log); err != nil {
		if pe := ownTopicError(err); pe != nil {
			return nil, pe
		}
		return nil, fmt.Errorf("kafka: check the connector's own topics: %w", err)
	}
	sc.Owner = func() bool { return false }
	sc.Fail = func(err error) { fail(notCompacted(err)) }
	key := func(ctx context.Context) (string, error) {
		srv, err := cfg.Source.DB.Identify(ctx)
		return sourceKey(srv, cfg.Source.Slot), err
	}
	return startSink(ctx, sc, key, log)
}

// startSink names this connector's keys on the quarantine topic (source:
// the source key, read only in dlq.mode quarantine), creates the sink and
// starts its quarantines.
func startSink(ctx context.Context, cfg sink.Config, source func(context.Context) (string, error), log *slog.Logger) (*sink.Sink, error) {
	if cfg.QuarantineTopic != "" && cfg.ParkingTopic != "" {
		key, err := source(ctx)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		cfg.QuarantineSource = key
	}
	s, err := sink.New(cfg, log)
	if err != nil {
		return nil, err
	}
	if err := s.StartQuarantines(ctx); err != nil {
		s.Close()
		return nil, notCompacted(err)
	}
	return s, nil
}

// notCompacted turns the quarantine's NotCompactedError into the prerequisite
// error with the fix; other errors get context.
func notCompacted(err error) error {
	var nc *quarantine.NotCompactedError
	if errors.As(err, &nc) {
		return &fault.PrerequisiteError{
			Problem: fmt.Sprintf("kafka.quarantine_topic %s has cleanup.policy %s: quarantines would be deleted with old segments", nc.Topic, nc.Policy),
			Fix:     fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact (or name a new topic: it is created compacted)", nc.Topic),
		}
	}
	return fmt.Errorf("quarantine: %w", err)
}
