package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A lost slot's repair and the order rule. After a promotion below
// PostgreSQL 17 the new slot begins past the commits the old one had not
// delivered (lostslot_test.go); only the printed verify --repair publishes
// them, after the new slot's first events, and in table order (created_at:
// a backdated row goes ahead of its aggregate's earlier events;
// docs/operations.md, "Verify and repair"). Per aggregate they cannot keep
// the order rule. The order check excuses exactly these, counted apart:
//   - a record a repair's producer appended of an event committed in its
//     lost window: after the old slot's last confirmed position (samples
//     before the promotion) and before the process that created the new
//     slot started;
//   - a record of an event committed after that window, in order once the
//     window's seqs the repair republished (at any time) are stepped over.
// Anything else, a repair's record of an event outside the window included,
// is held to the rule.

// repairRun is one verify --repair the suite ran for a lost slot
// (repairIfPrinted).
type repairRun struct {
	Rewound    time.Time // the fault's rewind: the window is that promotion's
	Start, End time.Time
	Since      string
	Published  int64 // verify's count; -1: it failed
}

// noteRepair records a repair run.
func (r *run) noteRepair(rewound, start time.Time, since string, rp *cli.RepairReport) {
	n := int64(-1)
	if rp != nil {
		n = rp.Published
	}
	r.repairRuns = append(r.repairRuns, repairRun{Rewound: rewound, Start: start, End: time.Now(), Since: since, Published: n})
}

// lostWindow: the events a lost slot may have taken undelivered.
type lostWindow struct {
	after  lsn.LSN   // the old slot's last confirmed position
	before time.Time // the new slot's process started
}

func (w lostWindow) holds(e *event) bool {
	return e != nil && e.PostLSN > w.after && e.Committed.Before(w.before)
}

// repairOrder is what checkOrder needs to tell a lost slot's reorder from a
// violation (nil: no repair ran).
type repairOrder struct {
	byID    map[string]*event
	windows map[int64]lostWindow // the repairs' producer ids
	// repaired: per key, the seqs a repair republished from its window,
	// with the window's end; stream: per key, the last seq of a record that
	// is no such republication.
	repaired map[string]map[int]time.Time
	stream   map[string]int
}

// repairOrder finds each repair run's producers (first append within the
// run) and window, and the seqs they republished. It fails the run when
// the records it attributes to a repair outnumber what verify published:
// a connector's producer was taken for the repair's.
func (o *observation) repairOrder(rep *Report, recs []copyRec, fail func(string, ...any)) *repairOrder {
	if len(o.RepairRuns) == 0 {
		return nil
	}
	ro := &repairOrder{byID: map[string]*event{}, windows: map[int64]lostWindow{},
		repaired: map[string]map[int]time.Time{}, stream: map[string]int{}}
	events := o.Events
	for i := range events {
		ro.byID[events[i].ID] = &events[i]
	}
	firstAppend := map[int64]time.Time{}
	for _, c := range recs {
		if t, ok := firstAppend[c.Producer]; !ok || c.Append.Before(t) {
			firstAppend[c.Producer] = c.Append
		}
	}
	for _, x := range o.RepairRuns {
		w := o.lostWindowOf(x)
		mine := map[int64]bool{}
		var pids []string
		for pid, t := range firstAppend {
			if !t.Before(x.Start.Truncate(time.Millisecond)) && !t.After(x.End) {
				mine[pid] = true
				ro.windows[pid] = w
				pids = append(pids, fmt.Sprint(pid))
			}
		}
		n, in := 0, 0
		for _, c := range recs {
			if mine[c.Producer] {
				n++
				if w.holds(ro.byID[c.ID]) {
					in++
				}
			}
		}
		rep.LostSlotRepairs = append(rep.LostSlotRepairs, fmt.Sprintf(
			"verify --repair --since %s at %s (%.1fs): producer %s, %d records (verify: %d republished), %d of events in the lost window (post-commit LSN > %v, committed before %s)",
			x.Since, x.Start.Format("15:04:05.000"), x.End.Sub(x.Start).Seconds(), strings.Join(pids, ","), n, x.Published, in, w.after, w.before.Format("15:04:05.000")))
		if x.Published >= 0 && int64(n) > x.Published {
			fail("suite: %d records attributed to the verify --repair at %s, which republished %d: a connector's producer taken for the repair's",
				n, x.Start.Format("15:04:05.000"), x.Published)
		}
	}
	for _, c := range recs {
		if w, ok := ro.windows[c.Producer]; ok && w.holds(ro.byID[c.ID]) {
			if ro.repaired[c.Key] == nil {
				ro.repaired[c.Key] = map[int]time.Time{}
			}
			ro.repaired[c.Key][c.Seq] = w.before
		}
	}
	return ro
}

