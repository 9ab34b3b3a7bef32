package exactlyonce_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReview5QuarantineBasics: the baseline the other tests build on. A
// too-large event of k is dead-lettered and begins a quarantine; the next
// event of k is parked, both with the state record, in one transaction.
func TestReview5QuarantineBasics(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)
	tx, _ := r5Txn(ctx, t, r5Config(c))
	out := r5Hand(ctx, t, tx, 100, r5Event(r5Small, "k", "e1", true), r5Event(r5Small, "k", "e2", false))
	if !out[0].DeadLettered || !out[1].Parked {
		t.Fatalf("outcomes %+v, want dead-lettered then parked", out)
	}
	if got := r5IDs(readCommitted(ctx, t, c, r5Parking, true, false), "k"); !slices.Equal(got, []string{"e2"}) {
		t.Fatalf("parking holds %v, want [e2]", got)
	}
	st := r5States(ctx, t, c, "k")
	if len(st) != 1 || st[0] == nil || st[0].FirstID != "e1" {
		t.Fatalf("state records %+v", st)
	}
}

// TestReview5RestoreLaterRoutesWithEmptySet: the quarantine set of the
// transactional producer is restored from the state topic by
// quarantine.Set.Start; when its first read fails (Kafka slow or the state
// topic unreadable for 10s), Start returns nil and restores later
// (state.go restoreLater). The idempotent sink holds its records until
// Ready; the transactional producer's route (quarantine.go route,
// quarantinedKey → Set.Lookup) never waits for it, so meanwhile it routes
// with an empty set: a later event of a quarantined key goes to its own
// topic ahead of the parked ones (ORDER), and a second dead letter of the
// key begins a new quarantine whose state record replaces the first one's
// on the compacted topic, so that no redrive ever republishes the first
// quarantine's dead letter and parked events (LOSS).
func TestReview5RestoreLaterRoutesWithEmptySet(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)

	// Run 1: k quarantined by e1, e2 parked.
	tx1, close1 := r5Txn(ctx, t, r5Config(c))
	r5Hand(ctx, t, tx1, 100, r5Event(r5Small, "k", "e1", true), r5Event(r5Small, "k", "e2", false))
	close1()

	// Run 2: the state topic cannot be described for a while.
	var blocked atomic.Bool
	blocked.Store(true)
	c.ControlKey(int16(kmsg.DescribeConfigs), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.DescribeConfigsRequest)
		if !blocked.Load() || len(req.Resources) != 1 || req.Resources[0].ResourceName != r5State {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		rr := kmsg.NewDescribeConfigsResponseResource()
		rr.ResourceType, rr.ResourceName = req.Resources[0].ResourceType, r5State
		rr.ErrorCode = kerr.UnknownServerError.Code
		resp.Resources = append(resp.Resources, rr)
		return resp, nil, true
	})
	tx2, close2 := r5Txn(ctx, t, r5Config(c))
	// The restore is retried (restoreLater); events wait for it, so the
	// block ends while they are handed over.
	unblock := time.AfterFunc(2*time.Second, func() { blocked.Store(false) })
	defer unblock.Stop()
	out := r5Hand(ctx, t, tx2, 200, r5Event(r5Small, "k", "e3", false))
	out = append(out, r5Hand(ctx, t, tx2, 300, r5Event(r5Small, "k", "e4", true), r5Event(r5Small, "k", "e5", false))...)
	if blocked.Load() {
		t.Fatal("outcomes came while the state topic could not be read: the test tested nothing")
	}
	close2()

	var problems []string
	if onTopic := r5IDs(readCommitted(ctx, t, c, r5Small, true, false), "k"); len(onTopic) > 0 {
		problems = append(problems, "ORDER: events "+join(onTopic)+" of quarantined k are on their own topic while e2 is parked")
	}
	st := r5States(ctx, t, c, "k")
	if last := st[len(st)-1]; last != nil && last.FirstID != "e1" {
		problems = append(problems, "LOSS: k's state record now names the quarantine of "+last.FirstID+
			"; the quarantine of e1 (dead letter e1, parked e2) has no state record left for a redrive")
	}
	if len(problems) > 0 {
		t.Fatalf("outcomes %+v:\n%s", out, join(problems))
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "; "
		}
		out += x
	}
	return out
}
