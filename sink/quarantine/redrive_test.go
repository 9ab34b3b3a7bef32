package quarantine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// writeRequest writes on the state topic the request the command builds
// from rec (a record it listed): rec with its state set to state.
func writeRequest(ctx context.Context, t *testing.T, c *kfake.Cluster, rec quarantine.StateRecord, state string) {
	t.Helper()
	now := time.Now().UTC()
	rec.State, rec.Requested, rec.Failure = state, &now, ""
	v, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := &kgo.Record{Topic: stateTopic, Key: []byte(source + "/" + rec.Key), Value: v}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatalf("write the request: %v", err)
	}
}

// listed is key's quarantine as outbox-cdc redrive --list reads it.
func listed(ctx context.Context, t *testing.T, sc *quarantine.StateClient, key string) quarantine.StateRecord {
	t.Helper()
	all, err := sc.List(ctx)
	if err != nil || all[key] == nil {
		t.Fatalf("list: %v %v, want %s", all, err, key)
	}
	return *all[key]
}

// TestRedriveRequestMatchesItsQuarantine: a request carries the quarantine
// it was written for (its first event id). One that arrives after that
// quarantine was lifted (a command that listed it just before another
// operator's redrive) lifts nothing: a newer quarantine of the key stays
// with a failure naming both, and with none the answer is that the
// aggregate is not quarantined, with nothing republished again.
func TestRedriveRequestMatchesItsQuarantine(t *testing.T) {
	t.Run("a newer quarantine", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c, s, refusing, _, results := redriveSetup(ctx, t)
		sc := stateClient(t, c)
		old := listed(ctx, t, sc, "k")
		refusing.Store(false)
		if err := sc.Redrive(ctx, "k", false); err != nil {
			t.Fatalf("redrive: %v", err)
		}
		refusing.Store(true)
		res := sinktest.NewResults(2)
		sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 3, "-poison"), res.Slot(0))
		sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 4, ""), res.Slot(1))
		if out := res.All(ctx, t, 2); !out[0].DeadLettered || !out[1].Parked {
			t.Fatalf("outcomes %+v: want a new quarantine from ev-3", out)
		}
		writeRequest(ctx, t, c, old, quarantine.StateSkip) // the stale --skip
		// quarantined, request, tombstone, quarantined, stale request, answer
		st := stateRecords(ctx, t, c, 6)[source+"/k"]
		last := st[len(st)-1]
		if last == nil || last.State != quarantine.StateFailed || last.FirstID != "ev-3" ||
			!strings.Contains(last.Failure, "ev-0") || !strings.Contains(last.Failure, "ev-3") {
			t.Fatalf("answer %+v, want a failure of the quarantine from ev-3 naming ev-0 and ev-3", last)
		}
		if q := s.Quarantined(); len(q) != 1 || q[0].FirstID != "ev-3" || s.Holding("k") {
			t.Fatalf("quarantined %+v (holding %v), want k from ev-3", q, s.Holding("k"))
		}
		if got := byKey(sinktest.Consume(ctx, t, c, topic, 3))["k"]; fmt.Sprint(got) != "[0000-poison 0001 0002]" {
			t.Fatalf("topic holds k %v, want only the first redrive's records", got)
		}
		waitUntil(ctx, t, "the refusal counted", func() bool { return strings.HasSuffix(results.String(), "failed1]") })
	})
	t.Run("lifted already", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c, s, refusing, _, _ := redriveSetup(ctx, t)
		sc := stateClient(t, c)
		old := listed(ctx, t, sc, "k")
		refusing.Store(false)
		if err := sc.Redrive(ctx, "k", false); err != nil {
			t.Fatalf("redrive: %v", err)
		}
		writeRequest(ctx, t, c, old, quarantine.StateRedrive)
		// quarantined, request, tombstone, stale request, answer
		if st := stateRecords(ctx, t, c, 5)[source+"/k"]; st[len(st)-1] != nil {
			t.Fatalf("answer %+v, want a tombstone (not quarantined)", st[len(st)-1])
		}
		res := sinktest.NewResults(1)
		sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 3, ""), res.Slot(0))
		if o := res.All(ctx, t, 1)[0]; o != (sink.Outcome{}) {
			t.Fatalf("record after the stale request: %+v, want delivered", o)
		}
		if got := byKey(sinktest.Consume(ctx, t, c, topic, 4))["k"]; fmt.Sprint(got) != "[0000-poison 0001 0002 0003]" {
			t.Fatalf("topic holds k %v, want the first redrive's records and the new one, once each", got)
		}
		if q := s.Quarantined(); len(q) != 0 {
			t.Fatalf("quarantined %+v, want none", q)
		}
	})
}

