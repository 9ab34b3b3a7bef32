package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// The records of a transaction against their topics: prepared before it
// begins (missing topics, limits), and the refusals of an attempt.

// refusals looks at the events' outcomes: a record refused alone is
// dead-lettered (a dead letter made smaller), one refused with others is
// sent alone next time. A fatal or unexplained error is returned as is.
func (t *Txn) refusals(b []*entry) error {
	var refused bool
	for _, e := range b {
		err := e.err
		switch {
		case err == nil:
			continue
		case isFatalTxn(err) || Classify(err) != ClassUnpublishable:
			return fmt.Errorf("produce to %s: %w", e.rec.Topic, err)
		}
		refused = true
		if tp := t.topics[e.rec.Topic]; tp != nil && (errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)) {
			tp.stale = true
		}
		if unknownTopic(err) {
			if tp := t.topics[e.rec.Topic]; tp != nil {
				tp.known = false // look it up again, and wait for it
			}
			continue
		}
		if !e.alone && !topicWide(err) {
			e.suspect = true
			continue
		}
		e.suspect = false
		switch {
		case !e.rec.dead:
			t.log.Warn("dead-lettering record", "topic", e.rec.Topic, "err", err)
			e.rec.toDeadLetter(t.s.dlq, refusedReason(e.rec.Topic, err), err)
		case e.rec.level >= 2 || topicWide(err):
			return fmt.Errorf("dead-letter topic %s refused the record: %w", t.s.dlq, err)
		default:
			shrink(e.rec, err.Error(), err)
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
func (t *Txn) prepare(ctx context.Context, e *entry) error {
	for {
		tp, err := t.lookup(ctx, e.rec.Topic)
		if err != nil {
			return err
		}
		if tp.missing {
			since := time.Since(tp.missingSince)
			switch {
			case e.rec.dead:
				return fmt.Errorf("dead-letter topic %s does not exist: %w", e.rec.Topic, kerr.UnknownTopicOrPartition)
			case since >= t.s.unknownTimeout:
				reason := fmt.Sprintf("topic %s did not exist for %v (kafka.unknown_topic_timeout): %v",
					e.rec.Topic, t.s.unknownTimeout, kerr.UnknownTopicOrPartition)
				t.log.Warn("dead-lettering record", "topic", e.rec.Topic, "reason", reason)
				e.rec.toDeadLetter(t.s.dlq, reason, nil)
				continue
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(t.s.poll):
			}
			tp.known = false
			continue
		}
		if tp.limit <= 0 || e.rec.size <= int(tp.limit) || e.rec.dead && e.rec.level >= 2 {
			return nil
		}
		why := tooLargeReason(e.rec.size, tp.limit, e.rec.Topic)
		if e.rec.dead {
			shrink(e.rec, why, nil)
			return nil
		}
		t.log.Warn("dead-lettering record", "topic", e.rec.Topic, "reason", why)
		e.rec.toDeadLetter(t.s.dlq, why, nil)
	}
}

// lookup reads topic's state once (again when stale or missing): whether
// it exists (creating it when allowed) and its max.message.bytes.
func (t *Txn) lookup(ctx context.Context, topic string) (*txnTopic, error) {
	tp := t.topics[topic]
	if tp == nil {
		tp = &txnTopic{}
		t.topics[topic] = tp
	}
	if tp.known && !tp.stale {
		return tp, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ok, err := t.s.meta.existsOrCreate(ctx, topic)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok && !tp.missing:
		tp.missing, tp.missingSince = true, time.Now()
		t.log.Warn("kafka: topic does not exist; its transaction waits for it", "topic", topic, "timeout", t.s.unknownTimeout)
	case ok:
		tp.missing = false
		tp.limit = t.s.meta.maxMessageBytes(ctx, topic)
		t.limits.Store(topic, tp.limit)
	}
	tp.known, tp.stale = true, false
	return tp, nil
}
