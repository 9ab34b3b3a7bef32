package quarantine_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

const (
	topic   = sinktest.Topic // seeded by sinktest.NewCluster
	dlq     = sinktest.DLQ
	parking = "outbox.parking"
)

func quarantineMode(cfg *sink.Config) { cfg.ParkingTopic = parking }

// keyedRecord is record i of aggregate key, with its index as value and
// id header.
func keyedRecord(tp, key string, i int, suffix string) *router.Record {
	return &router.Record{Topic: tp, Key: []byte(key), Value: []byte(fmt.Sprintf("%04d%s", i, suffix)),
		Headers: []router.Header{{Key: "id", Value: []byte(fmt.Sprintf("ev-%d", i))}}}
}

// routerDead is record i as the router dead-letters a row whose
// aggregate_id is key.
func routerDead(key string, i int) *router.Record {
	r := keyedRecord(dlq, key, i, "")
	r.Headers = append(r.Headers, router.Header{Key: "aggregate_id", Value: []byte(key)})
	return r
}

// byKey groups values by key, in the order read (one partition per key).
func byKey(recs []*kgo.Record) map[string][]string {
	m := map[string][]string{}
	for _, r := range recs {
		m[string(r.Key)] = append(m[string(r.Key)], string(r.Value))
	}
	return m
}

// TestQuarantineParksLaterEventsInOrder: the broker refuses one record of
// aggregate k1 in a batch with its neighbours, which are in flight behind it
// in the same partition, and records keep coming. The refused record is
// dead-lettered, every later record of k1 (those refused with it included)
// goes to the parking topic in order, and the other aggregates reach their
// topic complete and in order.
func TestQuarantineParksLaterEventsInOrder(t *testing.T) {
	t.Run("in memory", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
		s, _ := sinktest.NewSink(t, c, nil, quarantineMode)
		parksLaterEventsInOrder(ctx, t, c, s)
	})
	// The key's records wait while the quarantine is saved, some of them
	// in the topic's repair: they are parked in order all the same.
	t.Run("saved", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
		parksLaterEventsInOrder(ctx, t, c, startSaved(ctx, t, c, nil))
	})
}

func parksLaterEventsInOrder(ctx context.Context, t *testing.T, c *kfake.Cluster, s *sink.Sink) {
	const n, poison, keys = 400, 201, 4 // poison is k1's 51st record
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), topic, dlq, parking)
	release, _, most := sinktest.RefusePoison(ctx, c, names)
	res := sinktest.NewResults(n)
	want := map[string][]string{}   // on the event topic, by key
	parked := map[string][]string{} // on the parking topic
	for i := range n {
		key, suffix := fmt.Sprintf("k%d", i%keys), ""
		if i == poison {
			suffix = "-poison"
		}
		rec := keyedRecord(topic, key, i, suffix)
		switch {
		case key == "k1" && i > poison:
			parked[key] = append(parked[key], string(rec.Value))
		case i != poison:
			want[key] = append(want[key], string(rec.Value))
		}
		sinktest.Produce(ctx, t, s, rec, res.Slot(i))
		if i == poison {
			close(release)
		}
	}
	for i, o := range res.All(ctx, t, n) {
		switch {
		case i == poison:
			if q := s.Quarantined(); !o.DeadLettered || len(q) != 1 {
				t.Errorf("poison record: outcome %+v with quarantines %+v, want dead-lettered with 1 quarantine", o, q)
			}
		case i%keys == 1 && i > poison:
			if !o.Parked {
				t.Errorf("record %d of the quarantined aggregate: outcome %+v, want parked", i, o)
			}
		case o.Parked || o.DeadLettered || o.Err != nil:
			t.Errorf("record %d: outcome %+v, want a plain delivery", i, o)
		}
	}
	if most.Load() < 2 {
		t.Fatalf("refused batches held at most %d records: the neighbours were never in flight with it", most.Load())
	}
	if got := byKey(sinktest.Consume(ctx, t, c, topic, n-1-len(parked["k1"]))); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("event topic by key:\n got %v\nwant %v", got, want)
	}
	precs := sinktest.Consume(ctx, t, c, parking, len(parked["k1"]))
	if got := byKey(precs); fmt.Sprint(got) != fmt.Sprint(parked) {
		t.Errorf("parking topic by key:\n got %v\nwant %v", got, parked)
	}
	for _, r := range precs {
		q, _ := sinktest.Header(r, quarantine.Header)
		tp, _ := sinktest.Header(r, "topic")
		if q != fmt.Sprintf("ev-%d", poison) || tp != topic {
			t.Fatalf("parked record %q: quarantine %q, topic %q; want ev-%d and %s", r.Value, q, tp, poison, topic)
		}
	}
	if dl := sinktest.Consume(ctx, t, c, dlq, 1)[0]; !bytes.HasSuffix(dl.Value, []byte("-poison")) {
		t.Errorf("dead letter %q is not the poison record", dl.Value)
	}
	qs := s.Quarantined()
	if len(qs) != 1 || qs[0].Key != "k1" || qs[0].FirstID != fmt.Sprintf("ev-%d", poison) ||
		!strings.Contains(qs[0].Reason, "MESSAGE_TOO_LARGE") || qs[0].Topic != topic || qs[0].Parked != int64(len(parked["k1"])) {
		t.Errorf("quarantined %+v, want k1 from ev-%d for MESSAGE_TOO_LARGE on %s with %d parked", qs, poison, topic, len(parked["k1"]))
	}
}

