package pipeline

import (
	"log/slog"
	"math"
	"sync/atomic"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// The gap repair's whole lifecycle, one owner (repair):
//
//  1. found: the guard sees an outbox leave the stream while the connector
//     runs (guard.go failGap, the final check), or the start finds the
//     publication changed since the checkpoint (streamstate.go,
//     stoppedChange). Rows written meanwhile were never decoded; they are
//     still in the table.
//  2. recorded: every checkpoint saved carries the gap (toSave), in
//     exactly_once anchored at the last position handed to Kafka (anchor).
//  3. decided, once, at start (decide): the gap the checkpoint holds is
//     repaired by this run, unless Kafka's committed position is past it
//     (exactly_once: the repair committed with its position before the
//     restart); a repair it records as handed over is resolved from that
//     position (resolved); a change while stopped places a gap of its own.
//  4. run: where the stream reaches Since the processor reads the rows
//     back, but for those earlier repairs read, and publishes them
//     (backfill.go, runBackfill); in exactly_once the slot and the
//     checkpoint are held back meanwhile (hold.go, bound).
//  5. committed: the repair is recorded with the gap, then its transaction
//     handed over (committed); once the watermark passes its rows' commits
//     the gap has nothing left to read, and once the guard's bound passes
//     the rows its repairs read it is cleared (recorded).

// gapInfo is what a restart needs to publish the rows the stream could not
// decode: the position the guard vouched for and the snapshot xmin of the
// reading behind it. Every row written by a transaction at or above Xmin
// may have been written while the table was outside the publication, but
// for the rows an earlier repair read (Repaired, and Pending's once its
// transaction committed).
type gapInfo = offsets.Gap

// noXmin is the bound of a gap with nothing left to read: its repairs are
// in Kafka, and it is kept for what they read (Repaired) until cleared.
const noXmin = math.MaxUint64

// resolved is the gap a run repairs, given the position committed to
// Kafka (exactly_once; zero otherwise). A pending repair is in Kafka if it
// published nothing (End zero: the rows it read were the stream's) or if
// Kafka's position is at or past its transaction's end: its rows are left
// out, and only what was found after it (Later; zero: nothing) is read.
// Otherwise (or in at_least_once, which cannot tell) the whole gap is.
func resolved(g gapInfo, committed lsn.LSN) gapInfo {
	p := g.Pending
	g.Pending = offsets.PendingRepair{}
	if !p.Rows.IsZero() && (p.End == 0 || committed >= p.End) {
		g.Xmin, g.Repaired = noXmin, p.Rows
		if p.Later != 0 {
			g.Xmin = p.Later
		}
	}
	return g
}

// repair owns the gap and its repair. The fields set at start (decide) are
// read-only once the run's goroutines start; the atomics are written by the
// guard (found), the processor (committed) and the checkpoint writer
// (recorded), each a transition of this type.
type repair struct {
	log *slog.Logger

	gap       atomic.Pointer[gapInfo] // not repaired yet: recorded in every checkpoint
	clear     atomic.Uint64           // set once the repair committed: the gap is repaired past it
	pending   atomic.Bool             // this run has a repair to commit
	at        atomic.Uint64           // end of the repair's transaction
	foundHere atomic.Bool             // the guard found a gap in this run (anchor)
	kept      atomic.Bool             // a checkpoint records this run's repair (wasSaved)

	// Set at start, before any goroutine.
	loaded *gapInfo      // the gap this run repairs (from the checkpoint, or a change while stopped)
	bf     *backfill     // the repair the processor runs; nil: none
	floor  func() uint64 // the lowest bound a gap found from now on could have (the guard's); nil: none

	// The checkpoint writer's (one at a time: the loop, then the shutdown).
	saved    *gapInfo // the gap in the last checkpoint saved
	anchored *gapInfo // the gap anchor raised last
}

func newRepair(log *slog.Logger) *repair { return &repair{log: log} }

// load records the gap the trusted checkpoint holds (setup, plan.go); decide
// says whether this run repairs it.
func (r *repair) load(g gapInfo) {
	r.log.Warn("the outbox table was outside the stream when the connector stopped: its rows written since are read "+
		"from the table when the stream reaches the gap", "since", g.Since, "xmin", g.Xmin)
	gi := &g
	r.gap.Store(gi)
	r.saved, r.loaded = gi, gi
}

// stoppedChange is a change of the publication or a table found at start
// since the checkpoint was saved (streamstate.go).
type stoppedChange struct {
	why   string
	since lsn.LSN // where the repair goes: the run's start, past the checkpoint and Kafka's position
	xmin  uint64  // the lowest bound of the changed tables' rows the stream may lack
	// saved is the bound saved with the checkpoint (xmin before the floor
	// of since lowered it, stoppedBound): the bound when the change joins a
	// loaded gap's repair, which goes where the stream reaches that gap.
	saved uint64
}

// decide is the one decision whether this run repairs a gap, taken once the
// start is known. committed is the position committed to Kafka
// (exactly_once; zero otherwise): past the loaded gap's Since it says the
// repair committed before the restart (backfill.due: nothing commits past
// Since before the repair does). ch is a change found while stopped (nil:
// none). It reports whether the run placed a gap of its own (saved before
// the stream starts) and whether that repair's rows are to be looked up in
// Kafka first: the loaded gap's repair committed already and the state saved
// is from before it, so the new repair reads those rows again
// (readback_repair.go).
func (r *repair) decide(committed lsn.LSN, ch *stoppedChange) (placed, lookUp bool) {
	repairs := r.loaded != nil
	if repairs && r.loaded.Pending != (offsets.PendingRepair{}) {
		// Saved before the stream starts (placed): this run's own commits
		// may pass the pending repair's end, which a later start would
		// take for that repair's.
		res := resolved(*r.loaded, committed)
		r.log.Info("the gap records a repair handed over to Kafka", "committed", committed, "repair_end",
			r.loaded.Pending.End, "in_kafka", !res.Repaired.IsZero() && res.Repaired == r.loaded.Pending.Rows, "xmin", res.Xmin)
		r.loaded, placed = &res, true
		r.gap.Store(&res)
	}
	if repairs && (committed > r.loaded.Since || r.loaded.Xmin == noXmin) {
		r.log.Info("the gap's rows were published before the restart; not reading them again", "since", r.loaded.Since,
			"committed", committed)
		repairs = false
		// Kept, with nothing left to read, for what its repairs read: a
		// gap found before it clears merges with it (found).
		done := *r.loaded
		done.Xmin = noXmin
		r.loaded = &done
		r.gap.Store(&done)
		r.clear.Store(uint64(max(committed, done.Since, 1))) // zero: not set
	}
	if ch != nil {
		gi := &gapInfo{Since: ch.since, Xmin: ch.xmin}
		old := r.gap.Load()
		switch {
		case old != nil && repairs && old.Xmin <= ch.saved:
			// The loaded gap's repair reads every row at or above its
			// bound, at its place (which a run that found it may have
			// anchored): it covers this change. Not the floor of the
			// start: a repair there must take in what the stream replays
			// after it (stoppedBound), one at the gap comes after that
			// replay, and a lower bound only adds rows delivered before
			// the start, sent again behind the replay's newer rows, out of
			// order (TestGapRepairStoppedChangeKeepsGapBound).
			ch = nil
		case old != nil && repairs:
			// Only a lower bound widens it; what an earlier repair read
			// is in Kafka still.
			gi = &gapInfo{Since: old.Since, Xmin: ch.saved, Repaired: old.Repaired, LookUp: old.LookUp, Finished: old.Finished}
		case old != nil:
			// Its repair committed: it covers nothing of this change, and
			// what it read is in Kafka.
			gi.Repaired, gi.LookUp = old.Repaired, true
		}
		if ch != nil {
			r.log.Warn("the outbox's publication changed while the connector was stopped: rows written meanwhile may never "+
				"have been decoded; they are read back from the table and published when the stream reaches the checkpoint",
				"change", ch.why, "since", gi.Since, "xmin", gi.Xmin)
			r.gap.Store(gi)
			r.clear.Store(0) // a committed old gap set it: this one is cleared by its own repair
			r.loaded, placed, repairs = gi, true, true
		}
	}
	if repairs {
		r.bf = newBackfill(*r.loaded)
		r.pending.Store(true)
		lookUp = r.loaded.LookUp
	}
	return placed, lookUp
}

// found records a gap the guard found while the connector ran: merged with
// an earlier one not cleared yet, and cleared only by a later repair. If
// this run repairs the earlier one, the repair's record (committed) says
// where the new part begins (Later): a restart that finds that repair in
// Kafka reads only from there, but for the rows it read (resolved). They
// were never decodable, so the stream would not tell they are delivered.
func (r *repair) found(g gapInfo) {
	r.foundHere.Store(true)
	for {
		old := r.gap.Load()
		next := g
		if old != nil {
			next = gapInfo{Since: min(old.Since, g.Since), Xmin: min(old.Xmin, g.Xmin), Repaired: old.Repaired,
				Pending: old.Pending, LookUp: old.LookUp, Finished: finishedAt(*old, g)}
			if r.pending.Load() || !old.Pending.Rows.IsZero() {
				next.Pending.Later = lowerXmin(old.Pending.Later, g.Xmin)
			}
		}
		if r.gap.CompareAndSwap(old, &next) {
			break
		}
	}
	r.clear.Store(0)
}

// finishedAt is the finished transactions of two gaps merged at the lower
// Since: the reading behind it (one behind the higher could name a
// transaction that commits between the two, which the stream decodes only
// after the repair). Zero when unknown.
func finishedAt(a, b gapInfo) offsets.FinishedTxns {
	switch {
	case a.Since < b.Since:
		return a.Finished
	case b.Since < a.Since:
		return b.Finished
	case a.Finished.IsZero() || b.Finished.IsZero():
		return offsets.FinishedTxns{}
	case a.Finished.Xmax <= b.Finished.Xmax:
		return a.Finished
	}
	return b.Finished
}

// lowerXmin is the lower of two bounds, zero standing for none.
func lowerXmin(a, b uint64) uint64 {
	if a == 0 || b == 0 {
		return max(a, b)
	}
	return min(a, b)
}

// open reports whether a gap with rows left to read is recorded (a done
// record, kept for what its repairs read, is not: finalCheck still reads).
func (r *repair) open() bool {
	g := r.gap.Load()
	return g != nil && g.Xmin != noXmin
}

// blocksRetention reports whether rows may be missing from Kafka that only
// the table holds: a gap recorded with rows left to read, or a repair not
// committed yet.
func (r *repair) blocksRetention() bool {
	g := r.gap.Load()
	return g != nil && g.Xmin != noXmin || r.pending.Load()
}

// committed is told that the repair's transaction was handed over, ending
// at end, with the rows it read: the gap records them as pending (resolved),
// unconditionally if it published none. Once the watermark passes every
// row's commit (clearAt) the gap is repaired, unless a part was found
// since (Later), which only a later repair clears.
func (r *repair) committed(end, clearAt lsn.LSN, rows offsets.RepairedRows, published bool) {
	r.at.Store(uint64(end))
	for {
		cur := r.gap.Load()
		if cur == nil {
			break // never: only a repair's own clear drops its gap
		}
		next := *cur
		next.Pending.Rows, next.Pending.End = rows, end
		if !published {
			next.Pending.End = 0
		}
		if r.gap.CompareAndSwap(cur, &next) {
			if next.Pending.Later == 0 {
				r.clear.Store(uint64(clearAt))
			}
			break
		}
	}
	r.pending.Store(false) // after the record: found reads one or the other
}

// bound is the gap's xmin bound while a restart would repair it again: the
// repair did not commit, the watermark has not passed its transaction, or
// no checkpoint records it yet (one that published nothing moves no
// position in Kafka: only the record tells a restart its rows are in).
// exactly_once's hold keeps the slot at or before every transaction from
// there on (hold.go).
func (r *repair) bound(acked lsn.LSN) (uint64, bool) {
	g := r.gap.Load()
	at := lsn.LSN(r.at.Load())
	if g != nil && (r.pending.Load() || acked < at || (at != 0 && !r.kept.Load())) {
		return g.Xmin, true
	}
	return 0, false
}

// recorded is the gap to record with a checkpoint at acked. Once the repair
// committed and the watermark passed every row it published, the gap has
// nothing left to read; it is kept for what its repairs read until no gap
// found from now on can reach those rows (floor: the guard's bound, which
// a gap found while running, or a change found at the next start, takes
// for its own), then forgotten.
func (r *repair) recorded(acked lsn.LSN) *gapInfo {
	g := r.gap.Load()
	if g == nil {
		return nil
	}
	if c := lsn.LSN(r.clear.Load()); c != 0 && acked >= c && g.Pending.Later == 0 {
		done := gapInfo{Since: g.Since, Xmin: noXmin, Repaired: g.Repaired}
		if !g.Pending.Rows.IsZero() {
			done.Repaired = g.Pending.Rows // with g.Repaired (readRows)
		}
		switch {
		case r.floor == nil || done.Repaired.IsZero() || r.floor() >= readAbove(done.Repaired):
			if r.gap.CompareAndSwap(g, nil) {
				r.log.Info("gap repaired", "since", g.Since)
				return nil
			}
		case *g != done:
			if r.gap.CompareAndSwap(g, &done) {
				r.log.Info("gap repaired; what its repairs read is kept until the guard's bound passes it", "since", g.Since,
					"bound", readAbove(done.Repaired))
				return &done
			}
		}
	}
	return r.gap.Load()
}

// readAbove is an id above every row among rows.
func readAbove(rows offsets.RepairedRows) uint64 {
	x := rows.Below
	for _, id := range offsets.SplitXids(rows.Xids) {
		x = max(x, uint64(id)+1)
	}
	return x
}

// anchor returns the gap to record. In exactly_once (freeze not nil), a gap
// this run found is recorded with Since raised to the highest end handed
// over to the sink, and the hand-over freezes first (exactly_once.go,
// handover): every Kafka transaction committed before the restart's repair
// then ends at or before Since, and the repair's own past it.
func (r *repair) anchor(g *gapInfo, freeze func() lsn.LSN) *gapInfo {
	if g == nil || freeze == nil || !r.foundHere.Load() || g == r.anchored {
		return g
	}
	to := freeze()
	for {
		up := *g
		up.Since = max(g.Since, to)
		if r.gap.CompareAndSwap(g, &up) {
			r.anchored = &up
			if up.Since != g.Since {
				r.log.Info("exactly_once: recording the gap from the last position handed to Kafka", "verified", g.Since, "since", up.Since)
			}
			return &up
		}
		// Replaced meanwhile (found, committed): never record it unraised,
		// or a committed position past its Since would read as repaired.
		if g = r.gap.Load(); g == nil {
			return nil
		}
	}
}

// toSave is the gap a checkpoint at acked records, and whether it differs
// from the one last saved (a save is due even if the position did not move).
func (r *repair) toSave(acked lsn.LSN, freeze func() lsn.LSN) (g *gapInfo, changed bool) {
	g = r.anchor(r.recorded(acked), freeze)
	return g, g != r.saved
}

// wasSaved notes the gap of a checkpoint the store holds (saved, or refused as
// stale: another connector saved past it).
func (r *repair) wasSaved(g *gapInfo) {
	r.saved = g
	if g == nil || !g.Pending.Rows.IsZero() || g.Xmin == noXmin {
		r.kept.Store(true)
	}
}
