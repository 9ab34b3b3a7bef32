package quarantine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

const (
	stateTopic = "outbox.quarantine"
	source     = "7300000000000000001/app/slot"
)

// savedMode turns quarantine on with the state topic.
func savedMode(cfg *sink.Config) {
	quarantineMode(cfg)
	cfg.QuarantineTopic, cfg.QuarantineSource = stateTopic, source
}

// startSaved is a sink in savedMode whose quarantines are restored.
func startSaved(ctx context.Context, t *testing.T, c *kfake.Cluster, tune func(*sink.Config)) *sink.Sink {
	t.Helper()
	s, _ := sinktest.NewSink(t, c, nil, func(cfg *sink.Config) {
		savedMode(cfg)
		if tune != nil {
			tune(cfg)
		}
	})
	if err := s.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines: %v", err)
	}
	return s
}

// noOutcome checks that res has no outcome for a while.
func noOutcome(t *testing.T, res *sinktest.Results, why string) {
	t.Helper()
	select {
	case x := <-res.C():
		t.Fatalf("%s: record %d has an outcome %+v already", why, x.I, x.O)
	case <-time.After(300 * time.Millisecond): // observation window for an absence
	}
}

// stateRecords reads the state topic: key → values in order (nil: tombstone).
func stateRecords(ctx context.Context, t *testing.T, c *kfake.Cluster, n int) map[string][]*quarantine.StateRecord {
	t.Helper()
	out := map[string][]*quarantine.StateRecord{}
	for _, r := range sinktest.Consume(ctx, t, c, stateTopic, n) {
		var q *quarantine.StateRecord
		if r.Value != nil {
			q = new(quarantine.StateRecord)
			if err := json.Unmarshal(r.Value, q); err != nil {
				t.Fatalf("state record %q: %v", r.Value, err)
			}
		}
		out[string(r.Key)] = append(out[string(r.Key)], q)
	}
	return out
}

// TestQuarantineSavedBeforeOutcome: the dead letter that starts a
// quarantine gets its outcome only once the state record is acknowledged,
// and the key's later records wait meanwhile; the record says where the
// dead letter sits and where parking starts.
func TestQuarantineSavedBeforeOutcome(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	s := startSaved(ctx, t, c, nil)
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), topic, dlq, parking, stateTopic)
	var saving atomic.Bool
	saving.Store(true)
	sinktest.Refuse(c, names, nil, func(tp string, _ []byte) int16 {
		if tp == stateTopic && saving.Load() {
			return kerr.NotLeaderForPartition.Code // retried by the client
		}
		return 0
	})
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, routerDead("a", 0), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 1, ""), res.Slot(1))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "b", 2, ""), res.Slot(2))
	x := <-res.C()
	if q := s.Quarantined(); x.I != 2 || x.O != (sink.Outcome{}) || len(q) != 1 {
		t.Fatalf("first outcome: record %d %+v with quarantines %+v, want b delivered, a quarantined", x.I, x.O, q)
	}
	noOutcome(t, res, "state record not acknowledged")
	saving.Store(false)
	out := make([]sink.Outcome, 2)
	for range 2 {
		select {
		case x := <-res.C():
			out[x.I] = x.O
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if !out[0].DeadLettered || !out[1].Parked {
		t.Fatalf("outcomes %+v: want dead-lettered, parked", out)
	}
	dl := sinktest.Consume(ctx, t, c, dlq, 1)[0]
	st := stateRecords(ctx, t, c, 1)[source+"/a"]
	if len(st) != 1 || st[0].State != quarantine.StateQuarantined || st[0].FirstID != "ev-0" || st[0].Key != "a" ||
		st[0].DLQPartition != dl.Partition || st[0].DLQOffset != dl.Offset || len(st[0].ParkingStart) != 3 {
		t.Fatalf("state records %+v, want a quarantined from ev-0 at %s/%d@%d with 3 parking partitions", st, dlq, dl.Partition, dl.Offset)
	}
}

// saveQuarantineOfA runs a sink on c whose router dead letter of event
// ev-0 quarantines key "a" on the state topic, then closes it.
func saveQuarantineOfA(ctx context.Context, t *testing.T, c *kfake.Cluster) {
	t.Helper()
	first, closeFirst := sinktest.NewSink(t, c, nil, savedMode)
	if err := first.StartQuarantines(ctx); err != nil {
		t.Fatal(err)
	}
	res := sinktest.NewResults(1)
	sinktest.Produce(ctx, t, first, routerDead("a", 0), res.Slot(0))
	if o := res.All(ctx, t, 1)[0]; !o.DeadLettered {
		t.Fatalf("outcome %+v, want dead-lettered", o)
	}
	closeFirst()
}

// TestQuarantineRestored: a second sink on the same state topic and source
// restores the quarantine before producing: the key's records are parked,
// others delivered; another source's quarantine is not its own.
func TestQuarantineRestored(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	saveQuarantineOfA(ctx, t, c)
	other := startSaved(ctx, t, c, func(cfg *sink.Config) { cfg.QuarantineSource = "other/app/slot" })
	if q := other.Quarantined(); len(q) != 0 {
		t.Fatalf("another source restored %+v", q)
	}
	restored := new(reported)
	s := startSaved(ctx, t, c, func(cfg *sink.Config) { cfg.Redrives = restored.add })
	if q := s.Quarantined(); len(q) != 1 || q[0].Key != "a" || q[0].FirstID != "ev-0" || restored.String() != "[1]" {
		t.Fatalf("restored %+v (reported %v), want a from ev-0", q, restored)
	}
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 0, ""), res.Slot(0)) // replayed: parked again
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 1, ""), res.Slot(1))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "b", 2, ""), res.Slot(2))
	out := res.All(ctx, t, 3)
	if !out[0].Parked || !out[1].Parked || out[2] != (sink.Outcome{}) || len(s.Quarantined()) != 1 {
		t.Fatalf("outcomes %+v: want parked, parked, delivered", out)
	}
}

