package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// ownTopics checks the connector's own topics and creates the missing ones
// before anything is produced (sink.EnsureOwnTopics). A cluster that
// refuses is a prerequisite error naming the command. A Kafka that does not
// answer yet does not stop the start, as it does not stop the producer:
// the check goes on while the connector runs, and a refusal then stops it.
func (su *starter) ownTopics(ctx context.Context) error {
	p := su.p
	cfg := su.ownTopicsConfig()
	first, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := sink.EnsureOwnTopics(first, cfg, true, p.log)
	cancel()
	if err == nil || ctx.Err() != nil {
		return ctx.Err()
	}
	if err := ownTopicError(err); err != nil {
		return err
	}
	p.log.Warn("kafka: cannot check the connector's own topics yet; checking again while the connector runs", "err", err)
	go func() {
		for n := 0; ; n++ {
			if backoff.Sleep(ctx, backoff.Nth(time.Second, 30*time.Second, n)); ctx.Err() != nil {
				return
			}
			attempt, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := sink.EnsureOwnTopics(attempt, cfg, true, p.log)
			cancel()
			if err == nil || ctx.Err() != nil {
				return
			}
			if err := ownTopicError(err); err != nil {
				p.fail(err)
				return
			}
		}
	}()
	return nil
}

// ownTopicsConfig is the sink configuration whose own topics this run
// uses: a replay keeps its quarantines in memory (openSink); exactly_once's
// positions topic is checked by its own start.
func (su *starter) ownTopicsConfig() sink.Config {
	p := su.p
	cfg := p.cfg.Sink
	if p.cfg.Replay != nil {
		cfg.QuarantineTopic = ""
	}
	return cfg
}

// ownTopicError is the prerequisite error for a refusal about an own
// topic, or nil for an error that may pass (Kafka not answering).
func ownTopicError(err error) error {
	var ot *sink.OwnTopicError
	var nc *quarantine.NotCompactedError
	switch {
	case errors.As(err, &ot):
		return &fault.PrerequisiteError{Problem: "kafka: " + ot.What(), Fix: ot.Fix}
	case errors.As(err, &nc):
		return notCompacted(err)
	}
	return nil
}