// TestRedriveDeadLetterDeleted: a dead letter retention deleted (the
// dead-letter partition's log start past it) ends the redrive with a
// failure saying so and naming --skip, and does not wait for ever for a
// record that is gone; --skip then lifts the quarantine.
func TestRedriveDeadLetterDeleted(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, _, refusing, _, _ := redriveSetup(ctx, t)
	refusing.Store(false)
	adm := kadm.NewClient(sinktest.Admin(t, c))
	ends, err := adm.ListEndOffsets(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	to := kadm.Offsets{}
	ends.Each(func(o kadm.ListedOffset) { to.AddOffset(dlq, o.Partition, o.Offset, -1) })
	if resp, err := adm.DeleteRecords(ctx, to); err != nil || resp.Error() != nil {
		t.Fatalf("delete records: %v %v", err, resp.Error())
	}
	sc := stateClient(t, c)
	answer, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = sc.Redrive(answer, "k", false)
	if err == nil || !strings.Contains(err.Error(), "is gone") || !strings.Contains(err.Error(), "--skip") {
		t.Fatalf("redrive of a deleted dead letter: %v, want a failure saying it is gone and naming --skip", err)
	}
	if err := sc.Redrive(ctx, "k", true); err != nil {
		t.Fatalf("redrive --skip: %v", err)
	}
	if got := byKey(sinktest.Consume(ctx, t, c, topic, 2))["k"]; fmt.Sprint(got) != "[0001 0002]" {
		t.Fatalf("topic holds k %v, want the parked records", got)
	}
}

// TestRedriveAnswersEachRequest: a second request written while the first
// is carried out is not dropped by the first one's answer, and each command
// gets its own: the first fails (its dead letter refused again), the
// second (--skip) lifts the quarantine.
func TestRedriveAnswersEachRequest(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, s, _, slow, _ := redriveSetup(ctx, t)
	slow.Store(true) // the first redrive waits in its republishing
	sc := stateClient(t, c)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- sc.Redrive(ctx, "k", false) }()
	waitUntil(ctx, t, "the first redrive under way", func() bool { return s.Holding("k") })
	sc2 := stateClient(t, c)
	go func() { second <- sc2.Redrive(ctx, "k", true) }()
	stateRecords(ctx, t, c, 3) // quarantined, first request, second request
	slow.Store(false)
	if err := <-first; err == nil || !strings.Contains(err.Error(), "POLICY_VIOLATION") {
		t.Fatalf("first redrive: %v, want its dead letter's refusal", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second redrive (--skip): %v, want the quarantine lifted", err)
	}
	if got := byKey(sinktest.Consume(ctx, t, c, topic, 2))["k"]; fmt.Sprint(got) != "[0001 0002]" {
		t.Fatalf("topic holds k %v, want the parked records", got)
	}
	if q := s.Quarantined(); len(q) != 0 {
		t.Fatalf("quarantined %+v, want none", q)
	}
}

// TestRedriveParkingTopicRecreated: a parking topic deleted and created
// again since the quarantine began holds none of its parked records: the
// redrive refuses, naming that, rather than lift the quarantine with
// nothing republished; --skip lifts it.
func TestRedriveParkingTopicRecreated(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, s, refusing, _, _ := redriveSetup(ctx, t)
	refusing.Store(false)
	adm := kadm.NewClient(sinktest.Admin(t, c))
	if resp, err := adm.DeleteTopics(ctx, parking); err != nil || resp.Error() != nil {
		t.Fatalf("delete %s: %v %v", parking, err, resp.Error())
	}
	waitUntil(ctx, t, "the parking topic created again", func() bool {
		resp, err := adm.CreateTopic(ctx, 3, 1, nil, parking)
		return err == nil && resp.Err == nil
	})
	sc := stateClient(t, c)
	err := sc.Redrive(ctx, "k", false)
	if err == nil || !strings.Contains(err.Error(), "created again") || !strings.Contains(err.Error(), "--skip") {
		t.Fatalf("redrive after the parking topic was created again: %v, want a refusal saying so and naming --skip", err)
	}
	if q := s.Quarantined(); len(q) != 1 {
		t.Fatalf("quarantined %+v, want k", q)
	}
	if err := sc.Redrive(ctx, "k", true); err != nil {
		t.Fatalf("redrive --skip: %v", err)
	}
	sinktest.Consume(ctx, t, c, topic, 0)
}