// redriveSetup: k's record 0 is refused by topic (as over a limit) while
// refusing is set, so k is quarantined; records 1 and 2 are parked.
func redriveSetup(ctx context.Context, t *testing.T) (*kfake.Cluster, *sink.Sink, *atomic.Bool, *atomic.Bool, *reported) {
	t.Helper()
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	results := new(reported)
	s := startSaved(ctx, t, c, func(cfg *sink.Config) { cfg.Redrives = results.add })
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), topic, dlq, parking, stateTopic)
	var refusing, slow atomic.Bool
	refusing.Store(true)
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		switch {
		case tp == topic && slow.Load():
			return kerr.NotLeaderForPartition.Code // retried: the redrive is under way
		case tp == topic && refusing.Load() && bytes.Contains(b, []byte("poison")):
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 0, "-poison"), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 1, ""), res.Slot(1))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 2, ""), res.Slot(2))
	if out := res.All(ctx, t, 3); !out[0].DeadLettered || !out[1].Parked || !out[2].Parked {
		t.Fatalf("outcomes %+v: want dead-lettered, parked, parked", out)
	}
	return c, s, &refusing, &slow, results
}

// reported collects what Config.Redrives is told, on the sink's goroutines.
type reported struct {
	mu  sync.Mutex
	got []string
}

func (r *reported) add(result string, quarantined int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprint(result, quarantined))
}

func (r *reported) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.got)
}

func stateClient(t *testing.T, c *kfake.Cluster) *quarantine.StateClient {
	t.Helper()
	sc, err := sink.NewStateClient(sink.Config{Brokers: c.ListenAddrs(), ClientID: "redrive-test",
		QuarantineTopic: stateTopic, QuarantineSource: source})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Close)
	return sc
}

