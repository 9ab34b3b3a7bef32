package pipeline

import (
	"fmt"
	"log/slog"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// One connector run of the repair model (repair_model_test.go).

// rmRun is one connector process: its repair, its stream, its guard, the
// exactly_once sink and hand-over, and the tracker.
type rmRun struct {
	rep         *repair
	bf          *backfill
	lookUp      bool
	ver         int     // the membership at start (the guard's Start)
	start, skip lsn.LSN // the stream's start (slot or checkpoint); Kafka's position then
	ci          int     // the next of w.commits to decode
	txn         *offsets.Txn
	cur         *rmWriter
	verified    lsn.LSN // the guard's
	gxmin       uint64  // the guard's Xmin
	found       bool
	hold        *holdBack
	saved       lsn.LSN
	// The sink: rows of the transaction being handed over, of the batch
	// waiting for the Kafka commit, the batch's end, the repair's hold,
	// the hand-over's highest end and freeze.
	open, batch       []uint64
	end, holdTo, hmax lsn.LSN
	frozen            bool
	q                 []rmTrk // the tracker's transactions not acknowledged yet
	acked             lsn.LSN
}

type rmTrk struct {
	end             lsn.LSN
	waiting, failed bool
}

func (w *rmWorld) startRun() *rmRun {
	w.runs++
	r := &rmRun{rep: newRepair(slog.New(slog.DiscardHandler)), ver: w.ver, start: w.slot}
	r.rep.floor = func() uint64 { return r.gxmin } // the guard's bound (plan.go)
	var ch *stoppedChange
	var change *gapInfo // for the log
	if c := w.ck; c != nil {
		r.start = max(r.start, c.at)
		if c.gap != nil {
			r.rep.load(*c.gap)
		}
		if c.ver != w.ver { // the membership changed since the saving run started
			ch = &stoppedChange{why: "model", since: max(c.at, r.start, w.kpos), xmin: c.xmin, saved: c.xmin}
			change = &gapInfo{Since: ch.since, Xmin: ch.xmin}
		}
	}
	r.skip = max(r.start, w.kpos)
	placed, lookUp := r.rep.decide(w.kpos, ch)
	r.bf, r.lookUp = r.rep.bf, lookUp
	r.acked, r.saved, r.hmax, r.hold = r.skip, r.start, r.skip, newHoldBack(r.start)
	r.verified, r.gxmin = r.start, w.lowestRunning()
	for r.ci < len(w.commits) && w.commits[r.ci].final+1 <= r.start {
		r.ci++
	}
	w.logf("run %d starts: stream at %d, Kafka at %d, checkpoint %s, change while stopped %s -> repairs %s, look up %v",
		w.runs, r.start, w.kpos, w.ck, rmGap(change), rmGap(repairOf(r.rep)), lookUp)
	if w.ck == nil || placed {
		w.save(r, "before the stream")
	}
	return r
}

func (c *rmCkpt) String() string {
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("{at %d, gap %s, stream version %d xmin %d}", c.at, rmGap(c.gap), c.ver, c.xmin)
}

// rmGap prints a gap, its Repaired and Pending rows as xmin/snapshot.
func rmGap(g *gapInfo) string {
	if g == nil {
		return "none"
	}
	s := fmt.Sprintf("{since %d, xmin %d", g.Since, g.Xmin)
	if !g.Repaired.IsZero() {
		s += fmt.Sprintf(", repaired %s", rmRows(g.Repaired))
	}
	if p := g.Pending; p != (offsets.PendingRepair{}) {
		s += fmt.Sprintf(", pending {rows %s, end %d, later %d}", rmRows(p.Rows), p.End, p.Later)
	}
	return s + "}"
}

// guardRead is one reading of the guard: a good one vouches for now, a
// change since the run started is a gap (the guard then stops).
func (w *rmWorld) guardRead(r *rmRun) {
	if r.found {
		return
	}
	if w.ver != r.ver {
		r.found = true
		r.rep.found(gapInfo{Since: r.verified, Xmin: r.gxmin})
		w.logf("the guard finds a gap {since %d, xmin %d}", r.verified, r.gxmin)
		return
	}
	r.verified, r.gxmin = w.tick(), w.lowestRunning()
}

// streamStep decodes the next transaction's begin and row, or its commit.
func (w *rmWorld) streamStep(r *rmRun) {
	if r.txn != nil {
		w.commitTxn(r)
		return
	}
	if r.ci == len(w.commits) {
		return
	}
	x := w.commits[r.ci]
	r.ci++
	r.txn, r.cur, r.open = &offsets.Txn{}, x, nil
	// Since is never inside a commit record here (final+1 = end), so the
	// repair never joins a transaction at its commit (backfill.ends).
	if r.bf.due(x.final) {
		w.repairNow(r, r.txn) // its rows go first, in this transaction
	}
	if x.decodable {
		ev := rmEvent(x.xid)
		r.bf.note(&ev)
		if x.final >= r.skip && !r.bf.delivered(x.final, &ev) {
			r.open = append(r.open, x.xid)
		}
	}
}

func (w *rmWorld) commitTxn(r *rmRun) {
	x, end := r.cur, r.cur.final+1
	if x.decodable {
		r.hold.add(uint32(x.xid), x.final)
	}
	w.endTxn(r, r.txn, end)
	r.hold.decoded(end)
	r.bf.passed(end)
	r.txn, r.cur = nil, nil
}

// endTxn hands a transaction over (eos.end, Txn.EndTxn) and tells the
// repair when it was its own (process.go commit).
func (w *rmWorld) endTxn(r *rmRun, txn *offsets.Txn, end lsn.LSN) {
	t := rmTrk{end: end, waiting: len(r.open) > 0}
	switch {
	case r.frozen: // a gap was recorded: this transaction goes after the restart
		t.failed, r.open = len(r.open) > 0, nil
	case len(r.open) > 0 || len(r.batch) > 0:
		r.batch, r.open = append(r.batch, r.open...), nil
		r.end = max(r.end, end)
		if r.holdTo != 0 && r.end >= r.holdTo {
			r.holdTo = 0
		}
		fallthrough
	default:
		r.hmax = max(r.hmax, end)
	}
	r.q = append(r.q, t)
	if r.bf.handedOver(txn) {
		r.rep.committed(end, r.bf.clearAt, r.bf.read, r.bf.publishedAny)
		w.logf("the repair is handed over, ending at %d (frozen %v)", end, r.frozen)
	}
	r.advance()
}

func (r *rmRun) advance() {
	for len(r.q) > 0 && !r.q[0].waiting && !r.q[0].failed {
		r.acked = max(r.acked, r.q[0].end)
		r.q = r.q[1:]
	}
}

// keepalive is a position between transactions once the stream is caught
// up: the repair alone when the gap is behind it, the sink's Pass, the
// tracker's Idle.
func (w *rmWorld) keepalive(r *rmRun) {
	if r.txn != nil || r.ci < len(w.commits) {
		return
	}
	pos := w.tick()
	if r.bf.idle(pos) {
		txn := &offsets.Txn{}
		r.open = nil
		w.repairNow(r, txn)
		w.endTxn(r, txn, pos)
	}
	r.hold.decoded(pos)
	if r.holdTo != 0 && pos >= r.holdTo && !r.frozen { // eos.pass: not once frozen
		r.holdTo = 0
	}
	if len(r.q) == 0 {
		r.acked = max(r.acked, pos)
	}
}

// repairNow is runBackfill: wait for the gap's writers, read in a
// snapshot, publish what the stream did not decode before.
func (w *rmWorld) repairNow(r *rmRun, txn *offsets.Txn) {
	g := r.bf.gapInfo
	for _, x := range w.running() {
		if x.xid >= g.Xmin {
			w.commit(x)
		}
	}
	at, snap := w.tick(), w.snapshot()
	r.bf.published = map[uint64]struct{}{}
	var pub, seen, inKafka, read []uint64
	for _, x := range w.ws {
		if x.final == 0 || !rmReads(g, x.xid) {
			continue
		}
		read = append(read, x.xid)
		ev := rmEvent(x.xid)
		if _, ok := r.bf.seen[r.bf.fingerprint(&ev)]; ok {
			seen = append(seen, x.xid)
			continue
		}
		r.bf.record(&ev)
		if r.lookUp && w.kafka[x.xid] > 0 { // readback_repair.go, taken as exact
			inKafka = append(inKafka, x.xid)
			continue
		}
		r.open, pub = append(r.open, x.xid), append(pub, x.xid)
	}
	r.bf.clearAt, r.bf.read, r.bf.publishedAny = at, readRows(g, w.readOf(g, read)), len(pub) > 0
	r.bf.done, r.bf.in = true, txn
	r.holdTo = at
	w.logf("the repair of %s reads in snapshot %s: publishes %v, leaves out seen %v, found in Kafka %v",
		rmGap(&g), snap, pub, seen, inKafka)
}

// kafkaCommit is the sink committing what waits, unless the repair holds it.
func (w *rmWorld) kafkaCommit(r *rmRun) {
	if r.holdTo != 0 || len(r.batch) == 0 {
		return
	}
	for _, x := range r.batch {
		w.kafka[x]++
	}
	w.kpos = max(w.kpos, r.end)
	w.logf("Kafka commits %v at %d", r.batch, r.end)
	r.batch = nil
	for i := range r.q {
		if !r.q[i].failed {
			r.q[i].waiting = false
		}
	}
	r.advance()
}

func (w *rmWorld) holdAt(r *rmRun) lsn.LSN {
	bound := r.gxmin
	if c := w.ck; c != nil && c.xmin != 0 {
		bound = min(bound, c.xmin)
	}
	if x, ok := r.rep.bound(r.acked); ok {
		bound = min(bound, x)
	}
	return r.hold.at(bound)
}

// save is checkpointer.saveAs: the position gated by the guard and held
// back (hold.go), the gap toSave records; the slot confirms as far.
func (w *rmWorld) save(r *rmRun, why string) {
	a := min(r.acked, r.verified, w.holdAt(r))
	w.slot = max(w.slot, a)
	g, _ := r.rep.toSave(a, func() lsn.LSN { r.frozen = true; return r.hmax })
	a = max(a, r.saved)
	r.saved = a
	w.ck = &rmCkpt{at: a, ver: r.ver, xmin: r.gxmin}
	if g != nil {
		w.ck.gap = new(*g)
	}
	r.rep.wasSaved(g)
	w.logf("%s save: %s", why, w.ck.String())
}

// status is a status update: the slot confirms what a save would.
func (w *rmWorld) status(r *rmRun) {
	w.slot = max(w.slot, min(r.acked, r.verified, w.holdAt(r)))
}

// step is one random event of the world or of r's goroutines.
func (w *rmWorld) step(r *rmRun) {
	switch k := w.rng.IntN(38); {
	case k < 7:
		w.beginWriter()
	case k < 13:
		w.commitRandom()
	case k < 15:
		w.toggleGap()
	case k < 19:
		w.guardRead(r)
	case k < 28:
		w.streamStep(r)
	case k < 31:
		w.keepalive(r)
	case k < 35:
		w.kafkaCommit(r)
	case k < 37:
		w.save(r, "checkpoint")
	default:
		w.status(r)
	}
}

// play runs r at random until it crashes, stops, or its guard finds a gap.
// That starts the shutdown: the processor and the checkpoint loop go on a
// little (the repair may be handed over only now), then the flush and the
// last save, or a crash meanwhile.
func (w *rmWorld) play(r *rmRun) {
	for range 4 + w.rng.IntN(30) {
		if w.rng.IntN(20) == 0 {
			w.logf("run %d crashes", w.runs)
			return
		}
		if w.step(r); r.found {
			for range w.rng.IntN(8) {
				w.step(r)
			}
			if w.rng.IntN(4) == 0 {
				w.logf("run %d crashes while stopping", w.runs)
				return
			}
			break
		}
	}
	w.stop(r)
}

// stop is the end of a shutdown: flush (refused while the repair holds
// the Kafka transaction), the guard's final check (none while a gap is
// recorded: finalCheck), the last save.
func (w *rmWorld) stop(r *rmRun) {
	w.kafkaCommit(r)
	if !r.rep.open() {
		w.guardRead(r)
	}
	w.save(r, "last")
	w.logf("run %d stops", w.runs)
}

// rmRows prints repaired rows: [xmin, below) and the ids listed.
func rmRows(r offsets.RepairedRows) string {
	return fmt.Sprintf("[%d,%d)+{%s}", r.Xmin, r.Below, r.Xids)
}
