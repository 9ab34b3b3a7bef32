package chaos

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TxnFault is a fault of the Kafka proxy that reads the protocol
// (testenv.ReadKafkaFrame, testenv.EndTxnRequest). The faults concern
// EndTxn, the request that commits or aborts a transaction.
type TxnFault int32

const (
	// TxnNone passes every frame.
	TxnNone TxnFault = iota
	// TxnForge forwards EndTxn commits, which the coordinator carries out,
	// and answers them and their retries with COORDINATOR_LOAD_IN_PROGRESS
	// until Heal: a commit that happened, reported as retriable.
	TxnForge
	// TxnSwallow drops the next EndTxn commit and resets its connection:
	// the commit never reaches the coordinator, its answer never comes.
	TxnSwallow
	// TxnCutAbort makes an abort and cuts its answer: the next Produce
	// answer says POLICY_VIOLATION for its first partition (the records were
	// appended, the client takes them for refused and aborts), and the
	// EndTxn abort that follows is forwarded, then its connection reset
	// before the answer: the abort may have happened, the client cannot know.
	TxnCutAbort
	// TxnCutCommit forwards the next EndTxn commit and resets its
	// connection before the answer: the commit is the coordinator's to
	// finish, and the client cannot know whether it did.
	TxnCutCommit
)

const (
	coordinatorLoadInProgress = 14
	policyViolation           = 44
)

// txnState is the proxy's EndTxn fault and what it did.
type txnState struct {
	fault    atomic.Int32
	forged   atomic.Int64 // answers rewritten
	swallows atomic.Int64
	aborts   atomic.Int64 // aborts cut
	commits  atomic.Int64 // commits cut (TxnCutCommit)
	refusal  atomic.Bool  // a Produce answer was forged for TxnCutAbort
}

// SetTxnFault arms f until Heal (TxnSwallow, TxnCutAbort and TxnCutCommit
// act once).
// The proxy must have been made with NewKafkaProxy.
func (p *Proxy) SetTxnFault(f TxnFault) {
	p.txn.refusal.Store(false)
	p.txn.fault.Store(int32(f))
}

// TxnCounts reports the EndTxn answers forged, commits swallowed and aborts
// cut so far.
func (p *Proxy) TxnCounts() (forged, swallowed, aborts int64) {
	return p.txn.forged.Load(), p.txn.swallows.Load(), p.txn.aborts.Load()
}

// CommitsCut reports the EndTxn commits forwarded and cut (TxnCutCommit).
func (p *Proxy) CommitsCut() int64 { return p.txn.commits.Load() }

// NewKafkaProxy is NewProxy with the Kafka protocol read frame by frame, so
// that SetTxnFault can act on EndTxn.
func NewKafkaProxy(name, target string) (*Proxy, error) {
	p, err := NewProxy(name, target)
	if err != nil {
		return nil, err
	}
	p.frames = true
	return p, nil
}

// frameLink is what the two directions of one Kafka connection share: the
// correlation ids of the answers to forge, with whether their version is
// flexible, and of the Produce answer to forge, with its version.
type frameLink struct {
	mu      sync.Mutex
	forge   map[int32]bool
	produce map[int32]int16
}