// TestRedriveRepublishesInOrder: once the refusal is fixed, a redrive
// republishes the dead letter and the parked records to their topic in
// order; a record of the key produced during the redrive waits and follows
// them; the quarantine is lifted with a tombstone.
func TestRedriveRepublishesInOrder(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, s, refusing, slow, results := redriveSetup(ctx, t)
	refusing.Store(false)
	slow.Store(true)
	sc := stateClient(t, c)
	answer := make(chan error, 1)
	go func() { answer <- sc.Redrive(ctx, "k", false) }()
	// The connector takes the request; its republishing is held up by
	// slow, and a new record of the key waits.
	waitUntil(ctx, t, "the redrive holds the key", func() bool { return s.Holding("k") })
	res := sinktest.NewResults(1)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 3, ""), res.Slot(0))
	noOutcome(t, res, "record produced during the redrive")
	slow.Store(false)
	if err := <-answer; err != nil {
		t.Fatalf("redrive: %v", err)
	}
	if o := res.All(ctx, t, 1)[0]; o.Parked || o.DeadLettered || o.Err != nil {
		t.Errorf("record produced during the redrive: outcome %+v, want delivered", o)
	}
	got := byKey(sinktest.Consume(ctx, t, c, topic, 4))["k"]
	if fmt.Sprint(got) != "[0000-poison 0001 0002 0003]" {
		t.Fatalf("topic holds k %v, want the dead letter, the parked records and the held one, in order", got)
	}
	for _, r := range sinktest.Consume(ctx, t, c, topic, 4) {
		if _, ok := sinktest.Header(r, quarantine.Header); ok || len(r.Headers) != 1 {
			t.Errorf("republished %q has headers %v, want only its id", r.Value, sinktest.HeaderList(r))
		}
	}
	if q := s.Quarantined(); len(q) != 0 {
		t.Errorf("still quarantined: %+v", q)
	}
	st := stateRecords(ctx, t, c, 3)[source+"/k"]
	if len(st) != 3 || st[1].State != quarantine.StateRedrive || st[2] != nil {
		t.Errorf("state records %+v, want quarantined, request, tombstone", st)
	}
	waitUntil(ctx, t, "the redrive counted", func() bool { return results.String() == "[0 1 redriven0]" })
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestRedriveSkip: --skip republishes the parked records only.
func TestRedriveSkip(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, s, _, _, results := redriveSetup(ctx, t)
	if err := stateClient(t, c).Redrive(ctx, "k", true); err != nil {
		t.Fatalf("redrive --skip: %v", err)
	}
	if got := byKey(sinktest.Consume(ctx, t, c, topic, 2))["k"]; fmt.Sprint(got) != "[0001 0002]" {
		t.Fatalf("topic holds k %v, want the parked records only", got)
	}
	if q := s.Quarantined(); len(q) != 0 {
		t.Errorf("still quarantined: %+v", q)
	}
	waitUntil(ctx, t, "the skip counted", func() bool { return results.String() == "[0 1 skipped0]" })
}

// TestRedriveRefusedAgain: a redriven record refused again ends the
// redrive with a failure record naming the refusal; the quarantine stays
// and the key's next record is parked; nothing reached the topic.
func TestRedriveRefusedAgain(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c, s, _, _, results := redriveSetup(ctx, t)
	err := stateClient(t, c).Redrive(ctx, "k", false)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("POLICY_VIOLATION")) {
		t.Fatalf("redrive: %v, want the refusal", err)
	}
	if q := s.Quarantined(); len(q) != 1 || s.Holding("k") {
		t.Fatalf("quarantined %+v (holding %v), want k, not holding", q, s.Holding("k"))
	}
	res := sinktest.NewResults(1)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 3, ""), res.Slot(0))
	if o := res.All(ctx, t, 1)[0]; !o.Parked {
		t.Errorf("record after a failed redrive: %+v, want parked", o)
	}
	sinktest.Consume(ctx, t, c, topic, 0)
	st := stateRecords(ctx, t, c, 3)[source+"/k"]
	if len(st) != 3 || st[2] == nil || st[2].State != quarantine.StateFailed || st[2].FirstID != "ev-0" {
		t.Errorf("state records %+v, want quarantined, request, failed", st)
	}
	waitUntil(ctx, t, "the failure counted", func() bool { return results.String() == "[0 1 failed1]" })
}

