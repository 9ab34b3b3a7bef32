package exactlyonce_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// gateHandler holds the goroutine that logs msg until gate is closed,
// after telling reached: a scheduling delay at that point of the code.
type gateHandler struct {
	msg     string
	reached chan struct{}
	gate    chan struct{}
}

func (h *gateHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *gateHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.reached <- struct{}{}:
		default:
		}
		<-h.gate
	}
	return nil
}
func (h *gateHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *gateHandler) WithGroup(string) slog.Handler      { return h }

// TestReview5CloseDeadlocksWithRedriveLoop: Txn.Close (txn.go:421) cancels
// the context, takes commitMu and, still holding it, closes the set
// (txn.go:436 t.q.Close), which waits for the redrive loop
// (quarantine.go:253 s.wg.Wait). A redrive the loop has begun
// (txn.go redriveTxn: the set read, "lifting a quarantine" logged) goes on
// into Transact (exactlyonce/quarantine.go:232), whose first step is
// commitMu.Lock, with no look at the context before: when Close took
// commitMu in between, Transact waits for Close and Close for the loop.
// HANG on shutdown: the process never exits (the pipeline's stop waits
// for the producer's Close). The gap is a few instructions wide; a slow
// log write, a preemption or a GC pause there is enough, and the test
// widens it with a log handler that holds that one message.
func TestReview5CloseDeadlocksWithRedriveLoop(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := r5Cluster(ctx, t)
	cfg := r5Config(c)

	// Run 1: k quarantined, an event parked.
	tx1, close1 := r5Txn(ctx, t, cfg)
	r5Hand(ctx, t, tx1, 100, r5Event(r5Small, "k", "a1", true), r5Event(r5Small, "k", "a2", false))
	close1()
	// A redrive request (--skip), as outbox-cdc redrive writes it.
	st := r5States(ctx, t, c, "k")
	req := *st[len(st)-1]
	now := time.Now().UTC()
	req.State, req.Requested = quarantine.StateSkip, &now
	v, _ := json.Marshal(&req)
	if err := sinktest.Admin(t, c).ProduceSync(ctx, &kgo.Record{Topic: r5State, Key: []byte(r5Source + "/k"), Value: v}).FirstErr(); err != nil {
		t.Fatalf("request: %v", err)
	}

	// Run 2, closed by hand: a Close that hangs must not hang the cleanup.
	h := &gateHandler{msg: "redrive: lifting a quarantine", reached: make(chan struct{}, 1), gate: make(chan struct{})}
	tx2, err := exactlyonce.New(cfg, slog.New(h))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := tx2.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := tx2.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines: %v", err)
	}
	select {
	case <-h.reached:
	case <-ctx.Done():
		t.Fatalf("the redrive never began: %v", ctx.Err())
	}
	closed := make(chan struct{})
	go func() {
		tx2.Close()
		close(closed)
	}()
	time.Sleep(200 * time.Millisecond) // Close takes commitMu and waits for the loop
	close(h.gate)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("HANG: Txn.Close did not return within 10s: it holds commitMu waiting for the redrive loop (Set.Close), which waits for commitMu in Transact")
	}
}
