package exactlyonce_test

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// TestReview5AnswerLiftedTombstonesNewQuarantine: a redrive request for a
// key that is not quarantined (a late or repeated request: the CLI listed
// the quarantine before it was lifted) is answered with a tombstone
// (txn.go redriveTxn → answerLifted → writeStateTxn). redriveTxn reads the
// set outside commitMu (txn.go:190) and the tombstone's Transact runs
// later, under it; a commit in progress meanwhile that begins a new
// quarantine of the key (a new dead letter) settles it first (Saved), and
// the tombstone then lands after the new quarantine's state record. The
// set keeps the quarantine in memory (the connector parks under it), but
// the compacted state topic says the key is not quarantined:
// outbox-cdc redrive refuses (not quarantined), and the next start
// restores nothing, so the new dead letter and the events parked behind
// it are never republished (LOSS), and the key's next events go to their
// topic ahead of them (ORDER).
func TestReview5AnswerLiftedTombstonesNewQuarantine(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	cfg := r5Config(c)
	tx, _ := r5Txn(ctx, t, cfg)

	// Q1 of k, redriven (--skip): k is not quarantined any more.
	r5Hand(ctx, t, tx, 100, r5Event(r5Small, "k", "e1", true), r5Event(r5Small, "k", "e2", false))
	st := r5States(ctx, t, c, "k")
	late := *st[len(st)-1] // what a second CLI listed before the lift
	if err := r5Redrive(ctx, t, cfg.Sink, "k", true); err != nil {
		t.Fatalf("redrive: %v", err)
	}

	// The next commit, which begins Q2 with dead letter e3, is slow: its
	// dead letter's produce (before its state record) waits.
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), dlq)
	var armed atomic.Bool
	stalled := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		toDLQ := false
		for _, rt := range req.Topics {
			if rt.Topic == dlq || names[rt.TopicID] == dlq {
				toDLQ = true
			}
		}
		if !toDLQ || !armed.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		stalled <- struct{}{}
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	armed.Store(true)
	res := sinktest.NewResults(1)
	if err := tx.Produce(ctx, r5Event(r5Small, "k", "e3", true), res.Slot(0)); err != nil {
		t.Fatalf("produce: %v", err)
	}
	tx.EndTxn(300)
	select {
	case <-stalled:
	case <-ctx.Done():
		t.Fatalf("no commit: %v", ctx.Err())
	}

	// The late request arrives meanwhile (no transaction holds the state
	// topic's end yet); the connector finds k not quarantined and waits for
	// commitMu to answer it.
	now := time.Now().UTC()
	late.State, late.Requested = quarantine.StateSkip, &now
	v, _ := json.Marshal(&late)
	if err := sinktest.Admin(t, c).ProduceSync(ctx, &kgo.Record{Topic: r5State, Key: []byte(r5Source + "/k"), Value: v}).FirstErr(); err != nil {
		t.Fatalf("request: %v", err)
	}
	time.Sleep(2500 * time.Millisecond) // the follower's poll is bounded by a second
	close(release)
	if out := res.All(ctx, t, 1); !out[0].DeadLettered {
		t.Fatalf("e3: %+v, want dead-lettered", out[0])
	}
	// e4 of k: parked behind e3, the connector's set says.
	if out := r5Hand(ctx, t, tx, 400, r5Event(r5Small, "k", "e4", false)); !out[0].Parked {
		t.Fatalf("e4: %+v, want parked", out[0])
	}

	var last *quarantine.StateRecord
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		st = r5States(ctx, t, c, "k")
		if last = st[len(st)-1]; last == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i, s := range st {
		if s == nil {
			t.Logf("state %d: tombstone", i)
		} else {
			t.Logf("state %d: %s %s", i, s.State, s.FirstID)
		}
	}
	if last == nil || last.FirstID != "e3" {
		err := r5Redrive(ctx, t, cfg.Sink, "k", false)
		t.Fatalf("LOSS: k's last state record is %+v (nil: a tombstone), after Q2 (dead letter e3, e4 parked) began; "+
			"outbox-cdc redrive k answers %v (not quarantined: %v); a restart restores no quarantine of k",
			last, err, errors.Is(err, quarantine.ErrNotQuarantined))
	}
}
