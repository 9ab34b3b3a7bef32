package sink

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// topicState is what the sink knows about one topic. Fields other than
// limit are guarded by Sink.mu.
//
// A ready topic's records go straight to the client. Otherwise they wait in
// held and a worker goroutine owns the topic: it looks the topic up (and
// creates it), waits for a missing one, repairs after a refusal, then hands
// the held records over in order and marks the topic ready again.
type topicState struct {
	name string
	// limit is the topic's max.message.bytes, 0 while unknown. franz-go
	// reads it from its own goroutines (batchMax).
	limit atomic.Int32

	ready   bool
	running bool          // a worker owns the topic
	wake    chan struct{} // tells the worker that something changed

	known        bool      // looked up at least once
	stale        bool      // a refusal may mean the limit changed: look up again
	checked      time.Time // last lookup
	missing      bool
	missingSince time.Time
	expired      bool // missing for longer than the timeout: dead-letter

	inClient  int       // records handed to the client, outcome not in yet
	held      []*record // records waiting for the worker, in Produce order
	repairing bool
	announced bool             // the repair's first refusal was logged
	notices   uint64           // refusals noticed (see clientLog and settle)
	synced    uint64           // notices when nothing of t was last in the client
	retry     []*record        // records failed during a repair, any order
	isolating bool             // a record is being sent alone
	refused   map[int32]uint64 // per partition, lowest seq refused in this repair

	// gen is the Context of the records handed to the client; a refusal
	// cancels it so that the client fails, rather than sends, what it still
	// holds of the topic (kgo recBatch.maybeFailErr).
	gen     context.Context
	stopGen context.CancelFunc
}

// topic returns name's state, creating it (not ready) on first use.
// Called with s.mu held.
func (s *Sink) topic(name string) *topicState {
	t := s.topics[name]
	if t == nil {
		t = &topicState{name: name, wake: make(chan struct{}, 1)}
		t.gen, t.stopGen = context.WithCancel(s.ctx)
		s.topics[name] = t
	}
	return t
}

// admit counts r as in the client for t. Called with s.mu held.
func (t *topicState) admit(r *record) {
	t.inClient++
	r.t = t
	r.Context = t.gen
}

// overLimit reports whether r cannot fit t's known limit. A minimal dead
// letter is sent regardless: only the broker's refusal makes it fatal.
func (t *topicState) overLimit(r *record) bool {
	limit := int(t.limit.Load())
	return limit > 0 && r.Size() > limit && !r.Minimal()
}

func (t *topicState) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// startWorker starts t's worker unless it runs. Called with s.mu held.
func (s *Sink) startWorker(t *topicState) {
	if t.running || s.closed {
		return
	}
	t.running = true
	s.wg.Add(1)
	go s.work(t)
}

// startRepair holds t back because the broker refused r (nil: a refusal
// the client is about to report) and reports whether r is the first refusal
// of this repair to be reported. Called with s.mu held.
func (s *Sink) startRepair(t *topicState, r *record) bool {
	if !t.repairing {
		t.repairing, t.ready, t.announced = true, false, false
		t.refused = make(map[int32]uint64)
	}
	t.notices++
	if r == nil || !r.alone {
		if r != nil {
			if first, ok := t.refused[r.Partition]; !ok || r.seq < first {
				t.refused[r.Partition] = r.seq
			}
		}
		// Whatever the client has not sent of t yet would overtake the
		// refused records: fail it too, to send it again after them.
		t.stopGen()
		t.gen, t.stopGen = context.WithCancel(s.ctx)
	}
	s.startWorker(t)
	if r == nil {
		return false
	}
	if errors.Is(r.err, kerr.MessageTooLarge) || errors.Is(r.err, kerr.RecordListTooLarge) {
		t.stale = true // the limit may have been lowered since it was read
	}
	first := !t.announced
	t.announced = true
	return first
}

// holdBack starts a repair of topic the moment franz-go logs that it fails
// a batch for good: see clientlog.go.
func (s *Sink) holdBack(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.topics[topic]; t != nil && !s.closed {
		s.startRepair(t, nil)
	}
}

func (s *Sink) work(t *topicState) {
	defer s.wg.Done()
	for s.step(t) {
	}
}

