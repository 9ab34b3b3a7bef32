package quarantine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// fakeRecord is a producer's record as the seam sees it, without a producer.
type fakeRecord struct {
	kr       kgo.Record
	m        Mark
	resubmit []bool // park, for each Resubmit
	failed   error
}

func (r *fakeRecord) Kafka() *kgo.Record { return &r.kr }
func (r *fakeRecord) Mark() *Mark        { return &r.m }
func (r *fakeRecord) Resubmit(park bool) { r.resubmit = append(r.resubmit, park) }
func (r *fakeRecord) Fail(err error)     { r.failed = err }

func event(key, topic, id string) *fakeRecord {
	r := &fakeRecord{kr: kgo.Record{Topic: topic, Key: []byte(key), Partition: 3,
		Headers: []kgo.RecordHeader{{Key: "x", Value: []byte("y")}}}}
	if id != "" {
		r.kr.Headers = append(r.kr.Headers, kgo.RecordHeader{Key: wire.HeaderID, Value: []byte(id)})
	}
	return r
}

func newSet(t *testing.T, cfg Config) (*Set, *[]int) {
	t.Helper()
	var reported []int
	cfg.Parking, cfg.DLQ = "parking", "dlq"
	cfg.Report = func(result string, n int) {
		if result != "" {
			t.Errorf("reported result %q outside a redrive", result)
		}
		reported = append(reported, n)
	}
	return New(context.Background(), cfg, nil, slog.New(slog.DiscardHandler)), &reported
}

// TestRouteParksAfterBegin: a dead letter begins its key's quarantine;
// later records of the key are routed to the parking topic with the
// quarantine and their topic in front of their headers, other keys pass,
// and Unpark gives a parked record its own headers back.
func TestRouteParksAfterBegin(t *testing.T) {
	s, reported := newSet(t, Config{})
	if !s.Started() {
		t.Fatal("a set without a state topic must not need Start")
	}
	select {
	case <-s.Ready():
	default:
		t.Fatal("a set without a state topic is ready at once")
	}
	dead := event("k", "dlq", "ev-1")
	if _, err := s.Begin(dead, "orders", "too large"); err != nil || dead.m.Saving() {
		t.Fatalf("Begin = %v, saving %v; want nil, not saving (nothing to save)", err, dead.m.Saving())
	}
	if _, err := s.Begin(event("k", "dlq", "ev-9"), "orders", "again"); err != nil {
		t.Fatalf("Begin of a key quarantined already = %v", err)
	}
	for _, tc := range []struct {
		name string
		r    *fakeRecord
		want Routing
	}{
		{"no key", event("", "orders", "ev-2"), Pass},
		{"other key", event("j", "orders", "ev-3"), Pass},
		{"released by a redrive", func() *fakeRecord { r := event("k", "orders", "ev-4"); r.m.pass = passRelease; return r }(), Pass},
	} {
		before := tc.r.kr.Topic
		if got := s.Route(tc.r); got != tc.want || tc.r.kr.Topic != before || tc.r.m.parked != nil {
			t.Errorf("%s: Route = %d, topic %q; want %d, %q", tc.name, got, tc.r.kr.Topic, tc.want, before)
		}
	}
	later := event("k", "orders", "ev-5")
	if got := s.Route(later); got != Park {
		t.Fatalf("Route of a later record of the key = %d, want Park", got)
	}
	h := later.kr.Headers
	if later.kr.Topic != "parking" || later.kr.Partition != -1 || len(h) != 4 ||
		h[0].Key != Header || string(h[0].Value) != "ev-1" || h[1].Key != wire.HeaderTopic || string(h[1].Value) != "orders" || h[2].Key != "x" {
		t.Fatalf("parked record: topic %q, partition %d, headers %v", later.kr.Topic, later.kr.Partition, h)
	}
	q := s.Quarantined()
	if len(q) != 1 || q[0].Key != "k" || q[0].FirstID != "ev-1" || q[0].Topic != "orders" || q[0].Reason != "too large" || q[0].Parked != 1 {
		t.Fatalf("Quarantined = %+v", q)
	}
	if n := s.quarantined["k"].inflight.Load(); n != 1 {
		t.Fatalf("in flight after parking: %d, want 1", n)
	}
	later.m.Done()
	if n := s.quarantined["k"].inflight.Load(); n != 0 {
		t.Fatalf("in flight after the outcome: %d, want 0", n)
	}
	Unpark(&later.kr)
	if len(later.kr.Headers) != 2 || later.kr.Headers[0].Key != "x" {
		t.Fatalf("unparked headers %v, want the record's own", later.kr.Headers)
	}
	if len(*reported) != 1 || (*reported)[0] != 1 {
		t.Fatalf("reported sizes %v, want [1]", *reported)
	}
}