// TestRedriveOnlyByTheOwner: a standby sharing the slot (and so the state
// topic's keys) follows the active one's quarantines and lifts, and
// carries out no request until it owns the slot; then it carries out the
// request the active one left.
func TestRedriveOnlyByTheOwner(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	var owns atomic.Bool
	standby := startSaved(ctx, t, c, func(cfg *sink.Config) { cfg.Owner = owns.Load })
	active, closeActive := sinktest.NewSink(t, c, nil, savedMode)
	if err := active.StartQuarantines(ctx); err != nil {
		t.Fatal(err)
	}
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), topic, dlq, parking, stateTopic)
	var refusing atomic.Bool
	refusing.Store(true)
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == topic && refusing.Load() && bytes.Contains(b, []byte("poison")) {
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	quarantine := func(key string) {
		t.Helper()
		res := sinktest.NewResults(2)
		sinktest.Produce(ctx, t, active, keyedRecord(topic, key, 0, "-poison"), res.Slot(0))
		sinktest.Produce(ctx, t, active, keyedRecord(topic, key, 1, ""), res.Slot(1))
		if out := res.All(ctx, t, 2); !out[0].DeadLettered || !out[1].Parked {
			t.Fatalf("%s: outcomes %+v, want dead-lettered, parked", key, out)
		}
		waitUntil(ctx, t, "the standby follows the quarantine of "+key, func() bool { return standby.Holding(key) || len(standby.Quarantined()) > 0 })
	}
	quarantine("k")
	refusing.Store(false)
	sc := stateClient(t, c)
	if err := sc.Redrive(ctx, "k", false); err != nil {
		t.Fatalf("redrive k: %v", err)
	}
	waitUntil(ctx, t, "the standby follows the lift", func() bool { return len(standby.Quarantined()) == 0 })

	refusing.Store(true)
	quarantine("j")
	refusing.Store(false)
	closeActive()
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := sc.Redrive(short, "j", false); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("redrive j with no owner: %v, want it pending", err)
	}
	if q := standby.Quarantined(); len(q) != 1 || q[0].Key != "j" {
		t.Fatalf("the standby carried out a request without the slot: quarantined %+v", q)
	}
	owns.Store(true)
	waitUntil(ctx, t, "the new owner carries out the request", func() bool { return len(standby.Quarantined()) == 0 })
	if got := byKey(sinktest.Consume(ctx, t, c, topic, 4)); fmt.Sprint(got) != "map[j:[0000-poison 0001] k:[0000-poison 0001]]" {
		t.Fatalf("topic holds %v", got)
	}
}

// TestQuarantineRestoreWaitsForKafka: a Kafka that cannot be used at start
// does not stop it (the producer would wait too), but no record reaches the
// client before the saved set is restored: a record of a quarantined key
// produced meanwhile is parked once Kafka answers, never delivered.
func TestQuarantineRestoreWaitsForKafka(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	saveQuarantineOfA(ctx, t, c)

	// The next start finds the state topic unreadable: its configs cannot
	// be described until refusing is cleared.
	var refusing atomic.Bool
	refusing.Store(true)
	c.ControlKey(int16(kmsg.DescribeConfigs), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refusing.Load() {
			return nil, nil, false
		}
		req := kreq.(*kmsg.DescribeConfigsRequest)
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range req.Resources {
			r := kmsg.NewDescribeConfigsResponseResource()
			r.ResourceType, r.ResourceName = rr.ResourceType, rr.ResourceName
			r.ErrorCode = kerr.TopicAuthorizationFailed.Code // not yet granted
			resp.Resources = append(resp.Resources, r)
		}
		return resp, nil, true
	})
	s, _ := sinktest.NewSink(t, c, nil, savedMode)
	if err := s.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines with the state topic unreadable: %v; want the start to go on", err)
	}
	res := sinktest.NewResults(2)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 1, ""), res.Slot(0)) // quarantined in the saved set
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "b", 2, ""), res.Slot(1))
	noOutcome(t, res, "before the restore")
	refusing.Store(false)
	if out := res.All(ctx, t, 2); !out[0].Parked || out[1].Parked || out[1].Err != nil || out[1].DeadLettered {
		t.Fatalf("outcomes %+v: want a parked and b delivered", out)
	}
	if q := s.Quarantined(); len(q) != 1 || q[0].Key != "a" || q[0].FirstID != "ev-0" {
		t.Fatalf("restored %+v, want a from ev-0", q)
	}
}

// TestStateTopicCompactDeleteRefused: a quarantine state topic that
// compacts but also deletes after seven days would forget a quarantine
// older than that; the start refuses it, as a delete-only topic.
func TestStateTopicCompactDeleteRefused(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	s, _ := sinktest.NewSink(t, c, nil, savedMode)
	sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), stateTopic, map[string]string{"cleanup.policy": "compact,delete", "retention.ms": "604800000"})
	var nc *quarantine.NotCompactedError
	if err := s.StartQuarantines(ctx); !errors.As(err, &nc) {
		t.Fatalf("StartQuarantines = %v, want a NotCompactedError", err)
	}
}
