package exactlyonce_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// txnFaults is a dialer for the transactional client that reads the Kafka
// protocol on its connections (testenv.ReadKafkaFrame) and misbehaves on
// EndTxn:
//   - forge > 0: the answers to that many EndTxn commit requests, which the
//     broker carried out, come back with the error code forgeCode instead,
//     as a coordinator that moved or is loading answers franz-go's retries
//     of a commit that went through.
//   - cutAbort: the next EndTxn abort request is swallowed and its
//     connection cut before an answer; new connections are refused for a
//     moment, so the abort fails without an answer.
type txnFaults struct {
	forge     atomic.Int32
	forgeCode int16
	forged    atomic.Int32
	cutAbort  atomic.Bool
	cuts      atomic.Int32
	refuse    atomic.Int64 // unix nanoseconds until which dials fail
}

func (f *txnFaults) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if time.Now().UnixNano() < f.refuse.Load() {
		return nil, errors.New("test: connection refused")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, f: f, forge: map[int32]bool{}}, nil
}

type faultConn struct {
	net.Conn
	f     *txnFaults
	dying atomic.Bool

	mu    sync.Mutex
	forge map[int32]bool // correlation id → flexible, of answers to forge

	frame []byte // the answer being read, rewritten; the reading goroutine's
}

func (c *faultConn) Write(b []byte) (int, error) {
	if corr, flexible, commit, ok := testenv.EndTxnRequest(b); ok {
		switch {
		case commit && c.f.forge.Load() > 0:
			c.f.forge.Add(-1)
			c.mu.Lock()
			c.forge[corr] = flexible
			c.mu.Unlock()
		case !commit && c.f.cutAbort.CompareAndSwap(true, false):
			c.f.cuts.Add(1)
			c.dying.Store(true)
			c.f.refuse.Store(time.Now().Add(500 * time.Millisecond).UnixNano())
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	if c.dying.Load() {
		c.Conn.Close()
		return 0, errors.New("test: connection cut before the answer")
	}
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
			binary.BigEndian.PutUint16(frame[testenv.AnswerErrorAt(flexible):], uint16(c.f.forgeCode))
			c.f.forged.Add(1)
		}
		c.frame = frame
	}
	n := copy(b, c.frame)
	c.frame = c.frame[n:]
	return n, nil
}
