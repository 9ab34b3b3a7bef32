package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// The checks after a restore or a promotion (restore_test.go), fed made-up
// runs: the newFixture run (e1..e4 of "a", LSNs 100..400), whose e3 and e4
// a rewind undid after they reached Kafka; the writer then wrote seq 3 and
// 4 again (n3, n4) at the same LSNs, the server's WAL having been rewound.

type rewindFixture struct {
	*checkFixture
	rewound time.Time
	undone  map[string]bool
}

func newRewindFixture(t *testing.T, newStream bool) *rewindFixture {
	f := &rewindFixture{checkFixture: newFixture(t)}
	f.o.Mode = shortMode.Name
	f.rewound = f.events[3].Committed.Add(100 * time.Millisecond)
	f.o.Faults = []faultRecord{{Kind: fPGRestore, Start: f.rewound.Add(-time.Second), Rewound: f.rewound, NewStream: newStream,
		End: f.rewound.Add(time.Second)}}
	f.undone = map[string]bool{"e3": true, "e4": true}
	f.events = f.events[:2]
	f.byID = map[string]*event{}
	for i, n := range []string{"n3", "n4"} {
		e := event{ID: n, Agg: "a", Type: "order", Seq: 3 + i, Txn: int64(10 + i), PostLSN: lsn.LSN(300 + 100*i),
			Committed: f.rewound.Add(2*time.Second + time.Duration(i)*10*time.Millisecond)}
		f.events = append(f.events, e)
		f.addCopy(e, e.Committed.Add(5*time.Millisecond), 8)
		f.o.Seen[e.ID] = e.Committed.Add(20 * time.Millisecond)
	}
	for i := range f.events {
		f.byID[f.events[i].ID] = &f.events[i]
	}
	return f
}

