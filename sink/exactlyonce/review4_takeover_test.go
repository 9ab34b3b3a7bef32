package exactlyonce_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// endTxnGate holds the next EndTxn request (API key 26) written once armed:
// entered is closed when it is held, release lets it go.
type endTxnGate struct {
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func newEndTxnGate() *endTxnGate {
	return &endTxnGate{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *endTxnGate) arm() { g.mu.Lock(); g.armed = true; g.mu.Unlock() }

func (g *endTxnGate) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, g: g}, nil
}

type gatedConn struct {
	net.Conn
	g *endTxnGate
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && binary.BigEndian.Uint16(b[4:6]) == 26 {
		c.g.mu.Lock()
		hold := c.g.armed
		c.g.armed = false
		c.g.mu.Unlock()
		if hold {
			close(c.g.entered)
			<-c.g.release
		}
	}
	return c.Conn.Write(b)
}

// eosInstance is one connector's producer on the shared source.
func eosInstance(ctx context.Context, t *testing.T, c *kfake.Cluster, name string, logs *strings.Builder, mu *sync.Mutex,
	dial func(context.Context, string, string) (net.Conn, error), failed chan error) *exactlyonce.Txn {
	t.Helper()
	cfg := txnConfig(c, splitSource, time.Millisecond)
	cfg.TransactionTimeout = time.Second
	cfg.FenceCheck = time.Second // a takeover commits within two; a timeout waits for them
	cfg.Fail = func(err error) { failed <- err }
	if dial != nil {
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(dial))
	}
	tx, err := exactlyonce.New(cfg, slog.New(slog.NewTextHandler(lockedWriter{mu, logs}, nil)).With("instance", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sync.OnceFunc(tx.Close))
	if _, err := tx.Start(ctx); err != nil {
		t.Fatalf("%s: Start: %v", name, err)
	}
	return tx
}

// TestReview4TakeoverDuringLongAttemptFencesTheNewOwner (review4, DUPLICATE
// and MISLEADING-ERROR).
//
// Path: instance A's Kafka transaction (T2, events a b c, end 200) runs
// longer than kafka.transaction_timeout (a slow broker, a quota). Meanwhile
// A loses PostgreSQL without knowing it: a network partition; A's processor
// is blocked in the commit, its queue is full, and the stream sits in
// push(), which only writes status updates — writes into a half-open TCP
// connection succeed for many minutes — so p.conn.up (Owner) stays true.
// The walsender times out (wal_sender_timeout), the slot is free, standby
// instance B takes it (waitSlotFree), fences A (Start), streams from A's
// last position (100) and commits T2 itself. A's EndTxn is then refused
// with an epoch error; the attempt is older than the timeout and Owner()
// says true, so timedOut calls it a coordinator timeout: afterTimeout's
// renewClient makes a new producer id (InitProducerId), which FENCES B, the
// rightful owner; the position it reads is B's (another instance) but
// afterTimeout only checks "is it my txn number", shrinks, and A commits
// T2 again.
//
// Expected: A, fenced, commits nothing more and stops (a position of
// another instance after the id was taken over means a takeover, not a
// timeout); B goes on; read_committed sees a b c once.
// Observed at 49ca756: a b c twice, and B stops with "fenced: another
// outbox-cdc instance ... took over this source" while A carries on.
func TestReview4TakeoverDuringLongAttemptFencesTheNewOwner(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	var logs strings.Builder
	var mu sync.Mutex
	gate := newEndTxnGate()
	failedA, failedB := make(chan error, 4), make(chan error, 4)
	a := eosInstance(ctx, t, c, "A", &logs, &mu, gate.dial, failedA)
	a.SetFloor(50)
	doneA := sinktest.OutcomesFor(64)
	a.BeginTxn(exactlyonce.TxnID{Final: 90, Xid: 9}, true)
	produceTxn(ctx, t, a, doneA, 100, topic, "w")
	if o := doneA.Wait(ctx, t); o.Err != nil {
		t.Fatalf("A's first transaction: %+v", o)
	}

	// T2: A's commit of it is held at its EndTxn.
	gate.arm()
	a.BeginTxn(exactlyonce.TxnID{Final: 190, Xid: 19}, true)
	began := time.Now()
	produceTxn(ctx, t, a, doneA, 200, topic, "a", "b", "c")
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("A's EndTxn never came")
	}

	// B takes the slot and the id over, and commits T2 from A's position.
	b := eosInstance(ctx, t, c, "B", &logs, &mu, nil, failedB)
	b.SetFloor(100)
	doneB := sinktest.OutcomesFor(64)
	b.BeginTxn(exactlyonce.TxnID{Final: 190, Xid: 19}, true)
	produceTxn(ctx, t, b, doneB, 200, topic, "a", "b", "c")
	for range 3 {
		if o := doneB.Wait(ctx, t); o.Err != nil {
			t.Fatalf("B's T2: %+v", o)
		}
	}
	time.Sleep(time.Until(began.Add(1200 * time.Millisecond))) // A's attempt is older than the timeout
	close(gate.release)

	// A learns of the refusal: its outcomes (or its fatal error).
	var aFenced error
	for range 3 {
		select {
		case aFenced = <-failedA:
		case <-doneA.C():
		case <-ctx.Done():
			t.Fatal("A: no outcome for T2")
		}
		if aFenced != nil {
			break
		}
	}
	// B goes on with T3.
	b.BeginTxn(exactlyonce.TxnID{Final: 290, Xid: 29}, true)
	produceTxn(ctx, t, b, doneB, 300, topic, "d")
	var bErr error
	select {
	case bErr = <-failedB:
	case o := <-doneB.C():
		bErr = o.Err
	case <-ctx.Done():
		t.Fatal("B: no outcome for T3")
	}
	var got []string
	for _, r := range readCommitted(ctx, t, c, topic, true, false) {
		if !r.Attrs.IsControl() {
			got = append(got, string(r.Value))
		}
	}
	slices.Sort(got) // keyed by value: several partitions
	mu.Lock()
	defer mu.Unlock()
	var problems []string
	if strings.Join(got, " ") != "a b c d w" {
		problems = append(problems, "read_committed sees "+strings.Join(got, " ")+", want a b c d w (each once)")
	}
	if bErr != nil {
		problems = append(problems, "B, the slot's owner, failed: "+bErr.Error())
	}
	if aFenced == nil {
		problems = append(problems, "A, taken over, did not stop")
	}
	if len(problems) > 0 {
		t.Fatalf("%s\n%s", strings.Join(problems, "\n"), logs.String())
	}
}
