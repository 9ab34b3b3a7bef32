// Package minimal is the smallest correct outbox connector: a pglogrepl
// stream of pgoutput from a slot, each insert into the outbox table produced
// with franz-go at its defaults plus a 10 ms linger, and the slot confirmed
// only up to the end of transactions whose every record Kafka acknowledged.
// No router templates, metrics, gate or checkpoint store: it is the floor
// the benchmark holds outbox-cdc's defaults against (issue 39).
//
// Invariant (Tracker): the confirmable position is the end LSN of the last
// transaction T such that T and every transaction received before it are
// committed and have every record acknowledged. A failed acknowledgement
// stops the position before its transaction for good.
package minimal

import (
	"sync"

	"github.com/jackc/pglogrepl"
)

// Txn is one PostgreSQL transaction in flight.
type Txn struct {
	pending   int           // records produced, not yet acknowledged
	events    int           // records produced
	end       pglogrepl.LSN // the commit's end LSN, set by Commit
	committed bool          // its COMMIT was received
	failed    bool          // a record of it was not acknowledged
}

// Tracker is the in-order acknowledgement tracker. The stream goroutine
// calls Begin, Produced and Commit; franz-go's promises call Acked from its
// own goroutines, hence the lock.
type Tracker struct {
	mu        sync.Mutex
	queue     []*Txn // oldest first; a transaction leaves once confirmable
	confirmed pglogrepl.LSN
	events    int64 // records of the transactions that left the queue
	err       error // the first failed acknowledgement

	goal    int64 // > 0: reached closes once events >= goal
	reached chan struct{}
}

// NewTracker returns a tracker; with goal > 0, Reached is closed once goal
// events are confirmable (the benchmark's drain: stop after N).
func NewTracker(goal int64) *Tracker {
	return &Tracker{goal: goal, reached: make(chan struct{})}
}

// Begin opens the next transaction, after every one opened before.
func (t *Tracker) Begin() *Txn {
	x := &Txn{}
	t.mu.Lock()
	t.queue = append(t.queue, x)
	t.mu.Unlock()
	return x
}

// Produced counts one record of x; it must be called before the record is
// handed to the producer, so its acknowledgement cannot come first.
func (t *Tracker) Produced(x *Txn) {
	t.mu.Lock()
	x.pending++
	x.events++
	t.mu.Unlock()
}

// Acked settles one record of x: err nil is Kafka's acknowledgement.
func (t *Tracker) Acked(x *Txn, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x.pending--
	if err != nil {
		x.failed = true
		if t.err == nil {
			t.err = err
		}
	}
	t.advance()
}

// Commit closes x at its end LSN: no record of it comes after this.
func (t *Tracker) Commit(x *Txn, end pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x.end, x.committed = end, true
	t.advance()
}

// advance drops the confirmable transactions from the head of the queue.
func (t *Tracker) advance() {
	i := 0
	for ; i < len(t.queue); i++ {
		x := t.queue[i]
		if !x.committed || x.pending > 0 || x.failed {
			break
		}
		t.confirmed = max(t.confirmed, x.end)
		t.events += int64(x.events)
		t.queue[i] = nil // the backing array outlives the slice head
	}
	t.queue = t.queue[i:]
	if t.goal > 0 && t.events >= t.goal {
		select {
		case <-t.reached:
		default:
			close(t.reached)
		}
	}
}

// Confirmable is the position the slot may be confirmed to, and the first
// failed acknowledgement, if any.
func (t *Tracker) Confirmable() (pglogrepl.LSN, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed, t.err
}

// Events is the number of records in confirmable transactions.
func (t *Tracker) Events() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events
}

// InFlight is the number of transactions not yet confirmable.
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.queue)
}

// Reached is closed once the goal is confirmable (never without a goal).
func (t *Tracker) Reached() <-chan struct{} { return t.reached }
