package exactlyonce_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// lateCommitAnswer: once armed, the answer to the next EndTxn commit, which
// the broker carried out, comes back late (after delay) and with the error
// code code, as franz-go's retry of a commit that went through is answered
// when the first answer was lost on a slow link.
type lateCommitAnswer struct {
	armed  atomic.Bool
	forged atomic.Int32
	code   int16
	delay  time.Duration
}

func (f *lateCommitAnswer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &lateConn{Conn: c, f: f, forge: map[int32]bool{}}, nil
}

type lateConn struct {
	net.Conn
	f     *lateCommitAnswer
	mu    sync.Mutex
	forge map[int32]bool
	frame []byte
}

func (c *lateConn) Write(b []byte) (int, error) {
	if corr, flexible, commit, ok := testenv.EndTxnRequest(b); ok && commit && c.f.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.forge[corr] = flexible
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

func (c *lateConn) Read(b []byte) (int, error) {
	if len(c.frame) == 0 {
		frame, err := testenv.ReadKafkaFrame(c.Conn)
		if err != nil {
			return 0, err
		}
		corr := int32(binary.BigEndian.Uint32(frame[4:8]))
		c.mu.Lock()
		flexible, ok := c.forge[corr]
		delete(c.forge, corr)
		c.mu.Unlock()
		if ok {
			time.Sleep(c.f.delay)
			binary.BigEndian.PutUint16(frame[testenv.AnswerErrorAt(flexible):], uint16(c.f.code))
			c.f.forged.Add(1)
		}
		c.frame = frame
	}
	n := copy(b, c.frame)
	c.frame = c.frame[n:]
	return n, nil
}

// TestReview4TimeoutDropsUnsureBeforeItIsSettled (review4, DUPLICATE).
//
// Path: the commit of T2 (b1 b2) is carried out by the coordinator but its
// answer comes back late (longer than kafka.transaction_timeout after the
// attempt began) as INVALID_TXN_STATE (franz-go's retry of a commit that
// went through). attempt() makes it errUnconfirmed; try() keeps it in
// t.unsure; timedOut() takes INVALID_TXN_STATE from an old attempt for a
// coordinator timeout, and afterTimeout moves the unsure events into the
// batch and sets t.unsure = nil BEFORE it knows the outcome. Its position
// read then fails once (a broker restarting, here a refused ListOffsets):
// afterTimeout returns the error, commitShrinking retries after a backoff
// with t.unsure gone, and the attempt produces b1 b2 again although they
// are committed.
//
// Expected: a failed read leaves the commit unsettled (t.unsure kept), the
// next try settles it first, and read_committed sees a1 b1 b2 c1 once each.
// Observed at 49ca756: b1 b2 twice.
func TestReview4TimeoutDropsUnsureBeforeItIsSettled(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	f := &lateCommitAnswer{code: kerr.InvalidTxnState.Code, delay: 1200 * time.Millisecond}
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", 10*time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.TransactionTimeout = time.Second
		cfg.FenceCheck = time.Second // a takeover commits within two; a timeout waits for them
		cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(f.dial))
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)

	// The first position read after the forged answer fails.
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.ListOffsets), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if f.forged.Load() == 0 || !refused.CompareAndSwap(0, 1) {
			return nil, nil, false
		}
		r := req.(*kmsg.ListOffsetsRequest)
		resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	f.armed.Store(true)
	produceTxn(ctx, t, tx, done, 200, "one", "b1", "b2")
	okOutcomes(ctx, t, done, 2)
	produceTxn(ctx, t, tx, done, 300, "one", "c1")
	okOutcomes(ctx, t, done, 1)
	if f.forged.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("forged %d answers, refused %d reads: the test tested nothing", f.forged.Load(), refused.Load())
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 b1 b2 c1]" {
		t.Fatalf("DUPLICATE: read_committed sees %s, want [a1 b1 b2 c1]: each event once", got)
	}
}
