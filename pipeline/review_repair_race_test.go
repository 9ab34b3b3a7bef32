package pipeline

// Review reproductions (adversarial review of 1cbd15e..0105cfc) built on
// the repair model's world (repair_model_test.go, repair_model_run_test.go).
// They assert the guarantee and FAIL at 0105cfc.

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// rvDrain streams every committed transaction the run has not decoded yet.
func (w *rmWorld) rvDrain(r *rmRun) {
	for r.txn != nil || r.ci < len(w.commits) {
		w.streamStep(r)
	}
}

// TestRepairReviewFoundBetweenHandOverAndRecord: process.go handed the
// repair's transaction over (p.b.end: eos.end, Txn.EndTxn) and only then
// recorded it (p.rep.committed). The guard (found) and the checkpoint
// writer (toSave: anchor freezes the hand-over, then the save) could run in
// between: the gap was saved merged, with Pending{Later} but no Rows, and
// Since anchored at the hand-over's highest end, which is the repair's own
// end. The repair's Kafka transaction commits (its hold gave up: more than
// 10*MaxRecords events wait, Txn.release in EndTxn; or clearAt <= its end),
// and the process dies before the next save records the repair (the guard's
// gap stops it; a kill during the shutdown). The restart: Kafka's position
// equals Since (not past it), Pending has no rows, so the merged gap is
// read from its lowest bound and the first gap's rows, never decodable and
// already in Kafka, go again (duplicate for read_committed consumers).
// process.go now records the repair first (recordRepair); this test
// follows that order, with the guard and the save right after the record.
func TestRepairReviewFoundBetweenHandOverAndRecord(t *testing.T) {
	w := &rmWorld{rng: rand.New(rand.NewPCG(7, 7)), next: 100, kafka: map[uint64]int{}, left: 10}

	// Run 1: a decodable row, then the outbox leaves the publication and a
	// row is written outside it; the guard finds the gap, the run stops.
	r1 := w.startRun()
	w.beginWriter()
	w.commit(w.ws[0])
	w.guardRead(r1)
	w.toggleGap()
	w.beginWriter()
	w.commit(w.ws[1]) // undecodable
	w.guardRead(r1)   // finds the gap
	w.rvDrain(r1)
	w.kafkaCommit(r1)
	w.stop(r1)
	w.toggleGap() // back in the publication before the restart

	// Run 2 repairs gap A where the stream reaches it.
	r2 := w.startRun()
	if r2.bf == nil {
		t.Fatalf("premise: run 2 repairs the gap; checkpoint %s, Kafka at %d\n%s", w.ck, w.kpos, strings.Join(w.log, "\n"))
	}
	w.guardRead(r2) // a good reading: Later's bound is taken here
	w.beginWriter()
	w.commit(w.ws[2]) // decodable; the stream reaches the gap with it
	for r2.bf.in == nil && (r2.txn != nil || r2.ci < len(w.commits)) {
		w.streamStep(r2) // at x102's begin the repair runs first, in its transaction
	}
	if r2.bf.in == nil || r2.txn == nil {
		t.Fatalf("premise: the repair ran\n%s", strings.Join(w.log, "\n"))
	}

	// process.go commit: tracker.Commit, recordRepair, then p.b.end(end)
	// hands it over...
	x, end := r2.cur, r2.cur.final+1
	if r2.bf.in == r2.txn {
		r2.rep.committed(end, r2.bf.clearAt, r2.bf.read, r2.bf.publishedAny)
	}
	r2.hold.add(uint32(x.xid), x.final)
	r2.q = append(r2.q, rmTrk{end: end, waiting: true})
	r2.batch, r2.open = append(r2.batch, r2.open...), nil
	r2.end, r2.hmax = max(r2.end, end), max(r2.hmax, end)
	r2.holdTo = 0 // Txn.release in EndTxn: the hold gave up (the repair's rows exceed holdRecords)
	handed := r2.bf.handedOver(r2.txn)
	r2.txn, r2.cur = nil, nil
	w.logf("the repair is recorded, then its transaction is handed over, ending at %d", end)

	// ...the guard finds a second gap and the checkpoint writer saves...
	w.toggleGap()
	w.guardRead(r2)
	w.save(r2, "checkpoint (between the hand-over and the record)")
	// ...Kafka commits the repair's transaction.
	w.kafkaCommit(r2)
	_ = handed
	w.logf("run 2 is killed during its shutdown, before the next save")
	w.toggleGap() // the operator puts the table back

	if !w.settle() {
		t.Fatalf("a gap is still recorded\n%s", strings.Join(w.log, "\n"))
	}
	for _, x := range w.ws {
		if n := w.kafka[x.xid]; n != 1 {
			t.Errorf("x%d (decodable %v) is in Kafka %d times", x.xid, x.decodable, n)
		}
	}
	if t.Failed() {
		t.Logf("history:\n%s", strings.Join(w.log, "\n"))
	}
}