// TestRouterDeadLetterQuarantines: a record the router dead-lettered (sent
// to the dead-letter topic directly) quarantines its key too; past
// MaxQuarantined a new quarantine is a fatal outcome, never a silent skip.
func TestRouterDeadLetterQuarantines(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) { quarantineMode(cfg); cfg.MaxQuarantined = 1 })
	recs := []*router.Record{
		routerDead("a", 0),
		keyedRecord(topic, "a", 1, ""),
		keyedRecord(topic, "b", 2, ""),
		keyedRecord(dlq, "ev-9", 4, ""), // NULL aggregate_id: keyed by its id, quarantines nothing
		routerDead("b", 3),              // a second quarantine: over the bound
	}
	res := sinktest.NewResults(len(recs))
	for i, r := range recs {
		sinktest.Produce(ctx, t, s, r, res.Slot(i))
	}
	out := res.All(ctx, t, len(recs))
	if !out[0].DeadLettered || !out[1].Parked || out[2] != (sink.Outcome{}) {
		t.Errorf("outcomes %+v: want dead-lettered, parked, delivered", out[:3])
	}
	if q := s.Quarantined(); !out[3].DeadLettered || len(q) != 1 {
		t.Errorf("dead letter without aggregate_id: outcome %+v with quarantines %+v, want dead-lettered, still 1 quarantine", out[3], q)
	}
	if out[4].Err == nil || !strings.Contains(out[4].Err.Error(), "dlq.max_quarantined") || sink.Classify(out[4].Err) != sink.ClassFatal {
		t.Errorf("dead letter over the bound: outcome %+v, want a fatal error naming dlq.max_quarantined", out[4])
	}
	if p := sinktest.Consume(ctx, t, c, parking, 1)[0]; string(p.Key) != "a" || string(p.Value) != "0001" {
		t.Errorf("parked %q=%q, want a=0001", p.Key, p.Value)
	}
}

// TestSkipModeParksNothing: without a parking topic (dlq.mode skip) later
// records of a dead-lettered aggregate are delivered as before.
func TestSkipModeParksNothing(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, _ := sinktest.NewSink(t, c, nil, nil)
	res := sinktest.NewResults(2)
	sinktest.Produce(ctx, t, s, routerDead("a", 0), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 1, ""), res.Slot(1))
	out := res.All(ctx, t, 2)
	if !out[0].DeadLettered || out[1] != (sink.Outcome{}) || len(s.Quarantined()) != 0 {
		t.Errorf("outcomes %+v, quarantined %v: want dead-lettered, delivered, none", out, s.Quarantined())
	}
}

