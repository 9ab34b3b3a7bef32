package replication

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

const (
	// GuardMargin vouches for a reading that a transaction running at it
	// keeps from settling (a long transaction elsewhere in the cluster): a
	// reading that much later sees every commit written before it, barring
	// one held back for as long by a synchronous standby.
	GuardMargin = time.Second
	// maxPending bounds the readings waiting to be vouched for.
	maxPending = 64
)

// Guard keeps the outbox in the stream. PostgreSQL decodes an insert only if
// the table was in the publication when the insert was written, so an outbox
// dropped, renamed or removed from the publication stops producing events
// without any error in the stream. The guard reads the membership when asked
// and vouches for a position only once a later reading, which sees
// everything committed before it, still finds the table in place; nothing
// beyond that position is confirmed (the pipeline's gate), so a restart
// after the fix starts before the first insert that was not decoded.
type Guard struct {
	src      Source
	watch    *Watch
	start    Membership
	pending  []reading // good readings not vouched for yet, oldest first
	last     uint64    // snapshot xmin of the last good reading
	lastAt   lsn.LSN   // and its After
	lastConn uint64    // and the watch's connection it was read on
	// first is the WAL position read before the first reading, which found
	// every mapped column: a Relation message of a transaction committed
	// before it describes the table as it was, not as it is.
	first lsn.LSN

	verified atomic.Uint64 // position up to which membership held
	xmin     atomic.Uint64 // gap bound of the reading behind verified
	ended    atomic.Pointer[Ended]

	floorMu sync.Mutex
	floors  []floorPair // good readings' (After, Xmin), oldest first
	saved   floorPair   // the last floor handed out: it survives a reconnect
	conns   uint64      // the watch's connection the floors were read on
	// gapAt is the reading that found the outbox out of the stream (with
	// the lock holders), read on the watch's connection gapConn; zero:
	// none yet.
	gapAt   Snapshot
	gapConn uint64
	// holdersAt is when a reading last read the lock holders.
	holdersAt time.Time
}

// holdersEvery spaces the readings that read the lock holders (pg_locks):
// a gap's finished transactions come from the newest one behind it.
const holdersEvery = time.Second

// floorPair is a reading's WAL insert position after its snapshot and the
// snapshot's xmin: every transaction that commits after at has an id at or
// above xmin.
type floorPair struct {
	at   lsn.LSN
	xmin uint64
	// fin is what the reading knew of the ended transactions (zero Xmax:
	// nothing, as for a floor saved with a checkpoint).
	fin Finished
	// unsettled are the transactions running at the reading that no later
	// good reading has seen end yet (Guard.Finished).
	unsettled []uint64
}

// Finished names the transactions that had ended at a reading: every id
// below Xmax but those in Open (its running ones and every id holding its
// own lock then, subtransactions' included, Snapshot.Holders). Each had
// inserted its commit record before the reading's After.
type Finished struct {
	Xmax uint64
	Open []uint64
}

// finishedOf is s's Finished; zero on a standby (no Holders).
func finishedOf(s Snapshot) Finished {
	if s.Holders == nil || s.Xmax == 0 {
		return Finished{}
	}
	open := slices.Concat(s.Running, s.Holders)
	slices.Sort(open)
	return Finished{Xmax: s.Xmax, Open: slices.Compact(open)}
}

// maxFloors bounds the floors kept: the oldest and the newest; a
// checkpoint trails the readings by a few seconds, unless the
// acknowledgements stall, and an older floor is only lower.
const maxFloors = 256

// reading is a good membership reading and when it was taken.
type reading struct {
	Snapshot
	at time.Time
	// before is the snapshot xmin of the reading taken just before this
	// one. A transaction that committed between this reading's Before and
	// its snapshot can be below its own xmin, but was running at (or began
	// after) the one before: the gap's rows are bounded by that xmin.
	before uint64
	// beforeAt is the After of the reading taken just before this one (0
	// for the first): every transaction below before had inserted its
	// commit record by then (Ended).
	beforeAt lsn.LSN
}

// NewGuard takes the first reading; from is the start position, vouched for
// by the setup that checked the table.
func NewGuard(ctx context.Context, src Source, from lsn.LSN) (*Guard, error) {
	g := &Guard{src: src, watch: NewWatch(src), holdersAt: time.Now()}
	s, err := g.watch.read(ctx, 0, true)
	if err != nil {
		g.watch.Close()
		return nil, err
	}
	if why := s.LeftStream(src, s.Membership) + s.SchemaProblem(src); why != "" {
		g.watch.Close()
		return nil, &fault.PrerequisiteError{Problem: why, Fix: "see docs/operations.md, \"Changing the outbox table while the connector runs\""}
	}
	g.start, g.first = s.Membership, s.Before
	g.addFloor(s)
	g.pending = []reading{{s, time.Now(), s.Xmin, 0}}
	g.last, g.lastAt, g.lastConn = s.Xmin, s.After, g.watch.conns
	g.verified.Store(uint64(from))
	g.xmin.Store(s.Xmin)
	return g, nil
}

