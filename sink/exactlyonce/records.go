package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// The records of a transaction against their topics: prepared before it
// begins (missing topics, limits), and the refusals of an attempt.

// refusals looks at the events' outcomes: a record refused alone is
// dead-lettered (a dead letter made smaller), one refused with others is
// sent alone next time. A fatal or unexplained error is returned as is.
func (t *Txn) refusals(b []*entry) error {
	var refused bool
	for _, e := range b {
		err, ev := e.err, e.sent()
		switch {
		case err == nil:
			continue
		case kafka.IsFatalTxn(err) || kafka.Classify(err) != kafka.ClassUnpublishable:
			return fmt.Errorf("produce to %s: %w", ev.Topic, err)
		}
		refused = true
		if tp := t.topics[ev.Topic]; tp != nil && (errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)) {
			tp.stale = true
		}
		if kafka.UnknownTopic(err) {
			if tp := t.topics[ev.Topic]; tp != nil {
				tp.known = false // look it up again, and wait for it
			}
			continue
		}
		if !e.alone && !kafka.TopicWide(err) {
			e.suspect = true
			continue
		}
		e.suspect = false
		switch {
		case !e.rec.DeadLettered():
			// A parked one too: its key is quarantined already.
			t.log.Warn("dead-lettering record", "topic", ev.Topic, "err", err)
			e.rec.ToDeadLetter(t.cfg.Sink.DLQTopic, kafka.RefusedReason(ev.Topic, err), err)
			e.parked = nil
		case e.rec.Minimal() || kafka.TopicWide(err):
			return fmt.Errorf("dead-letter topic %s refused the record: %w", t.cfg.Sink.DLQTopic, err)
		default:
			e.rec.Shrink(err.Error(), err)
		}
	}
	if refused {
		return errRefused
	}
	return nil
}

// prepare checks e against its topic before the transaction begins: a
// missing topic is created or waited for (then dead-lettered), a record
// over the limit is dead-lettered, a dead letter over it made smaller.
func (t *Txn) prepare(ctx context.Context, ev *kafka.Event) error {
	for {
		tp, err := t.lookup(ctx, ev.Topic)
		if err != nil {
			return err
		}
		if tp.missing {
			since := time.Since(tp.missingSince)
			switch {
			case ev.DeadLettered():
				return fmt.Errorf("dead-letter topic %s does not exist: %w", ev.Topic, kerr.UnknownTopicOrPartition)
			case since >= t.unknownTimeout:
				reason := fmt.Sprintf("topic %s did not exist for %v (kafka.unknown_topic_timeout): %v",
					ev.Topic, t.unknownTimeout, kerr.UnknownTopicOrPartition)
				t.log.Warn("dead-lettering record", "topic", ev.Topic, "reason", reason)
				ev.ToDeadLetter(t.cfg.Sink.DLQTopic, reason, nil)
				continue
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(t.poll):
			}
			tp.known = false
			continue
		}
		if tp.limit <= 0 || ev.Size() <= int(tp.limit) || ev.Minimal() {
			return nil
		}
		why := kafka.TooLargeReason(ev.Size(), tp.limit, ev.Topic)
		if ev.DeadLettered() {
			ev.Shrink(why, nil)
			return nil
		}
		t.log.Warn("dead-lettering record", "topic", ev.Topic, "reason", why)
		ev.ToDeadLetter(t.cfg.Sink.DLQTopic, why, nil)
	}
}

// topicInfo is what this producer knows of one of its topics between lookups
// (the idempotent sink's topicState, without the worker: transactions wait
// for their topics before they begin).
type topicInfo struct {
	known        bool
	stale        bool // re-read the limit: a refusal may mean it was lowered
	limit        int32
	missing      bool
	missingSince time.Time
}

// lookup reads name's state once (again when stale or missing) from the
// shared topic metadata: whether it exists (creating it when allowed) and
// its max.message.bytes.
func (t *Txn) lookup(ctx context.Context, name string) (*topicInfo, error) {
	tp := t.topics[name]
	if tp == nil {
		tp = &topicInfo{}
		t.topics[name] = tp
	}
	if tp.known && !tp.stale {
		return tp, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ok, limit, err := t.meta.Lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok && !tp.missing:
		tp.missing, tp.missingSince = true, time.Now()
		t.log.Warn("kafka: topic does not exist; its transaction waits for it", "topic", name, "timeout", t.unknownTimeout)
	case ok:
		tp.missing = false
		tp.limit = limit
		t.limits.Store(name, tp.limit)
	}
	tp.known, tp.stale = true, false
	return tp, nil
}