// lostWindowOf is the window of the promotion x repaired: from the highest
// position the old slot confirmed since the rewind before it, to the start
// of the first process after it (the one that created the new slot).
func (o *observation) lostWindowOf(x repairRun) lostWindow {
	var prev time.Time
	for _, f := range o.Faults {
		for _, t := range f.rewinds() {
			if t.Before(x.Rewound) && t.After(prev) {
				prev = t
			}
		}
	}
	w := lostWindow{before: x.Start}
	for _, s := range o.Samples {
		if !s.T.Before(prev) && s.T.Before(x.Rewound) {
			w.after = max(w.after, s.Slot)
		}
	}
	for _, in := range o.Incarnations {
		if !in.Start.Before(x.Rewound) && in.Start.Before(w.before) {
			w.before = in.Start
			break
		}
	}
	return w
}

// republished: c is a repair's record of an event of its lost window.
func (o *repairOrder) republished(c copyRec) bool {
	if o == nil {
		return false
	}
	w, ok := o.windows[c.Producer]
	return ok && w.holds(o.byID[c.ID])
}

// excuses tells whether an order violation at c is the lost slot's: c is
// republished, or c (an event after the window) is in order in the stream
// once the window's republished seqs are stepped over.
func (o *repairOrder) excuses(c copyRec, dead deadSeqs) bool {
	if o == nil {
		return false
	}
	if o.republished(c) {
		return true
	}
	e := o.byID[c.ID]
	if e == nil {
		return false
	}
	last := o.stream[c.Key]
	if c.Seq >= 1 && c.Seq <= last {
		return true // a replayed tail of the stream, after republished records
	}
	n := last + 1
	for {
		end, rep := o.repaired[c.Key][n]
		if !dead[c.Key][n] && (!rep || e.Committed.Before(end)) {
			break
		}
		n++
	}
	return c.Seq == n
}

// observe follows the stream: every record but the republished ones.
func (o *repairOrder) observe(c copyRec) {
	if o != nil && !o.republished(c) {
		o.stream[c.Key] = c.Seq
	}
}

// note marks, in an order example, a repair's record the window does not
// excuse.
func (o *repairOrder) note(c copyRec) string {
	if o == nil {
		return ""
	}
	if _, ok := o.windows[c.Producer]; ok && !o.republished(c) {
		return " (republished by verify --repair, but not of the lost window)"
	}
	return ""
}