// Verified is the highest position the membership readings vouch for.
func (g *Guard) Verified() lsn.LSN { return lsn.LSN(g.verified.Load()) }

// Check reads the membership once. It returns why the outbox left the stream
// (gap: inserts are no longer decoded) or why its rows can no longer be
// mapped, or "" (also on a failed reading, which only holds the gate).
func (g *Guard) Check(ctx context.Context) (why string, gap bool) {
	now := time.Now() // before the read: the readings a second apart each read the holders
	holders := now.Sub(g.holdersAt) >= holdersEvery
	s, err := g.watch.read(ctx, g.start.RelID, holders)
	if err != nil {
		return "", false
	}
	if holders {
		g.holdersAt = now
	}
	if s.LeftStream(g.src, g.start) != "" {
		// A reading taken while the catalog changed can mix two states
		// (pg_publication_tables reads a newer snapshot than the rest): a
		// second reading, whose snapshot follows the change, says what it was.
		s, err = g.watch.read(ctx, g.start.RelID, true)
		if err != nil {
			return "", false
		}
		if why := s.LeftStream(g.src, g.start); why != "" {
			g.floorMu.Lock()
			g.gapAt, g.gapConn = s, g.watch.conns
			g.floorMu.Unlock()
			return why, true
		}
	}
	if why := s.SchemaProblem(g.src); why != "" {
		return why, false
	}
	g.vouch(reading{s, time.Now(), g.last, pairAfter(g.lastAt, g.lastConn, g.watch.conns)})
	g.last, g.lastAt, g.lastConn = s.Xmin, s.After, g.watch.conns
	g.addFloor(s)
	return "", false
}

// addFloor keeps a good reading's floor. A reading on a new connection may
// be of a server restored under the same timeline, whose xids after the
// restore point are assigned again: the floors of the old connection go,
// but for the one last saved with a checkpoint (its position is one the
// connector checks the new server holds, or it stops).
func (g *Guard) addFloor(s Snapshot) {
	g.floorMu.Lock()
	defer g.floorMu.Unlock()
	if c := g.watch.conns; c != g.conns {
		g.conns, g.floors = c, nil
		if g.saved.at != 0 {
			// As a bound only: what it knew of the ended transactions is
			// the old connection's, maybe another server's (review15).
			g.floors = append(g.floors, floorPair{at: g.saved.at, xmin: g.saved.xmin})
		}
	}
	for i := range g.floors {
		g.floors[i].unsettled = slices.DeleteFunc(g.floors[i].unsettled, s.ended)
	}
	if len(g.floors) == maxFloors {
		// The oldest stays: it is the floor of positions as old as the
		// checkpoint, which stalls with the acknowledgements while the
		// readings go on (a lower floor only bounds more).
		g.floors = slices.Delete(g.floors, 1, 2)
	}
	f := floorPair{at: s.After, xmin: s.Xmin, fin: finishedOf(s)}
	if f.fin.Xmax != 0 {
		// The running list names only ids below xmax: a running
		// transaction at or above it (the newest, a prepared one's
		// stand-in) shows only by its lock (review15).
		f.unsettled = slices.Clone(s.Running)
		for _, h := range s.Holders {
			if h >= s.Xmax {
				f.unsettled = append(f.unsettled, h)
			}
		}
	}
	g.floors = append(g.floors, f)
}

// SeedFloor gives the floor saved with the checkpoint the run starts from.
func (g *Guard) SeedFloor(at lsn.LSN, xmin uint64) {
	g.floorMu.Lock()
	defer g.floorMu.Unlock()
	if xmin != 0 {
		g.saved = floorPair{at: at, xmin: xmin}
		g.floors = append([]floorPair{g.saved}, g.floors...)
	}
}

// Floor bounds the transactions that commit after pos: each has an id at
// or above it (offsets.Checkpoint.Floor); 0 when no reading is old enough.
func (g *Guard) Floor(pos lsn.LSN) uint64 {
	g.floorMu.Lock()
	defer g.floorMu.Unlock()
	best := floorPair{}
	for _, f := range g.floors {
		if f.at <= pos {
			best = f
		}
	}
	if best.xmin != 0 && best.at >= g.saved.at {
		g.saved = best
	}
	return best.xmin
}