// request decides what to do with a client frame: forward it (and remember
// to forge its answer), or cut the link (with the frame forwarded first,
// or not).
func (p *Proxy) request(fl *frameLink, frame []byte) (forward, cut bool) {
	if TxnFault(p.txn.fault.Load()) == TxnCutAbort && len(frame) >= 12 && binary.BigEndian.Uint16(frame[4:6]) == 0 &&
		p.txn.refusal.CompareAndSwap(false, true) {
		fl.mu.Lock()
		fl.produce[int32(binary.BigEndian.Uint32(frame[8:12]))] = int16(binary.BigEndian.Uint16(frame[6:8]))
		fl.mu.Unlock()
	}
	corr, flexible, commit, ok := testenv.EndTxnRequest(frame)
	if !ok {
		return true, false
	}
	switch f := TxnFault(p.txn.fault.Load()); {
	case f == TxnForge && commit:
		fl.mu.Lock()
		fl.forge[corr] = flexible
		fl.mu.Unlock()
	case f == TxnSwallow && commit && p.txn.fault.CompareAndSwap(int32(f), int32(TxnNone)):
		p.txn.swallows.Add(1)
		return false, true
	case f == TxnCutAbort && !commit && p.txn.fault.CompareAndSwap(int32(f), int32(TxnNone)):
		p.txn.aborts.Add(1)
		return true, true
	case f == TxnCutCommit && commit && p.txn.fault.CompareAndSwap(int32(f), int32(TxnNone)):
		p.txn.commits.Add(1)
		return true, true
	}
	return true, false
}

// answer rewrites a broker frame whose answer is to be forged: the error
// code follows the correlation id, the header's tagged fields (flexible)
// and the throttle time.
func (p *Proxy) answer(fl *frameLink, frame []byte) {
	if len(frame) < 8 {
		return
	}
	corr := int32(binary.BigEndian.Uint32(frame[4:8]))
	fl.mu.Lock()
	flexible, ok := fl.forge[corr]
	delete(fl.forge, corr)
	ver, produce := fl.produce[corr]
	delete(fl.produce, corr)
	fl.mu.Unlock()
	if produce {
		if at, ok := produceErrorAt(frame, ver); ok {
			binary.BigEndian.PutUint16(frame[at:], policyViolation)
			p.txn.forged.Add(1)
		}
		return
	}
	if !ok {
		return
	}
	if at := testenv.AnswerErrorAt(flexible); at+2 <= len(frame) {
		binary.BigEndian.PutUint16(frame[at:], coordinatorLoadInProgress)
		p.txn.forged.Add(1)
	}
}

// pumpFrames is pump for a Kafka link, a frame at a time; toBroker is the
// client's direction.
func (p *Proxy) pumpFrames(l *link, fl *frameLink, dst, src net.Conn, toBroker bool) {
	defer l.close(false)
	for {
		frame, err := testenv.ReadKafkaFrame(src)
		if err != nil {
			return // EOF or an error: either way the link is over
		}
		forward, cut := true, false
		if toBroker {
			forward, cut = p.request(fl, frame)
		} else {
			p.answer(fl, frame)
		}
		if forward {
			if !p.wait(l) {
				return
			}
			if _, err := dst.Write(frame); err != nil {
				return
			}
		}
		if cut {
			l.close(true)
			return
		}
	}
}

// produceErrorAt finds the error code of the first partition of the first
// topic in a Produce answer of version ver: flexible from v9, topics named
// by id instead of name from v13 (Kafka protocol guide, Produce API).
func produceErrorAt(b []byte, ver int16) (int, bool) {
	off := 8 // size, correlation id
	flexible := ver >= 9
	count := func() (int, bool) {
		if flexible {
			n, w := binary.Uvarint(b[min(off, len(b)):])
			if w <= 0 {
				return 0, false
			}
			off += w
			return int(n) - 1, true
		}
		if off+4 > len(b) {
			return 0, false
		}
		off += 4
		return int(int32(binary.BigEndian.Uint32(b[off-4:]))), true
	}
	if flexible {
		off++ // the header's tagged fields
	}
	if n, ok := count(); !ok || n < 1 {
		return 0, false
	}
	if ver >= 13 {
		off += 16 // topic id
	} else if flexible {
		n, ok := count()
		if !ok {
			return 0, false
		}
		off += n
	} else {
		if off+2 > len(b) {
			return 0, false
		}
		off += 2 + int(binary.BigEndian.Uint16(b[off:]))
	}
	if n, ok := count(); !ok || n < 1 {
		return 0, false
	}
	off += 4 // partition index
	return off, off+2 <= len(b)
}