// TestQuarantineAfterMissingTopic: records held for a topic that never
// appears: the first of a key is dead-lettered when the wait ends, the later
// ones of that key are parked in order, not dead-lettered too.
func TestQuarantineAfterMissingTopic(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) {
		quarantineMode(cfg)
		cfg.UnknownTopicTimeout = 300 * time.Millisecond
	})
	res := sinktest.NewResults(3)
	for i := range 3 {
		sinktest.Produce(ctx, t, s, keyedRecord("no-such-topic", "a", i, ""), res.Slot(i))
	}
	out := res.All(ctx, t, 3)
	if !out[0].DeadLettered || !out[1].Parked || !out[2].Parked {
		t.Fatalf("outcomes %+v: want dead-lettered, parked, parked", out)
	}
	sinktest.CheckSequence(t, sinktest.Consume(ctx, t, c, parking, 2), 3, 0)
}

// TestParkingRefusalDeadLetters: a record the parking topic refuses is
// dead-lettered as the event it was (its own topic in the topic header, no
// quarantine header); the key's next record is still parked.
func TestParkingRefusalDeadLetters(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	s, _ := sinktest.NewSink(t, c, nil, quarantineMode)
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), topic, dlq, parking)
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == parking && bytes.Contains(b, []byte("poison")) {
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, routerDead("a", 0), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 1, "-poison"), res.Slot(1))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 2, ""), res.Slot(2))
	out := res.All(ctx, t, 3)
	if !out[0].DeadLettered || !out[1].DeadLettered || !out[2].Parked {
		t.Fatalf("outcomes %+v: want dead-lettered, dead-lettered, parked", out)
	}
	dead := sinktest.Consume(ctx, t, c, dlq, 2)
	var refused *kgo.Record
	for _, r := range dead {
		if bytes.HasSuffix(r.Value, []byte("-poison")) {
			refused = r
		}
	}
	if refused == nil {
		t.Fatalf("dead letters %v lack the refused parked record", byKey(dead))
	}
	var keys []string
	for _, h := range refused.Headers {
		keys = append(keys, h.Key)
	}
	if tp, _ := sinktest.Header(refused, "topic"); fmt.Sprint(keys) != "[error topic id]" || tp != topic {
		t.Errorf("refused parked record's headers %v, want error, topic=%s, id", sinktest.HeaderList(refused), topic)
	}
	if p := sinktest.Consume(ctx, t, c, parking, 1)[0]; string(p.Value) != "0002" {
		t.Errorf("parked %q, want 0002", p.Value)
	}
}

// TestEarlierHeldRecordNotParked: a record of aggregate a waits for its
// topic's metadata (the first record to a topic the producer has not
// looked up) when a dead letter of a starts a quarantine; the earlier
// record was produced before the dead letter, so it goes to its own topic
// once the topic is there, and only a's later record is parked. Before, the
// held record was parked behind the dead letter: a redrive would then
// publish the dead letter's event ahead of the event that preceded it
// (found by make demo's contracts step, 2026-12-07).
func TestEarlierHeldRecordNotParked(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) {
		quarantineMode(cfg)
		cfg.UnknownTopicTimeout = time.Minute
	})
	const late = "late-topic"
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, keyedRecord(late, "a", 0, ""), res.Slot(0))
	sinktest.Produce(ctx, t, s, routerDead("a", 1), res.Slot(1))
	if err := c.CreateTopic(late, 1, nil); err != nil {
		t.Fatal(err)
	}
	sinktest.Produce(ctx, t, s, keyedRecord(late, "a", 2, ""), res.Slot(2))
	out := res.All(ctx, t, 3)
	if out[0] != (sink.Outcome{}) || !out[1].DeadLettered || !out[2].Parked {
		t.Fatalf("outcomes %+v: want delivered (produced before the dead letter), dead-lettered, parked", out)
	}
	if got := sinktest.Consume(ctx, t, c, late, 1); string(got[0].Value) != "0000" {
		t.Fatalf("%s holds %q, want the record produced before the dead letter", late, got[0].Value)
	}
}
