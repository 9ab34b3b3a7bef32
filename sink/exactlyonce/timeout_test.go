package exactlyonce_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// slowProduce makes a transaction last perKB for each KiB it produced: its
// EndTxn waits that long, as the produce under a producer quota or over a
// slow link does (with transaction version 2 a produce request starts the
// transaction, so delaying the produce itself would not age it).
type slowProduce struct {
	perKB    time.Duration
	produced *atomic.Int64
	// late: an EndTxn waited longer than this (then slept is set)
	late  time.Duration
	slept *atomic.Bool
}

func (s slowProduce) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, s: s}, nil
}

type slowConn struct {
	net.Conn
	s slowProduce
}

// Write sees whole requests: size (4 bytes), then the API key (2); Produce
// is 0, EndTxn 26.
func (c *slowConn) Write(b []byte) (int, error) {
	if len(b) >= 6 {
		switch binary.BigEndian.Uint16(b[4:6]) {
		case 0:
			c.s.produced.Add(int64(len(b)))
		case 26:
			d := time.Duration(c.s.produced.Swap(0)) * c.s.perKB / 1024
			time.Sleep(d)
			if d > c.s.late {
				c.s.slept.Store(true)
			}
		}
	}
	return c.Conn.Write(b)
}

// slowConfig is a producer's configuration on c whose Kafka transactions
// last 150 ms per KiB produced (slowProduce), with parts of 10, a 1 s
// timeout, and a fence check of 1 s (a takeover commits within two; a
// timeout waits for them).
func slowConfig(c *kfake.Cluster, interval time.Duration) (exactlyonce.Config, slowProduce) {
	cfg := txnConfig(c, splitSource, interval)
	cfg.MaxRecords, cfg.TransactionTimeout, cfg.FenceCheck = 10, time.Second, time.Second
	slow := slowProduce{perKB: 150 * time.Millisecond, produced: new(atomic.Int64), late: time.Second, slept: new(atomic.Bool)}
	cfg.Sink.TestOpts = append(slices.Clip(cfg.Sink.TestOpts), kgo.Dialer(slow.dial))
	return cfg, slow
}

// TestTxnTimeoutShrinksParts: a part of a large transaction takes longer
// than the transaction timeout to produce (1 KiB events, 150 ms per KiB,
// parts of 10, a 1 s timeout); kfake's coordinator aborts it and bumps the
// epoch, as Kafka does. The producer must take that for the timeout it is,
// not for a takeover: a new producer id, smaller parts, and every event
// once for read_committed. Before, the refused epoch read as "fenced" and
// the run stopped (and, restarted, stopped again at the same part).
func TestTxnTimeoutShrinksParts(t *testing.T) {
	// The coordinator's answer to the EndTxn of a transaction it aborted:
	// kfake's own, and the ones Kafka gives (forged).
	for _, answer := range []*kerr.Error{nil, kerr.InvalidProducerEpoch, kerr.ProducerFenced} {
		name := "kfake's INVALID_TXN_STATE"
		if answer != nil {
			name = answer.Message
		}
		t.Run(name, func(t *testing.T) { timeoutShrinks(t, answer) })
	}
}

func timeoutShrinks(t *testing.T, answer *kerr.Error) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	cfg, slow := slowConfig(c, time.Millisecond)
	if answer != nil {
		c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if !slow.slept.CompareAndSwap(true, false) {
				return nil, nil, false
			}
			resp := req.ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = answer.Code
			return resp, nil, true
		})
	}
	failed := make(chan error, 4)
	cfg.Fail = func(err error) { failed <- err }
	var logs strings.Builder
	var mu sync.Mutex
	tx, err := exactlyonce.New(cfg, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tx.SetFloor(50)
	done := sinktest.OutcomesFor(64)
	tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
	value := strings.Repeat("x", 1000)
	for i := range 25 {
		rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("e%d %s", i, value)), Timestamp: time.Now()}
		if err := tx.Produce(ctx, rec, done); err != nil {
			mu.Lock()
			t.Fatalf("produce %d: %v\n%s", i, err, logs.String())
		}
	}
	tx.EndTxn(600)
	for i := range 25 {
		select {
		case err := <-failed:
			t.Fatalf("fatal error after %d outcomes: %v", i, err)
		case o := <-done.C():
			if o.Err != nil {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		case <-ctx.Done():
			t.Fatalf("%d of 25 outcomes", i)
		}
	}
	var got []string
	for _, v := range events(readCommitted(ctx, t, c, topic, true, false)) {
		got = append(got, strings.Fields(v)[0])
	}
	want := make([]string, 25)
	for i := range want {
		want[i] = fmt.Sprintf("e%d", i)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("read_committed sees %v, want e0..e24 once each, in order", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "kafka transaction timed out") {
		t.Fatalf("no part timed out: the test tested nothing\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestTxnTimeoutAfterRestart: the first Kafka transaction of a restarted
// producer times out; the last position is then its predecessor's (another
// process, the one it read at start), which is no takeover. Before, any
// position of another instance read as one: the restart exited "fenced",
// and every restart after it again, under the same quota.
func TestTxnTimeoutAfterRestart(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	cfg := txnConfig(c, splitSource, time.Millisecond)
	cfg.MaxRecords, cfg.TransactionTimeout = 10, time.Second
	cfg.FenceCheck = time.Second // a takeover commits within two; a timeout waits for them
	// The predecessor, with the same timeout (kfake keeps the first one a
	// transactional id was initialized with).
	first, err := exactlyonce.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, first, sinktest.OutcomesFor(64)) // its position
	first.Close()

	slow := slowProduce{perKB: 150 * time.Millisecond, produced: new(atomic.Int64), late: time.Second, slept: new(atomic.Bool)}
	cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(slow.dial))
	failed := make(chan error, 4)
	cfg.Fail = func(err error) { failed <- err }
	var logs strings.Builder
	var mu sync.Mutex
	tx, err := exactlyonce.New(cfg, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	again := sinktest.OutcomesFor(64)
	tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
	value := strings.Repeat("x", 1000)
	for i := range 15 {
		rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("e%d %s", i, value)), Timestamp: time.Now()}
		if err := tx.Produce(ctx, rec, again); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
	tx.EndTxn(600)
	for i := range 15 {
		select {
		case err := <-failed:
			mu.Lock()
			t.Fatalf("fatal error after %d outcomes: %v\n%s", i, err, logs.String())
		case o := <-again.C():
			if o.Err != nil {
				t.Fatalf("outcome %d: %+v", i, o)
			}
		case <-ctx.Done():
			t.Fatalf("%d of 15 outcomes", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "kafka transaction timed out") {
		t.Fatalf("no commit timed out: the test tested nothing\n%s", logs.String()[:min(len(logs.String()), 3000)])
	}
}
