package sink

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// HeaderQuarantine names the quarantine a parked record belongs to: the id
// of the event whose dead letter started it (its key when it has none).
const HeaderQuarantine = "quarantine"

// Quarantine is an aggregate (a record key) whose later events are parked
// because one of its events was dead-lettered: delivering them would let
// them overtake it.
type Quarantine struct {
	Key     string    `json:"key"`
	FirstID string    `json:"first_id"` // id header of the dead-lettered event
	Reason  string    `json:"reason"`
	Topic   string    `json:"topic"` // the dead-lettered event's topic ("" for the router's refusals)
	Since   time.Time `json:"since"`
	Parked  int64     `json:"-"` // records parked so far by this process
}

// quarantined is a Quarantine as the sink keeps it.
type quarantined struct {
	Quarantine
	// holding: later records of the key wait in held (in Produce order)
	// while the quarantine is being saved or redriven.
	holding bool
	held    []*record
	state   *QuarantineRecord // as saved on the state topic; nil until saved
	stateAt int64             // state's offset: an older tombstone is not this quarantine's
	// inflight counts the key's parked records without an outcome.
	inflight atomic.Int64
}

// How divert routes a record.
const (
	passNormal  = iota
	passRelease // lifted by a redrive: to its own topic
	passPark    // released after the quarantine was saved: to parking
)

// quarantine starts a quarantine for r's key as r is dead-lettered, unless
// the sink only skips (no parking topic), r has no key or the key is
// quarantined already. Past maxQuarantined it fails: dropping the rule
// silently would break order. Called with s.mu held.
func (s *Sink) quarantine(r *record, reason string) error {
	if s.parking == "" || len(r.Key) == 0 {
		return nil
	}
	key := string(r.Key)
	if _, ok := s.quarantined[key]; ok {
		return nil
	}
	if len(s.quarantined) >= s.maxQuarantined {
		return fmt.Errorf("cannot quarantine aggregate %q: %d aggregates are quarantined already (dlq.max_quarantined); redrive or skip some, or raise the bound", key, len(s.quarantined))
	}
	id := headerValue(&r.Record, wire.HeaderID)
	if id == "" {
		id = key
	}
	q := &quarantined{Quarantine: Quarantine{Key: key, FirstID: id, Reason: reason, Topic: r.orig, Since: time.Now()}}
	if s.state != nil {
		// Later records wait until the quarantine is saved (state.go).
		q.holding, r.starts = true, q
	}
	s.quarantined[key] = q
	n := len(s.quarantined)
	s.reportQuarantines("", n)
	if n > s.maxQuarantined*8/10 {
		s.log.Warn("many aggregates are quarantined; at dlq.max_quarantined the connector stops rather than let events overtake",
			"quarantined", n, "max", s.maxQuarantined)
	}
	return nil
}

// What divert did with a record.
const (
	divertNone   = iota // nothing: r goes to its topic
	divertParked        // r is bound for the parking topic now
	divertHeld          // r waits in its quarantine's held queue
)

// divert sends r to the parking topic when its key is quarantined, with
// the quarantine and original topic in front of its headers, or holds it
// while the quarantine is being saved or redriven. Called with s.mu held,
// in Produce order for each key (see submit and handOver).
func (s *Sink) divert(r *record) int {
	if s.parking == "" || r.dead || r.parked || len(r.Key) == 0 || r.pass == passRelease {
		return divertNone
	}
	q, ok := s.quarantined[string(r.Key)]
	if !ok {
		return divertNone
	}
	if q.holding && r.pass != passPark {
		q.held = append(q.held, r)
		return divertHeld
	}
	q.Parked++
	q.inflight.Add(1)
	r.pq = q
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	h = append(h, kgo.RecordHeader{Key: HeaderQuarantine, Value: []byte(q.FirstID)},
		kgo.RecordHeader{Key: wire.HeaderTopic, Value: []byte(r.Topic)})
	r.Headers = append(h, r.Headers...)
	r.orig, r.Topic, r.parked = r.Topic, s.parking, true
	r.Partition = -1 // the key chooses, as in the dead-letter topic
	r.err, r.alone, r.resent = nil, false, false
	r.size = batchSize(&r.Record)
	return divertParked
}

// reportQuarantines tells Config.Redrives a redrive's result ("" for any
// other change of the set) and the set's size.
func (s *Sink) reportQuarantines(result string, n int) {
	if s.onQuarantines != nil {
		s.onQuarantines(result, n)
	}
}