// step does one piece of t's pending work and reports whether there is more.
func (s *Sink) step(t *topicState) bool {
	s.mu.Lock()
	if s.closed {
		t.running = false
		s.mu.Unlock()
		return false
	}
	select {
	case <-s.restored:
	default:
		// No record reaches the client before the saved quarantines are
		// restored: one of a quarantined key would overtake its dead letter.
		s.mu.Unlock()
		return s.awaitRestore(s.ctx) == nil
	}
	now := time.Now()
	switch {
	case !t.known || t.stale || t.missing && now.Sub(t.checked) >= s.poll:
		s.mu.Unlock()
		s.lookup(t)
		return true
	case t.missing && !t.expired:
		if now.Sub(t.missingSince) < s.unknownTimeout {
			s.mu.Unlock()
			backoff.Sleep(s.ctx, s.poll)
			return true
		}
		t.expired = true
		s.mu.Unlock()
		s.log.Error("kafka: topic still missing after kafka.unknown_topic_timeout; its records go to the dead-letter topic",
			"topic", t.name, "timeout", s.unknownTimeout)
		return true
	case t.repairing:
		return s.repairStep(t)
	case len(t.held) > 0:
		r := s.popHeld(t)
		expired := t.expired
		s.mu.Unlock()
		if expired {
			s.missingDeadLetter(t, r)
		} else {
			s.handOver(t, r, fromHeld)
		}
		return true
	}
	// A missing topic stays held back: its next record starts a worker,
	// which looks again.
	t.ready = !t.missing
	t.running = false
	s.mu.Unlock()
	return false
}

// repairStep sends t's failed records again, lowest seq first: a record
// failed with a refusal goes alone, so that a second refusal is its own; one
// refused alone (or for a reason of the whole topic) is dead-lettered.
// Called with s.mu held; returns with it released.
func (s *Sink) repairStep(t *topicState) bool {
	if t.inClient == 0 {
		// Every record refused so far has come back: retry is complete.
		t.synced = t.notices
	}
	// Nothing may join a record sent alone before its outcome is in, and
	// nothing goes while refused records are still on their way back.
	if t.inClient > 0 && (t.isolating || t.synced != t.notices) {
		s.mu.Unlock()
		return s.waitWake(t)
	}
	t.isolating = false
	if len(t.retry) == 0 {
		if t.inClient > 0 {
			s.mu.Unlock()
			return s.waitWake(t)
		}
		t.repairing, t.refused = false, nil
		s.mu.Unlock()
		return true
	}
	i := 0
	for j, r := range t.retry {
		if r.seq < t.retry[i].seq {
			i = j
		}
	}
	r := t.retry[i]
	switch {
	case t.expired:
		t.retry = slices.Delete(t.retry, i, i+1)
		s.mu.Unlock()
		s.missingDeadLetter(t, r)
	case r.err == nil: // failed unsent, never refused
		t.retry = slices.Delete(t.retry, i, i+1)
		s.mu.Unlock()
		s.handOver(t, r, resend)
	case kafka.UnknownTopic(r.err):
		// Look the topic up again before anything is sent; these records
		// were not refused for what they are.
		for _, x := range t.retry {
			if x.err != nil && kafka.UnknownTopic(x.err) {
				x.err, x.alone = nil, false
			}
		}
		t.known = false
		s.mu.Unlock()
	case r.alone || kafka.TopicWide(r.err):
		t.retry = slices.Delete(t.retry, i, i+1)
		s.mu.Unlock()
		s.refusedAlone(t, r)
	default: // refused with its batch: send it alone
		if t.inClient > 0 {
			s.mu.Unlock()
			return s.waitWake(t)
		}
		t.retry = slices.Delete(t.retry, i, i+1)
		t.isolating = true
		s.mu.Unlock()
		s.handOver(t, r, resendAlone)
	}
	return true
}

// popHeld takes t's oldest held record. Called with s.mu held.
func (s *Sink) popHeld(t *topicState) *record {
	r := t.held[0]
	t.held[0] = nil
	t.held = t.held[1:]
	s.held--
	s.heldBytes -= int64(r.Size())
	if s.spaceWanted {
		close(s.space)
		s.space, s.spaceWanted = make(chan struct{}), false
	}
	return r
}

// waitWake waits for a settled record or for Close.
func (s *Sink) waitWake(t *topicState) bool {
	select {
	case <-t.wake:
	case <-s.ctx.Done():
	}
	return true
}
