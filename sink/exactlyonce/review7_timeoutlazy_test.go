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

// TestReview7TimeoutClaimFailsThenUncheckedInit (review7, DUPLICATE and
// BOTH COMMIT).
//
// Path: A's Kafka transaction (a b c, txn 2) outlasts the transaction
// timeout; the coordinator aborts it. timedOut → afterTimeout: takenOver
// reads the position twice (A's own txn 1: no takeover yet), clears
// t.unsure and puts a b c back in *b, then claim: renewClient swaps in a
// new client, whose InitProducerId fails once (REQUEST_TIMED_OUT).
// afterTimeout returns the error, commitBatch backs off and tries again:
// attempt → BeginTransaction → Produce on the claimed client, which
// initializes its producer id lazily — no read of the position at all.
// If a takeover B (slot free, A cut from PostgreSQL) has meanwhile fenced
// A, streamed from A's txn 1 and committed a b c, A's lazy InitProducerId
// fences B and A commits a b c again.
//
// Expected: A's next InitProducerId is followed by a position read that
// finds B's commit; A stops fenced, a b c once.
// Observed at 438b3f8: a b c twice, B fenced, A healthy.
func TestReview7TimeoutClaimFailsThenUncheckedInit(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	gate := newEndTxnGate()
	hold := newReview7Hold(uint16(kmsg.InitProducerID), gate.dial)
	failedA := make(chan error, 4)
	a, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.TransactionTimeout = time.Second
		cfg.FenceCheck = 500 * time.Millisecond
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(hold.dial))
		cfg.Fail = func(err error) { failedA <- err }
	})
	releaseInit := sync.OnceFunc(func() { close(hold.release) })
	releaseEnd := sync.OnceFunc(func() { close(gate.release) })
	t.Cleanup(releaseInit)
	t.Cleanup(releaseEnd)

	doneA := sinktest.NewOutcomes()
	produceTxn(ctx, t, a, doneA, 100, "one", "w")
	okOutcomes(ctx, t, doneA, 1)

	var timedOut, claimFailed atomic.Bool
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.InitProducerIDRequest)
		if r.ProducerID >= 0 || !timedOut.Load() || !claimFailed.CompareAndSwap(false, true) {
			return nil, nil, false
		}
		// The claim's InitProducerId: a transient failure.
		hold.armed.Store(true) // A's next InitProducerId waits for the takeover
		resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = kerr.RequestTimedOut.Code
		return resp, nil, true
	})

	gate.arm()
	produceTxn(ctx, t, a, doneA, 200, "one", "a", "b", "c")
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("A's EndTxn never came")
	}
	time.Sleep(1300 * time.Millisecond) // past the transaction timeout: the coordinator aborts it
	timedOut.Store(true)
	releaseEnd()

	select {
	case <-hold.entered:
	case err := <-failedA:
		t.Fatalf("A failed before its claim was retried: %v", err)
	case o := <-doneA.C():
		t.Fatalf("A: outcome %+v before its claim was retried (claim failed %v)", o, claimFailed.Load())
	case <-ctx.Done():
		t.Fatalf("A never sent an InitProducerId after the failed claim (claim failed %v)", claimFailed.Load())
	}

	// B takes the slot and the id over, streams from A's txn 1 (100) and
	// commits a b c.
	failedB := make(chan error, 4)
	b, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Fail = func(err error) { failedB <- err }
	})
	doneB := sinktest.NewOutcomes()
	produceTxn(ctx, t, b, doneB, 200, "one", "a", "b", "c")
	okOutcomes(ctx, t, doneB, 3)

	releaseInit()
	var aErr error
	for range 3 {
		select {
		case aErr = <-failedA:
		case o := <-doneA.C():
			aErr = o.Err
		case <-ctx.Done():
			t.Fatal("A: no outcome and no fatal error after the takeover")
		}
		if aErr != nil {
			break
		}
	}
	if aErr == nil {
		produceTxn(ctx, t, b, doneB, 300, "one", "d")
		var bErr error
		select {
		case bErr = <-failedB:
		case ob := <-doneB.C():
			bErr = ob.Err
		case <-ctx.Done():
			t.Fatal("B: no outcome for d")
		}
		t.Fatalf("A, taken over, committed a b c after a lazy InitProducerId with no position read; "+
			"read_committed sees %v (want a b c once); B's next commit: %v",
			values(readCommitted(ctx, t, c, "one", true, false)), bErr)
	}
	var fenced *kafka.FencedError
	if !errors.As(aErr, &fenced) {
		t.Fatalf("A stopped with %v, want a fence", aErr)
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[w a b c]" {
		t.Fatalf("read_committed sees %s, want [w a b c]", got)
	}
}
