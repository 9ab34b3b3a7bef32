package exactlyonce_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReview7FailedClaimLeavesLazyClient (review7, DUPLICATE and BOTH
// COMMIT).
//
// Path: instance A's commit of b1 b2 b3 (txn 2) completes on the broker
// but its answer is lost; the settle's producer-id reload is refused as
// fenced (KIP-890 epoch bump; forged, kfake accepts it), so settleFenced
// reads the position (A's own, txn 2) and claims. claim replaces t.cl by
// a new client (renewClient) and only then calls cl.ProducerID; that
// InitProducerId fails once with a retriable error (REQUEST_TIMED_OUT: a
// coordinator under a broker fault). franz-go keeps no id (keep=false),
// claim returns a plain error, the settle is not fatal and t.unsure stays.
// Meanwhile a real takeover B starts (fence, read: A's txn 2), is handed
// c1 by its stream and commits it (txn 3, instance B). A's next try runs
// wasCommitted on the claimed client: EndTransaction(TryAbort) is a no-op
// (not in a transaction), cl.ProducerID initializes the id LAZILY, which
// fences B, and the position read after it (B's, txn 3) goes only through
// learned(): no another() check. A carries on with a valid epoch and
// commits c1 again; B is fenced.
//
// Expected: A finds B's position after its own InitProducerId and stops
// (fenced), B goes on, read_committed sees c1 once.
// Observed at 438b3f8: c1 twice (A and B both committed), A healthy.
// The same root (the check of a claim is not redone when the claim fails
// after renewClient) reaches afterTimeout too: its next try begins a
// transaction on the uninitialized client, whose first produce
// initializes the id with no read at all.
func TestReview7FailedClaimLeavesLazyClient(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	d := &cutEndTxn{refusal: time.Second}
	hold := newReview7Hold(uint16(kmsg.InitProducerID), d.dial)
	failedA := make(chan error, 4)
	a, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.FenceCheck = 100 * time.Millisecond
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(hold.dial))
		cfg.Fail = func(err error) { failedA <- err }
	})
	release := sync.OnceFunc(func() { close(hold.release) })
	t.Cleanup(release) // before A's Close

	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, a, done, 100, "one", "a1", "a2")
	okOutcomes(ctx, t, done, 2)

	var forged, claimFailed atomic.Bool
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.InitProducerIDRequest)
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		switch {
		case !d.cut.Load():
			return nil, nil, false
		case r.ProducerID >= 0 && forged.CompareAndSwap(false, true):
			// The settle's reload at the client's epoch: a broker
			// refuses it after the commit bumped the epoch.
			resp.ErrorCode = kerr.ProducerFenced.Code
			return resp, nil, true
		case r.ProducerID < 0 && forged.Load() && claimFailed.CompareAndSwap(false, true):
			// The claim's InitProducerId: a transient failure.
			hold.armed.Store(true) // A's next InitProducerId waits for the takeover
			resp.ErrorCode = kerr.RequestTimedOut.Code
			return resp, nil, true
		}
		return nil, nil, false
	})
	d.armed.Store(true)
	produceTxn(ctx, t, a, done, 200, "one", "b1", "b2", "b3")

	// A's next InitProducerId (after its failed claim) is held.
	select {
	case <-hold.entered:
	case err := <-failedA:
		t.Fatalf("A failed before its claim was retried: %v", err)
	case <-ctx.Done():
		t.Fatalf("A never sent an InitProducerId after the failed claim (forged %v, claim failed %v)", forged.Load(), claimFailed.Load())
	}
	// A's stream had handed it c1 before the slot was lost.
	doneAc := sinktest.NewOutcomes()
	produceTxn(ctx, t, a, doneAc, 300, "one", "c1")

	// B takes the slot and the id over and commits c1 (from A's txn 2 at 200).
	failedB := make(chan error, 4)
	b, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Fail = func(err error) { failedB <- err }
	})
	doneB := sinktest.NewOutcomes()
	produceTxn(ctx, t, b, doneB, 300, "one", "c1")
	okOutcomes(ctx, t, doneB, 1)

	release()
	var aErr error
	select {
	case aErr = <-failedA:
	case o := <-doneAc.C():
		aErr = o.Err
		if o.Err == nil {
			// A committed after B.
			produceTxn(ctx, t, b, doneB, 400, "one", "d1")
			var bErr error
			select {
			case bErr = <-failedB:
			case ob := <-doneB.C():
				bErr = ob.Err
			case <-ctx.Done():
				t.Fatal("B: no outcome for d1")
			}
			t.Fatalf("A, whose id B had taken over and committed under, committed c1 after its lazy InitProducerId; "+
				"read_committed sees %v (want c1 once); B's next commit: %v",
				values(readCommitted(ctx, t, c, "one", true, false)), bErr)
		}
	case <-ctx.Done():
		t.Fatal("A: no outcome and no fatal error after the takeover")
	}
	var fenced *kafka.FencedError
	if !errors.As(aErr, &fenced) {
		t.Fatalf("A stopped with %v, want a fence", aErr)
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 b1 b2 b3 c1]" {
		t.Fatalf("read_committed sees %s, want [a1 a2 b1 b2 b3 c1]", got)
	}
}
