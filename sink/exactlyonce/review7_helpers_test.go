package exactlyonce_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
)

// review7Hold wraps a dialer: once armed, the next request with API key
// key written on one of its connections is held (entered is closed) until
// release is closed.
type review7Hold struct {
	key     uint16
	next    func(context.Context, string, string) (net.Conn, error)
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newReview7Hold(key uint16, next func(context.Context, string, string) (net.Conn, error)) *review7Hold {
	if next == nil {
		next = (&net.Dialer{}).DialContext
	}
	return &review7Hold{key: key, next: next, entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *review7Hold) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := h.next(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &review7HeldConn{Conn: c, h: h}, nil
}

type review7HeldConn struct {
	net.Conn
	h *review7Hold
}

func (c *review7HeldConn) Write(b []byte) (int, error) {
	if len(b) >= 6 && binary.BigEndian.Uint16(b[4:6]) == c.h.key && c.h.armed.CompareAndSwap(true, false) {
		c.h.once.Do(func() { close(c.h.entered) })
		<-c.h.release
	}
	return c.Conn.Write(b)
}