// TestBeginBoundAndFirstID: an event without an id names its quarantine by
// its key; past dlq.max_quarantined Begin fails rather than let a key's
// events overtake its dead letter.
func TestBeginBoundAndFirstID(t *testing.T) {
	s, _ := newSet(t, Config{Max: 1})
	if _, err := s.Begin(event("a", "dlq", ""), "", "router"); err != nil {
		t.Fatal(err)
	}
	if q := s.Quarantined(); len(q) != 1 || q[0].FirstID != "a" || q[0].Topic != "" {
		t.Fatalf("Quarantined = %+v, want a named by its key", q)
	}
	_, err := s.Begin(event("b", "dlq", "ev-2"), "orders", "refused")
	if err == nil || !strings.Contains(err.Error(), "dlq.max_quarantined") {
		t.Fatalf("Begin past the bound = %v, want the dlq.max_quarantined error", err)
	}
	if len(s.Quarantined()) != 1 {
		t.Fatal("the refused quarantine was added")
	}
}

// TestHeldUntilSavedThenClosed: with a state topic a new quarantine holds
// its key's later records until it is saved (the dead letter's outcome
// waits: Saving); Close fails what is still held. Before Start the set is
// not ready and records may not be produced.
func TestHeldUntilSavedThenClosed(t *testing.T) {
	s, _ := newSet(t, Config{Topic: "state", Source: "sys/db/slot"})
	if s.Started() {
		t.Fatal("a set with a state topic is started before Start")
	}
	select {
	case <-s.Ready():
		t.Fatal("a set with a state topic is ready before its restore")
	default:
	}
	dead := event("k", "dlq", "ev-1")
	if _, err := s.Begin(dead, "orders", "too large"); err != nil || !dead.m.Saving() {
		t.Fatalf("Begin = %v, saving %v; want nil, saving", err, dead.m.Saving())
	}
	held := event("k", "orders", "ev-2")
	if got := s.Route(held); got != Hold || !s.Holding("k") || held.kr.Topic != "orders" {
		t.Fatalf("Route while saving = %d (holding %v, topic %q), want Hold", got, s.Holding("k"), held.kr.Topic)
	}
	// A record the save released to parking passes the hold.
	released := event("k", "orders", "ev-3")
	released.m.pass = passPark
	if got := s.Route(released); got != Park {
		t.Fatalf("Route of a record released to parking = %d, want Park", got)
	}
	s.Close()
	if !errors.Is(held.failed, kgo.ErrClientClosed) || held.resubmit != nil {
		t.Fatalf("held record after Close: failed %v, resubmitted %v; want ErrClientClosed", held.failed, held.resubmit)
	}
}

// TestReleaseHeldInOrder: releasing a quarantine's held records hands them
// back in their order, parked first for passPark, and lifts it when asked.
func TestReleaseHeldInOrder(t *testing.T) {
	s, _ := newSet(t, Config{Topic: "state", Source: "sys/db/slot"})
	if _, err := s.Begin(event("k", "dlq", "ev-1"), "orders", "too large"); err != nil {
		t.Fatal(err)
	}
	a, b := event("k", "orders", "ev-2"), event("k", "orders", "ev-3")
	s.Route(a)
	s.Route(b)
	q := s.quarantined["k"]
	s.releaseHeld(q, passPark, false)
	if len(a.resubmit) != 1 || !a.resubmit[0] || len(b.resubmit) != 1 || !b.resubmit[0] || a.m.pass != passPark || s.Holding("k") {
		t.Fatalf("released to parking: a %v, b %v, holding %v", a.resubmit, b.resubmit, s.Holding("k"))
	}
	c := event("k", "orders", "ev-4")
	q.holding = true
	s.Route(c)
	s.releaseHeld(q, passRelease, true)
	if len(c.resubmit) != 1 || c.resubmit[0] || c.m.pass != passRelease || len(s.Quarantined()) != 0 {
		t.Fatalf("released by a redrive: c %v, pass %d, quarantined %v", c.resubmit, c.m.pass, s.Quarantined())
	}
}
