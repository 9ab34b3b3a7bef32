package pipeline

import (
	"math"
	"sync"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// holdBack keeps, in exactly_once, the slot's confirmed position and the
// checkpoint at or before the commit of every outbox transaction a gap
// repair could read back from the table. A repair reads every row written
// by a transaction at or above the gap's xmin bound (the guard's Xmin when
// it vouched last, which only grows), and such a transaction may have
// committed, and been delivered, long before the gap (a long transaction
// elsewhere holds the bound down). PostgreSQL streams nothing committed
// before the slot's confirmed position (PG docs 48.2.3, "Replication
// Slots"), so the restart after a gap starts at or before each of them,
// decodes it again (skipped: it is in Kafka) and the repair leaves its rows
// out (backfill.seen). What lies below the position committed to Kafka is
// skipped, never published, so only the slot and the checkpoint trail.
type holdBack struct {
	mu sync.Mutex
	// txns are outbox transactions decoded, in commit order, with the
	// highest xid each stands for; entries below the bound are dropped.
	txns []heldTxn
	// frontier is how far the stream decoded (from its start): nothing
	// beyond it was seen, so nothing beyond it is confirmed either.
	frontier lsn.LSN
}

type heldTxn struct {
	xid   uint32 // top-level id (the stream gives no subtransaction's)
	final lsn.LSN
}

// maxHeld bounds the list: past it the newest entry takes the next
// transaction in, holding at its own commit until the bound passes the
// higher id: later, never earlier. Merging at the back keeps the front
// exact, so the hold still follows the bound under a load that keeps the
// list full; merging the two oldest made the front entry take ever newer
// ids while it kept the oldest commit, and the slot never moved while the
// load lasted (review8, found while the hold was tried in at_least_once).
const maxHeld = 4096

func newHoldBack(from lsn.LSN) *holdBack { return &holdBack{frontier: from} }

// add notes an outbox transaction the stream decoded (published or skipped).
func (h *holdBack) add(xid uint32, final lsn.LSN) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.txns); n == maxHeld {
		h.txns[n-1].xid = laterXid(h.txns[n-1].xid, xid)
		return
	}
	h.txns = append(h.txns, heldTxn{xid, final})
}

// decoded moves the frontier: the stream delivered everything before pos
// (a commit's end, or a keepalive between transactions).
func (h *holdBack) decoded(pos lsn.LSN) {
	h.mu.Lock()
	h.frontier = max(h.frontier, pos)
	h.mu.Unlock()
}

// at is the highest position that may be confirmed while bound (a full
// transaction id) is the lowest xmin a repair could read from.
func (h *holdBack) at(bound uint64) lsn.LSN {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.txns) > 0 && !xidAtLeast(h.txns[0].xid, bound) {
		h.txns = h.txns[1:]
	}
	if len(h.txns) > 0 {
		return min(h.txns[0].final, h.frontier)
	}
	return h.frontier
}

// xidAtLeast compares a 32-bit xid with a full one the way PostgreSQL
// compares xids (modulo 2³², within 2³¹ of each other: TransactionIdPrecedes).
func xidAtLeast(x uint32, full uint64) bool { return int32(x-uint32(full)) >= 0 }

func laterXid(a, b uint32) uint32 {
	if int32(a-b) > 0 {
		return a
	}
	return b
}

// holdAt is the position the hold allows confirming (none: the highest).
func (e *eos) holdAt() lsn.LSN {
	p := e.p
	if p.plan.guard == nil {
		return lsn.LSN(^uint64(0))
	}
	bound := min(p.plan.guard.Xmin(), savedStreamXmin(p.plan.checkpoints))
	if x, ok := p.rep.bound(p.tracker.Acked()); ok {
		// Until the repair committed, a restart repairs again: it must
		// decode everything this run decoded from the gap's bound on.
		bound = min(bound, x)
	}
	return e.hold.at(bound)
}

// savedStreamXmin is the lowest bound the checkpoint the store holds
// recorded for a publication change while the connector is stopped
// (offsets.TableStream.Xmin): a restart that finds one repairs from it, so
// the slot must not pass a delivered row it would read (saves trail the
// status updates). None: no bound.
func savedStreamXmin(store *offsets.Stamped) uint64 {
	b := uint64(math.MaxUint64)
	if c, ok := store.Held(); ok {
		for _, ts := range c.Stream {
			if ts.Xmin != 0 {
				b = min(b, ts.Xmin)
			}
		}
	}
	return b
}

// held confirms no position the hold keeps back.
type held struct {
	replication.Positions
	b boundary
}

func (x held) Acked() lsn.LSN { return min(x.Positions.Acked(), x.b.holdAt()) }
