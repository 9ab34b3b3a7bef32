package exactlyonce_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// TestReview5LateRequestRestoredRedrivesTwice: outbox-cdc redrive lists
// the quarantine, then writes its request (stateclient.go Redrive). When
// the connector lifted the quarantine in between (another operator's
// request, a retry of a CLI that timed out) the request lands after the
// tombstone. A running connector answers it with a tombstone again
// (txn.go answerLifted); a connector that stops first (deploy, crash)
// restores the request as k's quarantine at its next start (state.go
// restore installs every latest record, a request too) and carries it
// out: the lifted quarantine's parked records are read again from its
// parking start and republished a second time. read_committed consumers
// see e2 twice: DUPLICATE (claim 3), and k's new events are parked
// meanwhile behind a quarantine that was lifted.
func TestReview5LateRequestRestoredRedrivesTwice(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)
	cfg := r5Config(c)
	tx, close1 := r5Txn(ctx, t, cfg)
	r5Hand(ctx, t, tx, 100, r5Event(r5Small, "k", "e1", true), r5Event(r5Small, "k", "e2", false))
	st := r5States(ctx, t, c, "k")
	saved := *st[len(st)-1] // what the late CLI listed

	if err := r5Redrive(ctx, t, cfg.Sink, "k", true); err != nil {
		t.Fatalf("redrive: %v", err)
	}
	if got := r5IDs(readCommitted(ctx, t, c, r5Small, true, false), "k"); !slices.Equal(got, []string{"e2"}) {
		t.Fatalf("after the redrive %s holds %v of k, want [e2]", r5Small, got)
	}
	close1()

	// The second CLI's request, written after the tombstone, while the
	// connector is stopped.
	now := time.Now().UTC()
	saved.State, saved.Requested = quarantine.StateSkip, &now
	v, err := json.Marshal(&saved)
	if err != nil {
		t.Fatal(err)
	}
	if err := sinktest.Admin(t, c).ProduceSync(ctx, &kgo.Record{Topic: r5State, Key: []byte(r5Source + "/k"), Value: v}).FirstErr(); err != nil {
		t.Fatalf("request: %v", err)
	}

	tx2, _ := r5Txn(ctx, t, cfg)
	// A new event of k: it must go to its topic, after e2.
	out := r5Hand(ctx, t, tx2, 300, r5Event(r5Small, "k", "e3", false))
	deadline := time.Now().Add(3 * time.Second)
	var got []string
	for time.Now().Before(deadline) {
		got = r5IDs(readCommitted(ctx, t, c, r5Small, true, false), "k")
		if len(got) >= 2 && st != nil {
			st = r5States(ctx, t, c, "k")
			if st[len(st)-1] == nil {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(got, []string{"e2", "e3"}) {
		t.Fatalf("%s holds %v of k, want [e2 e3] (e3 outcome %+v): a lifted quarantine came back from a late request and was redriven again",
			r5Small, got, out[0])
	}
}
