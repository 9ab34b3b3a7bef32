package sink

import (
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// lookup learns whether t exists (creating it when allowed) and its
// max.message.bytes. Failing requests are retried for ever, as the client
// retries produce requests: the records wait.
func (s *Sink) lookup(t *topicState) {
	var (
		exists bool
		limit  int32
		err    error
	)
	for attempt := 0; ; attempt++ {
		exists, limit, err = s.meta.Lookup(s.ctx, t.name)
		if err == nil {
			break
		}
		s.log.Warn("kafka: cannot look up topic; retrying", "topic", t.name, "err", err)
		if backoff.Sleep(s.ctx, backoff.Nth(100*time.Millisecond, 5*time.Second, attempt)); s.ctx.Err() != nil {
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t.known, t.stale, t.checked = true, false, time.Now()
	if limit > 0 {
		t.limit.Store(limit)
	}
	switch {
	case exists && t.missing:
		s.log.Info("kafka: topic exists now; sending its records", "topic", t.name, "waited", time.Since(t.missingSince).Round(time.Millisecond))
		t.missing, t.expired = false, false
	case !exists && !t.missing:
		t.missing, t.missingSince = true, time.Now()
		s.log.Warn("kafka: topic does not exist; its records wait for it", "topic", t.name, "timeout", s.unknownTimeout)
	}
}

// batchMax is franz-go's batch cap for topic (ProducerBatchMaxBytesFn),
// asked when the client first produces to one of its partitions, which is
// after the lookup (kafka.BatchCap).
func (s *Sink) batchMax(topic string) int32 {
	var limit int32
	if topic != "" {
		s.mu.Lock()
		if t := s.topics[topic]; t != nil {
			limit = t.limit.Load()
		}
		s.mu.Unlock()
	}
	return kafka.BatchCap(limit)
}