// TestRepairOrder feeds checkOrder a lost slot: aggregate "a", seqs 1–3
// delivered by the old slot (confirmed to LSN 300), 4–6 committed after
// that and before the promotion (the lost window), 7–8 streamed by the new
// slot; "R" marks a record of the repair's producer. Partition order is
// the spec's.
func TestRepairOrder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      string
		gap       bool  // a publication gap came before (its replay rule)
		published int64 // verify's count (default: the R records)
		bad       int
		jumps     int
		note      string // in an example
		fail      string // in a failure
	}{
		{name: "nothing lost", spec: "1 2 3 4 5 6 7 8"},
		{name: "repaired in order before the new slot's events", spec: "1 2 3 R4 R5 R6 7 8"},
		{name: "the new slot's events first", spec: "1 2 3 7 8 R4 R5 R6", jumps: 1},
		{name: "a backdated row republished first", spec: "1 2 3 R6 R4 R5 7 8", jumps: 2},
		{name: "after a publication gap, counted as the slot's", spec: "1 2 3 R6 R4 R5 7 8", gap: true, jumps: 2},
		{name: "the new slot skips an event", spec: "1 2 3 R4 R5 R6 8", bad: 1},
		{name: "the new slot skips an event, before the repair", spec: "1 2 3 8 R4 R5 R6 7", bad: 1},
		{name: "the old slot out of order in the window", spec: "1 2 3 5 R4 R6 7 8", bad: 1, jumps: 1},
		{name: "a repair's record of an event the old slot confirmed", spec: "1 R3 R2 R4 R5 R6 7 8", bad: 1, jumps: 1,
			note: "not of the lost window"},
		{name: "no repair ran", spec: "1 2 3 7 8", bad: 1},
		{name: "more repair records than verify published", spec: "1 2 3 R4 R5 R6 7 8", published: 2,
			fail: "suite: 3 records attributed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, recs := newRepairFixture(t, tc.spec, tc.gap, tc.published)
			rep := &Report{}
			f.o.checkOrder(rep, recs, nil, f.fail)
			fails := strings.Join(f.fails, "; ")
			if rep.OrderViolations != tc.bad || rep.LostSlotRepairJumps != tc.jumps || rep.GapReplayJumps != 0 ||
				!strings.Contains(strings.Join(rep.OrderExamples, "; "), tc.note) || !strings.Contains(fails, tc.fail) ||
				(tc.fail == "" && strings.Contains(fails, "suite:")) {
				t.Fatalf("violations %d (want %d), lost slot jumps %d (want %d), gap jumps %d; examples %v; fails %v; repairs %v",
					rep.OrderViolations, tc.bad, rep.LostSlotRepairJumps, tc.jumps, rep.GapReplayJumps, rep.OrderExamples, f.fails, rep.LostSlotRepairs)
			}
		})
	}
}

// newRepairFixture builds the run TestRepairOrder describes and the
// records of spec: the old slot's process #1 (producer 7), the new slot's
// #2 (producer 8), the repair (producer 9).
func newRepairFixture(t *testing.T, spec string, gap bool, published int64) (*checkFixture, []copyRec) {
	f := newFixture(t)
	t0 := f.events[0].Committed.Add(-10 * time.Millisecond)
	rewound, started := t0.Add(100*time.Millisecond), t0.Add(200*time.Millisecond)
	f.o.Incarnations = []*incarnation{{N: 1, Reason: "initial", Start: t0.Add(-time.Second)},
		{N: 2, Reason: reasonAfterPromote, Start: started}}
	f.o.Faults = []faultRecord{{Kind: fPGPromote, Start: t0.Add(50 * time.Millisecond), Rewound: rewound, NewStream: true, End: started}}
	if gap {
		f.o.Faults = append([]faultRecord{{Kind: fOpsPubGap, Start: t0.Add(-2 * time.Second), End: t0.Add(-time.Second)}}, f.o.Faults...)
	}
	f.sample(t0.Add(50*time.Millisecond), 300)
	var events []event
	for i := 1; i <= 8; i++ {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		if i >= 7 {
			at = started.Add(time.Duration(i) * 10 * time.Millisecond)
		}
		events = append(events, event{ID: fmt.Sprintf("e%d", i), Agg: "a", Type: "order", Seq: i, PostLSN: lsn.LSN(100 * i), Committed: at})
	}
	f.o.Events = events
	repair := repairRun{Rewound: rewound, Start: started.Add(150 * time.Millisecond), End: started.Add(180 * time.Millisecond), Since: "t0"}
	var recs []copyRec
	for i, tok := range strings.Fields(spec) {
		var seq int
		fmt.Sscan(strings.TrimPrefix(tok, "R"), &seq)
		e := events[seq-1]
		c := copyRec{Topic: "p.order", Key: "a", ID: e.ID, Seq: seq, Offset: int64(i), LogAppend: true, Producer: 7,
			Append: e.Committed.Add(5 * time.Millisecond).Truncate(time.Millisecond)}
		switch {
		case strings.HasPrefix(tok, "R"):
			c.Producer, c.Append = 9, repair.Start.Add(10*time.Millisecond).Truncate(time.Millisecond)
			repair.Published++
		case seq >= 7:
			c.Producer = 8
		}
		recs = append(recs, c)
	}
	if published > 0 {
		repair.Published = published
	}
	f.o.RepairRuns = []repairRun{repair}
	if !strings.Contains(spec, "R") {
		f.o.RepairRuns = nil
	}
	return f, recs
}