// Finished is what the newest reading behind pos that read the lock
// holders knew of the ended transactions, once a reading found the outbox
// out of the stream (gapAt); false when unknown. Each such transaction
// committed before pos and before the change that took the table out: a
// change running at that reading (a commit a synchronous standby keeps
// invisible after its record, past GuardMargin) would have been seen
// neither ending by a later good reading nor still running at gapAt, so
// the reading is used only when each of its running transactions was seen
// so (review14). Not across a new connection either: it may be to another
// server (a restore), whose ids past the fork are assigned again. Open
// takes in gapAt's holders too: the subtransactions of a transaction still
// running then, one of which may have taken its id at the reading, before
// its lock.
func (g *Guard) Finished(pos lsn.LSN) (Finished, bool) {
	g.floorMu.Lock()
	defer g.floorMu.Unlock()
	gap := g.gapAt
	if gap.Xmax == 0 || gap.Holders == nil || g.gapConn != g.conns {
		return Finished{}, false
	}
	best := -1
	for i, f := range g.floors {
		if f.at <= pos && f.fin.Xmax != 0 {
			best = i
		}
	}
	if best < 0 {
		return Finished{}, false
	}
	for _, x := range g.floors[best].unsettled {
		if x < gap.Xmax && !slices.Contains(gap.Running, x) && !slices.Contains(gap.Holders, x) {
			return Finished{}, false
		}
	}
	// The holders of every later reading too: a subtransaction that took
	// its id before the reading and its lock after it shows in one of them
	// while its transaction runs.
	open := slices.Clone(gap.Holders)
	for _, f := range g.floors[best:] {
		open = append(open, f.fin.Open...)
	}
	slices.Sort(open)
	return Finished{Xmax: g.floors[best].fin.Xmax, Open: slices.Compact(open)}, true
}

// Start is the membership read when the guard began.
func (g *Guard) Start() Membership { return g.start }

// vouch adds a good reading and moves the verified position. A reading
// vouches for its own position only once no commit written before it can
// have been invisible to it: once every transaction running at it has
// ended, seen by a later good reading (a commit record is written before
// the transaction stops running, so a commit before Before that the reading
// did not see was one of its running transactions). The outbox was in the
// stream at every good reading, and a removal between two of them shows in
// the later one, so the position is then safe.
func (g *Guard) vouch(r reading) {
	best := -1
	for i, p := range g.pending {
		if p.Settled(r.Snapshot) || r.at.Sub(p.at) >= GuardMargin {
			best = i
		}
	}
	if best >= 0 {
		g.advance(g.pending[best])
		g.pending = g.pending[best+1:]
	}
	if len(r.Running) == 0 { // nothing could be in flight: vouches for itself
		g.advance(r)
		g.pending = g.pending[:0]
		return
	}
	if len(g.pending) == maxPending {
		g.pending = g.pending[1:]
	}
	g.pending = append(g.pending, r)
}

func (g *Guard) advance(r reading) {
	if r.Before > g.Verified() {
		xmin := min(r.Xmin, r.before)
		g.xmin.Store(xmin)
		g.verified.Store(uint64(r.Before))
		if r.beforeAt != 0 {
			g.ended.Store(&Ended{Below: xmin, By: r.beforeAt})
		}
	}
}

// pairAfter is the After the next reading pairs with the last good one's
// xmin (reading.beforeAt), or 0 (no pair) when it is read on another
// connection than that one: a new connection may be to another server (a
// restore on the same timeline, a promoted standby that was behind), whose
// ids past the fork are assigned again, so the old After bounds nothing
// there (review12), as addFloor drops the old floors.
func pairAfter(lastAt lsn.LSN, lastConn, conn uint64) lsn.LSN {
	if conn != lastConn {
		return 0
	}
	return lastAt
}

// Ended says that every transaction with an id below Below had inserted its
// commit record at or before the WAL position By. Below is at most the xmin
// of the reading before the vouching one, and a transaction below it had
// left the proc array before that reading's snapshot, after its commit
// record was inserted; By is that reading's After, the insert position read
// after its snapshot (on a standby, the replay position). Not the vouching
// reading's Before: that is the WAL write position, and an asynchronous
// commit (synchronous_commit off) leaves the proc array before its record
// is written (review11). By can be past Verified (a write position read
// later can trail an insert position read earlier, review12); what the
// repair needs is that a change to the membership commits after By, and it
// does: every good reading up to the vouching one found the membership in
// place, so the change was neither visible to the vouching reading's
// snapshot nor running at it (the reading that settled it would have seen
// the change), so it took its id after that snapshot and wrote its commit
// record after By (but for the synchronous-standby wait GuardMargin
// allows).
type Ended struct {
	Below uint64
	By    lsn.LSN
}

// Vouched is the bound and position of the last reading that vouched, read
// together; false before one with a reading before it did (the first
// reading's own xmin bounds nothing by its Before: its snapshot was taken
// after it).
func (g *Guard) Vouched() (Ended, bool) {
	if e := g.ended.Load(); e != nil {
		return *e, true
	}
	return Ended{}, false
}

// Xmin bounds the rows the stream may have missed since Verified: every one
// was written by a transaction at or above it.
func (g *Guard) Xmin() uint64 { return g.xmin.Load() }

// First is the WAL position read before the first reading, which found every
// mapped column.
func (g *Guard) First() lsn.LSN { return g.first }

// RelID is the outbox's OID at start.
func (g *Guard) RelID() uint32 { return g.start.RelID }

// Close releases the connection.
func (g *Guard) Close() { g.watch.Close() }
