// Package chaos holds the chaos suite: the real connector binary, a real
// PostgreSQL and a real Kafka broker, steady writers, and faults injected at
// random moments (process kills, server restarts, network cuts through TCP
// proxies). The tests are in chaos_test.go; this file is the TCP proxy they
// put between the connector and each server.
package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from a loopback listener to a target
// address and can misbehave on demand:
//
//   - Drop closes every connection and refuses new ones (accepted and reset
//     at once) until Heal.
//   - Stall accepts connections but passes no bytes in either direction until
//     Heal; connections survive the stall and carry on afterwards.
//   - Slow delays every chunk of data by a random time in [d/2, d].
//   - Reset sends RST on every existing connection (a one-off; new
//     connections are unaffected).
//
// All methods are safe for concurrent use.
type Proxy struct {
	name string
	ln   net.Listener

	target atomic.Pointer[string]

	mu      sync.Mutex
	closed  bool
	links   map[*link]struct{}
	drop    bool
	gate    chan struct{} // closed while bytes may flow; open (blocking) during a stall
	latency time.Duration

	// frames: a Kafka link is read frame by frame, for the EndTxn faults
	// (kafkaframes.go).
	frames bool
	txn    txnState

	wg sync.WaitGroup

	// Counters for the report.
	accepted atomic.Int64
	refused  atomic.Int64
	resets   atomic.Int64
	dialErrs atomic.Int64
}

// link is one proxied connection pair.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{}
}

// close closes both ends; with rst the peers see a connection reset.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		if rst {
			setLinger0(l.client)
			setLinger0(l.server)
		}
		l.client.Close()
		l.server.Close()
		close(l.done)
	})
}

func setLinger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// NewProxy listens on a free loopback port. target may be empty and set
// later with SetTarget; until then new connections are reset.
func NewProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	p := &Proxy{name: name, ln: ln, links: map[*link]struct{}{}, gate: make(chan struct{})}
	close(p.gate)
	p.SetTarget(target)
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr is the listening address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget changes where new connections go.
func (p *Proxy) SetTarget(addr string) { p.target.Store(&addr) }

// Target is where new connections go ("" when unset).
func (p *Proxy) Target() string { return *p.target.Load() }

func (p *Proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // backoff after a failed Accept, not synchronization
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(c net.Conn) {
	p.mu.Lock()
	refuse := p.closed || p.drop
	p.mu.Unlock()
	target := p.Target()
	if refuse || target == "" {
		p.refused.Add(1)
		setLinger0(c)
		c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.dialErrs.Add(1)
		setLinger0(c)
		c.Close()
		return
	}
	l := &link{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.drop {
		// Dropped while dialling.
		p.mu.Unlock()
		p.refused.Add(1)
		l.close(true)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)

	var pumps sync.WaitGroup
	if p.frames {
		fl := &frameLink{forge: map[int32]bool{}, produce: map[int32]int16{}}
		pumps.Go(func() { p.pumpFrames(l, fl, s, c, true) })
		pumps.Go(func() { p.pumpFrames(l, fl, c, s, false) })
	} else {
		pumps.Go(func() { p.pump(l, s, c) })
		pumps.Go(func() { p.pump(l, c, s) })
	}
	pumps.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pump copies src to dst chunk by chunk, honouring stalls and latency. When
// either direction ends, the whole link is closed, after the bytes already
// read have been written.
func (p *Proxy) pump(l *link, dst, src net.Conn) {
	defer l.close(false)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if !p.wait(l) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if rerr != nil {
			return // EOF or an error: either way the link is over
		}
	}
}

// wait blocks while the proxy stalls and sleeps the configured latency. It
// reports false when the link was closed meanwhile.
func (p *Proxy) wait(l *link) bool {
	for {
		p.mu.Lock()
		gate, lat := p.gate, p.latency
		p.mu.Unlock()
		select {
		case <-l.done:
			return false
		case <-gate:
		}
		if lat > 0 {
			d := lat/2 + rand.N(lat/2+1) // the injected latency: the fault itself
			t := time.NewTimer(d)
			select {
			case <-l.done:
				t.Stop()
				return false
			case <-t.C:
			}
		}
		// A stall may have begun during the sleep: check the gate again so
		// no byte passes while stalled.
		p.mu.Lock()
		same := p.gate == gate
		p.mu.Unlock()
		if same {
			return true
		}
	}
}

// Drop closes every connection and refuses new ones until Heal.
func (p *Proxy) Drop() int {
	p.mu.Lock()
	p.drop = true
	links := p.snapshotLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.close(false)
	}
	return len(links)
}

// Stall stops all traffic until Heal; connections stay open.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// Slow delays each chunk by up to d until Heal.
func (p *Proxy) Slow(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Reset sends RST on every existing connection and returns how many.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := p.snapshotLocked()
	p.mu.Unlock()
	for _, l := range links {
		l.close(true)
	}
	p.resets.Add(int64(len(links)))
	return len(links)
}

// Heal ends Drop, Stall, Slow and an EndTxn fault.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = false
	p.latency = 0
	p.txn.fault.Store(int32(TxnNone))
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Conns is the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

func (p *Proxy) snapshotLocked() []*link {
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := p.snapshotLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

// String names the proxy and its addresses for logs.
func (p *Proxy) String() string {
	return fmt.Sprintf("%s proxy %s -> %s", p.name, p.Addr(), p.Target())
}
