package exactlyonce_test

import (
	"errors"
	"fmt"
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

// TestTxnSettleFencedByOwnCommit: a commit the broker completed but whose
// answer was lost is settled by a producer-id reload at the client's
// epoch; under KIP-890 the completed commit bumped the epoch and the broker
// refuses the reload as fenced (forged here: kfake accepts it; after a
// takeover a broker refuses it too). When the
// last position is still this instance's, with the lost commit's number,
// the commit is acknowledged and a new client carries on; when another
// instance has committed since, the fence is real and fatal.
func TestTxnSettleFencedByOwnCommit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		takeover bool
		lose     bool
		silent   bool // the taking instance commits nothing before the settle decides
	}{
		{"the broker's answer to our own commit", false, false, false},
		// Long seed 13137812706864228635 (2026-12-07): a broker killed
		// under a commit; its coordinator aborted it, bumping the epoch,
		// and the reload was refused as fenced: a false "fenced" exit.
		{"the broker's answer after its coordinator aborted our commit", false, true, false},
		{"another instance took the id over", true, false, false},
		// The settle no longer asks whether the stream is connected (long
		// seed 13137812706864228635, second run: the fault that cut Kafka
		// cut PostgreSQL too, the stream's reconnect waited for this
		// settle, and the instance exited "fenced"). An instance that took
		// the id over but has committed nothing yet is fenced by the claim
		// instead, and nothing of it becomes visible.
		{"another instance took the id over and committed nothing", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
			d := &cutEndTxn{refusal: time.Second, lose: tc.lose}
			failed := make(chan error, 1)
			fast := func(cfg *exactlyonce.Config) {
				if tc.lose {
					// kfake's coordinator ends the lost commit's
					// transaction at its timeout, as a restarted broker's
					// does at once.
					cfg.TransactionTimeout = 2 * time.Second
				}
				cfg.FenceCheck = 100 * time.Millisecond
				cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(d.dial))
				cfg.Fail = func(err error) { failed <- err }
			}
			tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, fast)
			done := sinktest.NewOutcomes()
			produceTxn(ctx, t, tx, done, 100, "one", "a1", "a2")
			okOutcomes(ctx, t, done, 2)

			var forged atomic.Bool
			c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				r := req.(*kmsg.InitProducerIDRequest)
				if r.ProducerID < 0 || !d.cut.Load() {
					return nil, nil, false
				}
				// kfake reloads any epoch; a broker refuses one behind the
				// id's (KIP-360): the claimed-over instance's too.
				if !forged.CompareAndSwap(false, true) && !tc.silent {
					return nil, nil, false
				}
				resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
				resp.ErrorCode = kerr.ProducerFenced.Code
				return resp, nil, true
			})
			if tc.takeover {
				// The cut commit is settled only after the new instance
				// has committed its position (its idle check).
				d.refusal = 3 * time.Second
			}
			d.armed.Store(true)
			produceTxn(ctx, t, tx, done, 200, "one", "b1", "b2", "b3")
			if tc.takeover {
				for !d.cut.Load() {
					time.Sleep(5 * time.Millisecond) // until the commit is cut
				}
				check := 100 * time.Millisecond
				if tc.silent {
					check = time.Hour // no idle probe: it commits only what it is handed
				}
				otherFailed := make(chan error, 1)
				other, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
					cfg.FenceCheck = check
					cfg.Fail = func(err error) { otherFailed <- err }
				})
				if tc.silent {
					okOutcomes(ctx, t, done, 3)
					produceTxn(ctx, t, tx, done, 300, "one", "c1")
					okOutcomes(ctx, t, done, 1)
					late := sinktest.NewOutcomes()
					produceTxn(ctx, t, other, late, 300, "one", "x1")
					select {
					case err := <-otherFailed:
						var fenced *kafka.FencedError
						if !errors.As(err, &fenced) {
							t.Fatalf("the claimed-over instance failed with %v, want a fence", err)
						}
					case err := <-failed:
						t.Fatalf("the instance that claimed its id back failed: %v", err)
					case o := <-late.C():
						t.Fatalf("the instance whose id was claimed back: outcome %+v; read_committed sees %v", o,
							values(readCommitted(ctx, t, c, "one", true, false)))
					case <-ctx.Done():
						t.Fatal("the instance whose id was claimed back committed on")
					}
					if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 b1 b2 b3 c1]" {
						t.Fatalf("read_committed sees %s, want [a1 a2 b1 b2 b3 c1]: each event once", got)
					}
					if !forged.Load() {
						t.Fatal("the reload was not refused: the test tested nothing")
					}
					return
				}
				// Fatal, and the cut commit's events stay unsettled (the
				// next start reads the position): no outcome before Close.
				select {
				case err := <-failed:
					var fenced *kafka.FencedError
					if !errors.As(err, &fenced) {
						t.Fatalf("fatal error %v, want the fence of a takeover", err)
					}
				case <-ctx.Done():
					t.Fatal("no fatal error after the takeover")
				}
				done.None(t, 100*time.Millisecond)
				if !forged.Load() {
					t.Fatal("the reload was not refused: the test tested nothing")
				}
				return
			}
			okOutcomes(ctx, t, done, 3)
			if !forged.Load() {
				t.Fatal("the reload was not refused: the test tested nothing")
			}
			produceTxn(ctx, t, tx, done, 300, "one", "c1")
			okOutcomes(ctx, t, done, 1)
			if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 b1 b2 b3 c1]" {
				t.Fatalf("read_committed sees %s, want [a1 a2 b1 b2 b3 c1]: each event once", got)
			}
			if got := tx.Committed(); got != 300 {
				t.Fatalf("Committed() = %v, want 300", got)
			}
		})
	}
}