// TestRepairReviewAnchorLosesToCommitted: the same window, one step
// later. The checkpoint writer's toSave loads the merged gap (recorded),
// freezes the hand-over (anchor) and then CASes the gap with Since raised;
// committed (the processor, right after its hand-over) replaces the gap in
// between, the CAS fails, and anchor returns the gap NOT raised ("the next
// save anchors that one"). That save records the merged gap at the loaded
// gap's Since, below the repair's end. The repair's Kafka transaction
// commits and the process dies before the next save: the restart finds
// Kafka's position past Since, takes the merged gap for repaired, and never
// reads the part the guard found (rows written while the table was out
// again): loss, when the restart's change-while-stopped check does not
// find gap B again (a FOR TABLES IN SCHEMA membership).
func TestRepairReviewAnchorLosesToCommitted(t *testing.T) {
	w := &rmWorld{rng: rand.New(rand.NewPCG(7, 7)), next: 100, kafka: map[uint64]int{}, left: 10}
	r1 := w.startRun()
	w.beginWriter()
	w.commit(w.ws[0])
	w.guardRead(r1)
	w.toggleGap()
	w.beginWriter()
	w.commit(w.ws[1]) // undecodable: gap A
	w.guardRead(r1)
	w.rvDrain(r1)
	w.kafkaCommit(r1)
	w.stop(r1)
	w.toggleGap()

	r2 := w.startRun()
	if r2.bf == nil {
		t.Fatalf("premise: run 2 repairs the gap\n%s", strings.Join(w.log, "\n"))
	}
	w.guardRead(r2)
	w.beginWriter()
	w.commit(w.ws[2])
	for r2.bf.in == nil && (r2.txn != nil || r2.ci < len(w.commits)) {
		w.streamStep(r2)
	}
	if r2.bf.in == nil || r2.txn == nil {
		t.Fatalf("premise: the repair ran\n%s", strings.Join(w.log, "\n"))
	}
	// process.go commit: the hand-over (p.b.end), not yet the record.
	x, end := r2.cur, r2.cur.final+1
	r2.hold.add(uint32(x.xid), x.final)
	r2.q = append(r2.q, rmTrk{end: end, waiting: true})
	r2.batch, r2.open = append(r2.batch, r2.open...), nil
	r2.end, r2.hmax = max(r2.end, end), max(r2.hmax, end)
	r2.holdTo = 0 // Txn.release: the hold gave up
	handed := r2.bf.handedOver(r2.txn)
	r2.txn, r2.cur = nil, nil
	w.logf("the repair's transaction is handed over, ending at %d", end)

	// Gap B: the table leaves again, a row is written outside it, the
	// guard finds it.
	w.toggleGap()
	w.beginWriter()
	w.commit(w.ws[3]) // undecodable: gap B
	w.guardRead(r2)

	// The checkpoint writer's save; committed runs between anchor's freeze
	// and its CAS.
	a := min(r2.acked, r2.verified, w.holdAt(r2))
	w.slot = max(w.slot, a)
	g, _ := r2.rep.toSave(a, func() lsn.LSN {
		r2.frozen = true
		if handed {
			r2.rep.committed(end, r2.bf.clearAt, r2.bf.read, r2.bf.publishedAny)
			w.logf("(the processor records the repair while the writer anchors)")
		}
		return r2.hmax
	})
	a = max(a, r2.saved)
	r2.saved = a
	w.ck = &rmCkpt{at: a, ver: r2.ver, xmin: r2.gxmin}
	if g != nil {
		w.ck.gap = new(*g)
	}
	r2.rep.wasSaved(g)
	w.logf("checkpoint save: %s", w.ck)
	w.kafkaCommit(r2)
	w.logf("run 2 is killed before the next save")
	w.toggleGap()
	// The outbox is a member through FOR TABLES IN SCHEMA: its schema
	// dropped from the publication and added back changes no state the
	// checkpoint records (docs/operations.md, "Changes while the connector
	// is stopped", Limits), so the restart finds no change while stopped
	// and has only the saved gap to go by. (With a pg_publication_rel
	// membership that backstop finds gap B again and nothing is lost.)
	w.ck.ver = w.ver
	w.logf("the saved stream state matches the server's (schema membership)")

	if !w.settle() {
		t.Fatalf("a gap is still recorded\n%s", strings.Join(w.log, "\n"))
	}
	for _, x := range w.ws {
		if n := w.kafka[x.xid]; n != 1 {
			t.Errorf("x%d (decodable %v) is in Kafka %d times", x.xid, x.decodable, n)
		}
	}
	if t.Failed() {
		t.Logf("history:\n%s", strings.Join(w.log, "\n"))
	}
}
