package sink

import (
	"context"
	"sync"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"
)

// gate batches records by load instead of by a fixed linger: a record goes
// to the client at once when nothing of the sink's is in it, and otherwise
// waits until everything in the client is acknowledged, so the records that
// come in while one round trip is outstanding leave together in the next
// produce request. At a low rate nearly every record goes at once; at a high
// one each request carries what one round trip gathered, which saves the
// broker most of its per-request work (docs/performance.md).
//
// franz-go cannot do this itself: with idempotence it keeps up to five
// requests in flight per broker, and with linger 0 each record that finds
// no request being built starts one.
type gate struct {
	mu       sync.Mutex
	inClient int       // records handed to the client, promise not run yet
	waiting  []*record // in hand-over order
	spare    []*record // the previous waiting slice, for reuse
	bytes    int       // batch bytes of waiting
	// maxRecords and maxBytes: this much waiting is a full request's worth
	// and goes at once, so a backlog does not wait for the client to empty.
	maxRecords, maxBytes int

	// budget (kafka.latency_budget; 0: off) lets the head of waiting wait,
	// with the client empty, until deadline (budget.go).
	budget   *budget
	deadline time.Time
	timer    *time.Timer

	// releasing serialises hand-overs, so records reach the client in the
	// order they reached the gate.
	releasing sync.Mutex
	due       chan struct{} // the client is empty and records wait
	cl        *kgo.Client   // set once the client exists
}

// The most that waits, unless the buffer limits are lower: the gate's
// records come on top of the client's buffer.
const (
	gateRecords = 512
	gateBytes   = 1 << 20
)

// newGate bounds what waits by the sink's buffer limits (bytes 0: none);
// latency > 0 turns the latency budget on.
func newGate(maxRecords int, maxBytes int64, latency time.Duration) *gate {
	g := &gate{due: make(chan struct{}, 1), maxRecords: min(gateRecords, maxRecords), maxBytes: gateBytes}
	if maxBytes > 0 {
		g.maxBytes = int(min(gateBytes, maxBytes))
	}
	if latency > 0 {
		g.budget = newBudget(latency, time.Now)
		g.timer = time.AfterFunc(time.Hour, g.signal)
		g.timer.Stop()
	}
	return g
}

// produce hands r to the client now or after the records ahead of it.
func (g *gate) produce(r *record) {
	g.mu.Lock()
	var hold time.Duration
	if g.budget != nil {
		hold = g.budget.arrived()
	}
	if g.inClient == 0 && len(g.waiting) == 0 && hold == 0 {
		g.sent()
		g.mu.Unlock()
		g.cl.Produce(r.ctx, &r.Record, landed)
		return
	}
	if len(g.waiting) == 0 {
		g.deadline = time.Time{}
		if hold > 0 {
			g.deadline = g.budget.now().Add(hold)
			if g.inClient == 0 {
				g.timer.Reset(hold)
			}
		}
	}
	g.waiting = append(g.waiting, r)
	g.bytes += r.Size()
	full := len(g.waiting) >= g.maxRecords || g.bytes >= g.maxBytes
	g.mu.Unlock()
	if full {
		g.release()
	}
}

// sent counts a record handed to the client. Called with mu held.
func (g *gate) sent() {
	if g.inClient == 0 && g.budget != nil {
		g.budget.sending()
	}
	g.inClient++
}

// signal wakes the releaser (the budget's timer).
func (g *gate) signal() {
	select {
	case g.due <- struct{}{}:
	default: // already signalled
	}
}

// releasable reports whether what waits goes now: the client is empty and
// the head's deadline passed. Called with mu held.
func (g *gate) releasable() bool {
	if g.inClient != 0 || len(g.waiting) == 0 {
		return false
	}
	if g.deadline.IsZero() {
		return true
	}
	if wait := g.deadline.Sub(g.budget.now()); wait > 0 {
		g.timer.Reset(wait)
		return false
	}
	return true
}

// release hands every waiting record to the client, in order. It may block
// in kgo's Produce while the client's buffer is full: never call it from a
// promise.
func (g *gate) release() {
	g.releasing.Lock()
	defer g.releasing.Unlock()
	g.mu.Lock()
	batch := g.waiting
	g.waiting, g.spare = g.spare[:0], nil
	g.bytes = 0
	if len(batch) > 0 {
		g.sent()
		g.inClient += len(batch) - 1
	}
	g.deadline = time.Time{}
	g.mu.Unlock()
	for i, r := range batch {
		g.cl.Produce(r.ctx, &r.Record, landed)
		batch[i] = nil
	}
	g.mu.Lock()
	if g.spare == nil {
		g.spare = batch[:0]
	}
	g.mu.Unlock()
}

// run hands waiting records over when the client has emptied (or the
// budget's deadline passed); it ends with ctx (the sink's).
func (g *gate) run(ctx context.Context) {
	for {
		select {
		case <-g.due:
			g.mu.Lock()
			ok := g.releasable()
			g.mu.Unlock()
			if ok {
				g.release()
			}
		case <-ctx.Done():
			if g.timer != nil {
				g.timer.Stop()
			}
			return
		}
	}
}

// landed is the promise of every record produced through the gate. A
// function rather than the method value r.promise, which would allocate
// for each record: the *kgo.Record is the first field of its record.
func landed(kr *kgo.Record, err error) {
	r := (*record)(unsafe.Pointer(kr))
	s := r.sink
	g := s.gate
	g.mu.Lock()
	g.inClient--
	if g.inClient == 0 && g.budget != nil {
		g.budget.landed()
	}
	due := g.inClient == 0 && len(g.waiting) > 0
	g.mu.Unlock()
	if due {
		g.signal()
	}
	s.settle(r, err)
}

// drop takes the records still waiting, for Close to fail them.
func (g *gate) drop() []*record {
	g.mu.Lock()
	defer g.mu.Unlock()
	left := g.waiting
	g.waiting, g.bytes = nil, 0
	return left
}
