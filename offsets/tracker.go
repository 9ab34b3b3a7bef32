// Package offsets tracks which WAL positions have been delivered to Kafka.
//
// The acknowledged watermark is the end LSN of the last transaction that, with
// every transaction committed before it, has all of its events acknowledged by
// the broker (or by the dead-letter topic). It is the only position outbox-cdc
// ever confirms to PostgreSQL (contract, guarantee 3).
//
// Memory is bounded by the transactions with an event in flight, not by the
// WAL: a transaction with nothing left to acknowledge behind an unacknowledged
// one is folded into the queued entry before it (that entry's end is raised),
// which moves the watermark exactly as keeping it would have.
package offsets

import (
	"sync"
	"sync/atomic"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Txn is one source transaction as seen by the tracker. It is created by Begin
// and owned by the tracker; callers only pass it back. After Commit a Txn
// with nothing in flight is reused by a later Begin, so a caller keeps x past
// Commit only for the Acks of events it Added.
type Txn struct {
	end       lsn.LSN
	pending   int  // events produced and not yet acknowledged
	committed bool // Commit seen: end is known and the txn is queued
	aborted   bool // stream lost before Commit: the txn will be sent again
}

// Tracker computes the acknowledged watermark from events acknowledged in any
// order. It is safe for one producer goroutine (Begin/Add/Commit/Abort/Idle)
// and any number of acknowledging goroutines (Ack).
type Tracker struct {
	mu       sync.Mutex
	queue    []*Txn // committed, not yet fully acknowledged, in commit order
	head     int    // queue[head:] is live; compacted when the dead prefix grows
	fold     int    // live length at which complete entries are folded (foldLocked)
	open     *Txn   // transaction between Begin and Commit, if any
	spare    *Txn   // a committed Txn nobody refers to, for the next Begin
	inflight atomic.Int64
	acked    atomic.Uint64
	notify   chan struct{}
}

// NewTracker starts the watermark at start, normally the slot's confirmed
// position: everything at or below it is already delivered.
func NewTracker(start lsn.LSN) *Tracker {
	t := &Tracker{notify: make(chan struct{}, 1), fold: minFold}
	t.acked.Store(uint64(start))
	return t
}

// Acked returns the acknowledged watermark.
func (t *Tracker) Acked() lsn.LSN { return lsn.LSN(t.acked.Load()) }

// InFlight returns the number of produced events not yet acknowledged.
func (t *Tracker) InFlight() int { return int(t.inflight.Load()) }

// Advanced is signalled (coalesced) whenever the watermark moves.
func (t *Tracker) Advanced() <-chan struct{} { return t.notify }

// Begin opens a transaction. A transaction still open from before is a
// protocol violation by the caller and is aborted.
func (t *Tracker) Begin() *Txn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open != nil {
		t.abortLocked(t.open)
	}
	// Empty and other-table transactions come by the million: reuse.
	x := t.spare
	if x != nil {
		t.spare = nil
		*x = Txn{}
	} else {
		x = &Txn{}
	}
	t.open = x
	return x
}

// Add records one more event of x in flight. Call it before producing the
// event so that an acknowledgement can never arrive first.
func (t *Tracker) Add(x *Txn) {
	t.mu.Lock()
	x.pending++
	t.mu.Unlock()
	t.inflight.Add(1)
}

// Ack records that one event of x has been delivered.
func (t *Tracker) Ack(x *Txn) {
	t.mu.Lock()
	if x.aborted {
		// Its records left InFlight at the abort: a late outcome (an
		// at_least_once record delivered anyway) changes nothing.
		t.mu.Unlock()
		return
	}
	x.pending--
	if x.pending < 0 {
		t.mu.Unlock()
		panic("offsets: Ack without Add")
	}
	advanced := x.committed && x.pending == 0 && t.advanceLocked()
	t.mu.Unlock()
	t.inflight.Add(-1)
	if advanced {
		t.signal()
	}
}

