package replication

import (
	"sync"
	"sync/atomic"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Kind says what a Message carries.
type Kind uint8

const (
	// Data is one pgoutput message.
	Data Kind = iota + 1
	// Keepalive reports that the server has sent everything before WALEnd.
	Keepalive
	// Reset says the connection was lost: the receiver forgets any open
	// transaction and calls Resume with where streaming restarts: a
	// position it can prove (ResumeAt), at or below the end of the last
	// transaction it fully dispatched.
	Reset
)

// Message is one item of the stream, delivered in WAL order.
type Message struct {
	Kind     Kind
	WALStart lsn.LSN // Data: position of the message
	WALEnd   lsn.LSN // server's sent position (Keepalive) or WAL end (Data)
	Data     []byte  // Data: the pgoutput message, owned by the receiver
	resume   chan ResumeAt
}

// ResumeAt is where a reconnect resumes: Pos, which history mark Mark
// proves to be a position of the history the connector decoded (marks.go);
// Mark 0 is no proof, and only the WAL end is checked (sameServer).
type ResumeAt struct {
	Pos  lsn.LSN
	Mark uint64
}

// Resume answers a Reset message.
func (m *Message) Resume(at ResumeAt) { m.resume <- at }

// NewReset returns a Reset message and the channel its Resume answers on.
func NewReset() (Message, <-chan ResumeAt) {
	c := make(chan ResumeAt, 1)
	return Message{Kind: Reset, resume: c}, c
}

// Batch is messages handed to the receiver together, in WAL order: what one
// read burst brought, cut after a transaction's Commit, so the receiver
// wakes once per transaction or burst instead of once per message (a
// one-row transaction is three messages; docs/performance.md).
type Batch struct {
	Msgs   []Message
	budget *budget // where Release returns what it took
	held   int64   // bytes taken from budget
	heldN  int64   // messages taken from budget
	bytes  int64   // of the Data in Msgs
}

// Batches are recycled: at a steady rate every transaction is one.
var batches = sync.Pool{New: func() any { return &Batch{Msgs: make([]Message, 0, 8)} }}

// NewBatch returns a batch holding msgs.
func NewBatch(msgs ...Message) *Batch {
	b := batches.Get().(*Batch)
	for _, m := range msgs {
		b.add(m)
	}
	return b
}

func (b *Batch) add(m Message) {
	b.Msgs = append(b.Msgs, m)
	b.bytes += int64(len(m.Data))
}

// Release tells the stream the receiver is done with b: its data no longer
// counts against Config.QueueBytes (records made from it are bounded by the
// producer's buffer), and b is reused. Call it once, and touch neither b nor
// its Msgs after it; the Data slices stay the receiver's.
func (b *Batch) Release() {
	if b.budget != nil {
		b.budget.release(b.held, b.heldN)
	}
	clear(b.Msgs) // the Data slices may live on in records; the batch must not pin them
	if cap(b.Msgs) > batchMessages {
		b.Msgs = nil // a huge one-off (a test's) is not kept
	}
	*b = Batch{Msgs: b.Msgs[:0]}
	batches.Put(b)
}

// A batch is handed over once it holds this much even inside a transaction,
// so a large transaction streams rather than gathers.
const (
	batchMessages = 128
	batchBytes    = 256 << 10
)

func (b *Batch) full(maxMsgs int, maxBytes int64) bool {
	return len(b.Msgs) >= maxMsgs || b.bytes >= maxBytes
}

// budget bounds the WAL data handed to the receiver and not yet released,
// in bytes and in messages (a drain of small rows is bounded by the count).
// One goroutine (the stream) takes; any goroutine releases.
type budget struct {
	limit, msgLimit int64
	used, msgs      atomic.Int64
	freed           chan struct{} // signalled (coalesced) by release
}

func newBudget(limit, msgLimit int64) *budget {
	return &budget{limit: limit, msgLimit: msgLimit, freed: make(chan struct{}, 1)}
}

// take reserves n bytes in k messages if they fit, or if nothing is
// reserved: a batch larger than the whole budget goes alone rather than never.
func (b *budget) take(n, k int64) bool {
	// Only releases race with this, and they only make room.
	used, msgs := b.used.Load(), b.msgs.Load()
	if (used > 0 || msgs > 0) && (used+n > b.limit || msgs+k > b.msgLimit) {
		return false
	}
	b.used.Add(n)
	b.msgs.Add(k)
	return true
}

func (b *budget) release(n, k int64) {
	b.used.Add(-n)
	b.msgs.Add(-k)
	select {
	case b.freed <- struct{}{}:
	default:
	}
}
