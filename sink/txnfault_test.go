package sink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// txnFaults is a dialer for the transactional client that reads the Kafka
// protocol on its connections (a frame is an int32 size and the message;
// request header v1/v2: api key, api version, correlation id, client id,
// then tagged fields from the flexible versions on) and misbehaves on
// EndTxn (api key 26, flexible from v3):
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

// endTxn parses an EndTxn request frame: its correlation id, whether its
// version is flexible, and whether it commits.
func endTxn(b []byte) (corr int32, flexible, commit, ok bool) {
	if len(b) < 14 || binary.BigEndian.Uint16(b[4:6]) != 26 {
		return 0, false, false, false
	}
	ver := int16(binary.BigEndian.Uint16(b[6:8]))
	corr = int32(binary.BigEndian.Uint32(b[8:12]))
	off := 14
	if n := int16(binary.BigEndian.Uint16(b[12:14])); n > 0 {
		off += int(n)
	}
	flexible = ver >= 3
	var idLen int
	if flexible {
		off++ // no tagged fields in the header
		n, w := binary.Uvarint(b[off:])
		idLen, off = int(n)-1, off+w
	} else {
		idLen, off = int(binary.BigEndian.Uint16(b[off:])), off+2
	}
	off += idLen + 8 + 2 // transactional id, producer id, epoch
	if off >= len(b) {
		return 0, false, false, false
	}
	return corr, flexible, b[off] == 1, true
}

func (c *faultConn) Write(b []byte) (int, error) {
	if corr, flexible, commit, ok := endTxn(b); ok {
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
		var size [4]byte
		if _, err := io.ReadFull(c.Conn, size[:]); err != nil {
			return 0, err
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(frame, size[:])
		if _, err := io.ReadFull(c.Conn, frame[4:]); err != nil {
			return 0, err
		}
		corr := int32(binary.BigEndian.Uint32(frame[4:8]))
		c.mu.Lock()
		flexible, ok := c.forge[corr]
		delete(c.forge, corr)
		c.mu.Unlock()
		if ok {
			at := 8 + 4 // correlation id, throttle
			if flexible {
				at++ // the header's tagged fields
			}
			binary.BigEndian.PutUint16(frame[at:], uint16(c.f.forgeCode))
			c.f.forged.Add(1)
		}
		c.frame = frame
	}
	n := copy(b, c.frame)
	c.frame = c.frame[n:]
	return n, nil
}