func TestCheckAfterRewind(t *testing.T) {
	t.Run("a sample before the restore does not cover what was written after it", func(t *testing.T) {
		f := newRewindFixture(t, false)
		f.sample(f.events[1].Committed.Add(50*time.Millisecond), 400) // e4 (undone) had been confirmed
		rep := &Report{}
		f.o.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 0 || len(f.fails) != 0 {
			t.Fatalf("violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
		// Without the split at the rewind (the checker before it), n3 and n4
		// (LSNs 300 and 400, written after the restore) count as confirmed
		// early.
		f.o.Faults[0].Rewound = time.Time{}
		f.o.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 1 || len(f.fails) != 1 || !strings.Contains(f.fails[0], "event n4") {
			t.Fatalf("without the split: violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
	})
	t.Run("after the restore the rule holds for the new history", func(t *testing.T) {
		f := newRewindFixture(t, false)
		f.sample(f.events[2].Committed.Add(time.Millisecond), 300) // n3 appended 4ms later
		rep := &Report{}
		f.o.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 1 || len(f.fails) != 1 || !strings.Contains(f.fails[0], "event n3") {
			t.Fatalf("violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
	})
	t.Run("a restored slot covers the surviving events", func(t *testing.T) {
		f := newRewindFixture(t, false)
		f.copies["e2"] = nil // e2 survived the restore but never reached Kafka
		f.sample(f.rewound.Add(time.Second), 200)
		rep := &Report{}
		f.o.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 1 || !strings.Contains(strings.Join(f.fails, ";"), "event e2") {
			t.Fatalf("violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
	})
	t.Run("a promoted server's new slot says nothing of the old timeline", func(t *testing.T) {
		f := newRewindFixture(t, true)
		f.copies["e2"] = nil // left to the lost slot's repair
		f.sample(f.rewound.Add(time.Second), 200)
		rep := &Report{}
		f.o.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 0 || len(f.fails) != 0 {
			t.Fatalf("violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
	})
	t.Run("undone copies are counted apart and the order restarts after them", func(t *testing.T) {
		t.Setenv(EnvDelivery, "exactly_once")
		f := newRewindFixture(t, false)
		// Partition order: e1 e2 e3 e4 (undone) n3 n4.
		recs := []copyRec{f.recs[0], f.recs[1], f.recs[2], f.recs[3], f.recs[4], f.recs[5]}
		rep := &Report{}
		kept := dropUndone(rep, recs, f.undone)
		f.o.checkOrder(rep, kept, nil, f.fail)
		f.o.checkExactlyOnce(rep, kept, f.copies, f.byID, nil, f.fail)
		if rep.UndoneCopies != 2 || rep.OrderViolations != 0 || rep.ExactlyOnce.OrderBreaks != 0 || len(f.fails) != 0 {
			t.Fatalf("undone %d, order violations %d, breaks %d, fails %v", rep.UndoneCopies, rep.OrderViolations, rep.ExactlyOnce.OrderBreaks, f.fails)
		}
		// A ledger that kept the undone events (the suite before undo)
		// sees seq 3 after 4: an order break.
		for _, id := range []string{"e3", "e4"} {
			f.byID[id] = &event{ID: id, Agg: "a", Type: "order", Seq: int(id[1] - '0'), Txn: 99}
		}
		f.o.checkExactlyOnce(rep, recs, f.copies, f.byID, nil, f.fail)
		if rep.ExactlyOnce.OrderBreaks != 1 {
			t.Fatalf("undone copies kept: breaks %d, fails %v", rep.ExactlyOnce.OrderBreaks, f.fails)
		}
	})
}

// TestLedgerUndo: the events the server no longer holds leave the ledger,
// and each aggregate's next seq follows the highest the table holds.
func TestLedgerUndo(t *testing.T) {
	l := &ledger{}
	a, b := &aggregate{id: "a", next: 5}, &aggregate{id: "b", next: 2}
	newWriter(0, "", []*aggregate{a, b}, 0, 1, l, &writerStats{})
	l.add([]event{{ID: "e1", Agg: "a", Seq: 1}, {ID: "e2", Agg: "a", Seq: 2}, {ID: "e3", Agg: "a", Seq: 3}, {ID: "e4", Agg: "a", Seq: 4}, {ID: "f1", Agg: "b", Seq: 1}})
	n := l.undo(map[string]tableRow{"e1": {Agg: "a", Seq: 1}, "e2": {Agg: "a", Seq: 2}})
	if n != 3 || l.len() != 2 || a.next != 3 || b.next != 1 {
		t.Fatalf("undone %d, kept %d, next a %d b %d", n, l.len(), a.next, b.next)
	}
	if u := l.undoneIDs(); len(u) != 3 || !u["e3"] || !u["e4"] || !u["f1"] {
		t.Fatalf("undone ids %v", u)
	}

	// A table-less event has no row: it stays when a row of its transaction
	// does, and its aggregate's next seq follows it.
	l = &ledger{}
	m := &aggregate{id: "m", next: 3}
	w := newWriter(0, "", []*aggregate{a}, 0, 1, l, &writerStats{})
	w.msgAggs = []*aggregate{m}
	l.add([]event{{ID: "r1", Agg: "a", Seq: 1, Txn: 1}, {ID: "m1", Agg: "m", Seq: 1, Txn: 1, Message: true},
		{ID: "r2", Agg: "a", Seq: 2, Txn: 2}, {ID: "m2", Agg: "m", Seq: 2, Txn: 2, Message: true}})
	n = l.undo(map[string]tableRow{"r1": {Agg: "a", Seq: 1}})
	if u := l.undoneIDs(); n != 2 || l.len() != 2 || !u["r2"] || !u["m2"] || a.next != 2 || m.next != 2 {
		t.Fatalf("with messages: undone %d %v, kept %d, next a %d m %d; want r2 and m2 undone, next a 2 m 2", n, u, l.len(), a.next, m.next)
	}
}

// TestCheckDuplicatesAfterRestore: the restored slot is behind what was
// confirmed before the restore, so a copy sent after it of an event a
// sample had confirmed before it is no "resent below a confirmed position"
// of the same PostgreSQL lifetime; the lifetime ends at the rewind, not at
// the fault's start (the copy is taken then, and the server runs on).
func TestCheckDuplicatesAfterRestore(t *testing.T) {
	f := newRewindFixture(t, false)
	f.sample(f.rewound.Add(-500*time.Millisecond), 200) // after the fault began, before the rewind
	at := f.rewound.Add(time.Second)
	f.o.Incarnations = append(f.o.Incarnations, &incarnation{N: 2, Reason: reasonAfterRestore, Start: at, SlotAtStart: 100})
	f.addCopy(f.events[1], at.Add(10*time.Millisecond), 9) // e2, LSN 200, again
	rep := &Report{DuplicatesByIncarnation: map[string]int{}}
	f.o.checkDuplicates(rep, f.copies, f.byID, f.fail)
	if rep.Duplicates != 1 || rep.DupsBelowEarlierSample != 0 || rep.DupsBelowConfirmed != 0 || len(f.fails) != 0 {
		t.Fatalf("dups %d, below earlier sample %d, below confirmed %d, fails %v", rep.Duplicates, rep.DupsBelowEarlierSample, rep.DupsBelowConfirmed, f.fails)
	}
	// Split at the fault's start only (the checker before the rewind), the
	// copy counts as resent below a position confirmed in its lifetime.
	f.o.Faults[0].Rewound = time.Time{}
	rep = &Report{DuplicatesByIncarnation: map[string]int{}}
	f.o.checkDuplicates(rep, f.copies, f.byID, f.fail)
	if rep.DupsBelowEarlierSample != 1 || len(f.fails) != 1 {
		t.Fatalf("without the split: below earlier sample %d, fails %v", rep.DupsBelowEarlierSample, f.fails)
	}
}

// TestCheckSplitBeforeDetection: in exactly_once, a PostgreSQL transaction
// split over two Kafka transactions is counted apart only when its commit
// lies between a publication gap's removal and the start of the process
// after the exit on it; any other split fails the run.
func TestCheckSplitBeforeDetection(t *testing.T) {
	t.Setenv(EnvDelivery, "exactly_once")
	for _, tc := range []struct {
		name  string
		after time.Duration // the transaction's commit after the removal
		apart bool
	}{
		{"committed before the exit", 50 * time.Millisecond, true},
		{"committed after the restart", 3 * time.Second, false},
		{"committed before the removal", -time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			removed := f.events[0].Committed.Add(-tc.after)
			f.o.Faults = []faultRecord{{Kind: fOpsPubGap, Start: removed, End: removed.Add(2 * time.Second)}}
			f.o.Incarnations = append(f.o.Incarnations, &incarnation{N: 2, Reason: reasonAfterGap, Start: removed.Add(time.Second)})
			// e1 and e2 are one writer transaction, in two Kafka transactions.
			f.byID["e1"].Txn, f.byID["e2"].Txn = 7, 7
			f.byID["e2"].Committed = f.byID["e1"].Committed
			f.copies["e2"][0].Producer = 9
			rep := &Report{}
			f.o.checkExactlyOnce(rep, f.recs, f.copies, f.byID, nil, f.fail)
			er := rep.ExactlyOnce
			if tc.apart && (er.SplitBeforeDetection != 1 || er.SplitTransactions != 0 || len(f.fails) != 0) {
				t.Fatalf("want counted apart: %+v, fails %v", er, f.fails)
			}
			if !tc.apart && (er.SplitBeforeDetection != 0 || er.SplitTransactions != 1 || len(f.fails) == 0) {
				t.Fatalf("want a split that fails: %+v, fails %v", er, f.fails)
			}
		})
	}
}