// Commit closes x at end, the end LSN of its commit record: the position
// PostgreSQL may skip to once x is delivered (PG docs 55.9, Commit message,
// "The end LSN of the transaction").
func (t *Tracker) Commit(x *Txn, end lsn.LSN) {
	t.mu.Lock()
	if t.open == x {
		t.open = nil
	}
	if x.aborted {
		t.mu.Unlock()
		return
	}
	if x.pending == 0 {
		// Nothing to wait for (no events, or all acknowledged already): x is
		// complete as it commits. Nobody will Ack it again, so it is reused.
		advanced := t.completeLocked(end)
		t.spare = x
		t.mu.Unlock()
		if advanced {
			t.signal()
		}
		return
	}
	x.end = end
	x.committed = true
	t.queue = append(t.queue, x)
	if len(t.queue)-t.head >= t.fold {
		t.foldLocked()
	}
	t.mu.Unlock()
}

// completeLocked records a complete transaction ending at end: the watermark
// moves to end at once when nothing is queued, else the last queued entry
// takes end over, since the watermark may pass both as soon as it may pass
// that entry.
func (t *Tracker) completeLocked(end lsn.LSN) bool {
	if t.head == len(t.queue) {
		if uint64(end) > t.acked.Load() {
			t.acked.Store(uint64(end))
			return true
		}
		return false
	}
	if last := t.queue[len(t.queue)-1]; end > last.end {
		last.end = end
	}
	return false
}

// minFold is the queue length below which complete entries are left in place.
const minFold = 1024

// foldLocked removes the entries behind the head whose events are all
// acknowledged (acks on other partitions while the head waits), raising the
// end of the entry before each. The queue then holds at most about twice
// the transactions with an event in flight: bounded by the producer buffer.
func (t *Tracker) foldLocked() {
	live := t.queue[t.head:]
	n := 0
	for _, x := range live {
		if x.pending == 0 && n > 0 {
			live[n-1].end = max(live[n-1].end, x.end)
			continue
		}
		live[n] = x
		n++
	}
	n = copy(t.queue, live[:n])
	clear(t.queue[n:])
	t.queue, t.head = t.queue[:n], 0
	t.fold = max(minFold, 2*n)
}

// Abort forgets the open transaction x after the stream was lost before its
// Commit. PostgreSQL sends it again in full; its events still in flight are
// acknowledged into the void.
func (t *Tracker) Abort(x *Txn) {
	t.mu.Lock()
	t.abortLocked(x)
	t.mu.Unlock()
}

func (t *Tracker) abortLocked(x *Txn) {
	// Its records are forgotten: an aborted Kafka transaction (exactly_once)
	// never acknowledges them.
	t.inflight.Add(-int64(x.pending))
	x.aborted, x.pending = true, 0
	if t.open == x {
		t.open = nil
	}
}

// Idle moves the watermark to pos, a position the server reported as fully
// sent (keepalive), but only when nothing is open or in flight: otherwise an
// unacknowledged transaction could be skipped on restart.
func (t *Tracker) Idle(pos lsn.LSN) {
	t.mu.Lock()
	idle := t.open == nil && t.head == len(t.queue) && lsn.LSN(t.acked.Load()) < pos
	if idle {
		t.acked.Store(uint64(pos))
	}
	t.mu.Unlock()
	if idle {
		t.signal()
	}
}

// advanceLocked pops fully acknowledged transactions off the front of the
// queue and reports whether the watermark moved.
func (t *Tracker) advanceLocked() bool {
	moved := false
	for t.head < len(t.queue) {
		x := t.queue[t.head]
		if x.pending > 0 {
			break
		}
		t.queue[t.head] = nil
		t.head++
		if uint64(x.end) > t.acked.Load() {
			t.acked.Store(uint64(x.end))
			moved = true
		}
	}
	if t.head == len(t.queue) {
		t.queue, t.head = t.queue[:0], 0
	} else if t.head > 1024 && t.head*2 > len(t.queue) {
		n := copy(t.queue, t.queue[t.head:])
		clear(t.queue[n:])
		t.queue, t.head = t.queue[:n], 0
	}
	return moved
}

func (t *Tracker) signal() {
	select {
	case t.notify <- struct{}{}:
	default:
	}
}
