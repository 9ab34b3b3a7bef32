package exactlyonce_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// Commits whose answer is lost in each way franz-go can lose it, and the
// reads that decide what was committed.

// okOutcomes waits for n outcomes and fails on any error.
func okOutcomes(ctx context.Context, t *testing.T, done *sinktest.Outcomes, n int) {
	t.Helper()
	for range n {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
	}
}

func wantCommitted(ctx context.Context, t *testing.T, c *kfake.Cluster, topic, want string) {
	t.Helper()
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, topic, true, false))); got != want {
		t.Fatalf("read_committed sees %s on %s, want %s: each event once", got, topic, want)
	}
}

// TestTxnRetriableCommitAnswer: the coordinator carries the commit out,
// but its answer to it and to franz-go's retries is a retriable error
// (COORDINATOR_LOAD_IN_PROGRESS: a coordinator moving or loading). That is
// no refusal: the sink settles the commit, learns it went through, and
// produces nothing again.
func TestTxnRetriableCommitAnswer(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	f := &txnFaults{forgeCode: kerr.CoordinatorLoadInProgress.Code}
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(f.dial), kgo.RequestRetries(2))
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)
	f.forge.Store(3) // the commit and franz-go's two retries of it (RequestRetries)
	produceTxn(ctx, t, tx, done, 200, "one", "b1", "b2")
	okOutcomes(ctx, t, done, 2)
	f.forge.Store(0)
	if f.forged.Load() == 0 {
		t.Fatal("no EndTxn answer was forged: the test tested nothing")
	}
	produceTxn(ctx, t, tx, done, 300, "one", "c1")
	okOutcomes(ctx, t, done, 1)
	wantCommitted(ctx, t, c, "one", "[a1 b1 b2 c1]")
	if got := tx.Committed(); got != 300 {
		t.Fatalf("Committed() = %v, want 300", got)
	}
}

// TestTxnAbortCut: the abort of a transaction (a record refused with
// others) gets no answer, so franz-go still counts itself in it. The next
// attempt aborts again before it begins, instead of failing for good on
// "already in a transaction".
func TestTxnAbortCut(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	f := &txnFaults{}
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(f.dial))
	})
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), "one")
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if tp == "one" && bytes.Contains(b, []byte("poison")) {
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	f.cutAbort.Store(true)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "e1", "poison", "e2")
	var dead int
	for range 3 {
		o := done.Wait(ctx, t)
		if o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
		if o.DeadLettered {
			dead++
		}
	}
	if f.cuts.Load() != 1 || dead != 1 {
		t.Fatalf("%d aborts cut, %d dead-lettered; want 1 and 1", f.cuts.Load(), dead)
	}
	wantCommitted(ctx, t, c, "one", "[e1 e2]")
}

// TestTxnSettleSamePosition: a snapshot's or a gap repair's transaction
// ends at a position already committed. When its commit request is lost,
// the committed position is the same as its own: only the transaction's
// number tells that it did not commit, so its events go again instead of
// being acknowledged unpublished.
func TestTxnSettleSamePosition(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	d := &cutEndTxn{lose: true, refusal: 500 * time.Millisecond}
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(d.dial))
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)
	d.armed.Store(true)
	produceTxn(ctx, t, tx, done, 100, "one", "r1", "r2") // the backfill's rows, at the same position
	okOutcomes(ctx, t, done, 2)
	if !d.cut.Load() {
		t.Fatal("no EndTxn was cut: the test tested nothing")
	}
	wantCommitted(ctx, t, c, "one", "[a1 r1 r2]")
}

// TestTxnProbeAfterFlushGaveUp: a Flush whose context ends while its
// commit is unconfirmed leaves that commit to settle. The idle probe that
// comes next settles it with its own events (it used to slice its empty
// batch by the unconfirmed count, and panic).
func TestTxnProbeAfterFlushGaveUp(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	d := &cutEndTxn{refusal: 800 * time.Millisecond}
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Hour, func(cfg *exactlyonce.Config) {
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(d.dial))
		cfg.FenceCheck = 200 * time.Millisecond
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1")
	if err := tx.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	okOutcomes(ctx, t, done, 1)
	// The commit loop waits an hour for what it sees waiting; a Flush that
	// takes the batch first leaves the loop idle, where the probe runs.
	// The round repeats until a Flush gave up with its commit unconfirmed.
	var gaveUp int
	for round := 0; gaveUp == 0 && round < 5; round++ {
		d.cut.Store(false)
		d.armed.Store(true)
		v := fmt.Sprintf("b%d", round)
		produceTxn(ctx, t, tx, done, lsn.LSN(200+round), "one", v)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := tx.Flush(short)
		cancel()
		d.armed.Store(false)
		switch {
		case errors.Is(err, context.DeadlineExceeded) && d.cut.Load():
			gaveUp++
		case err != nil:
			t.Fatalf("flush: %v", err)
		}
		okOutcomes(ctx, t, done, 1) // settled by the probe (or committed by that Flush)
	}
	if gaveUp == 0 {
		t.Fatal("no Flush gave up on an unconfirmed commit in 5 rounds: the test tested nothing")
	}
	got := values(readCommitted(ctx, t, c, "one", true, false))
	seen := map[string]int{}
	for _, v := range got {
		seen[v]++
	}
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("read_committed sees %s %d times: %v", v, n, got)
		}
	}
}

// TestTxnStartPastOpenTransaction: another connector shares the positions
// topic; one of its transactions aborted just before another of its began,
// and that one is still open. The start reads this source's position
// without waiting for the open one (read_committed stops before it and
// hides the aborted record, so waiting for the offset before it stalled).
func TestTxnStartPastOpenTransaction(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	first, _, closeFirst := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, first, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)
	closeFirst()

	other := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID(id), kgo.DefaultProduceTopic(positions))
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		t.Cleanup(cl.Close)
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		return cl
	}
	aborted, open := other("other-b"), other("other-a")
	for _, p := range []struct {
		cl  *kgo.Client
		key string
	}{{aborted, "sys/db/b"}, {open, "sys/db/a"}} {
		rec := &kgo.Record{Key: []byte(p.key), Value: []byte(`{"lsn":"0/9"}`)}
		if err := p.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	if err := aborted.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, pos, _ := newTxn(short, t, c, "sys/db/slot", time.Millisecond)
	if pos != 100 {
		t.Fatalf("start read position %v, want 100", pos)
	}
}
