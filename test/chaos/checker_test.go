package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// The checks must catch what they are meant to: these feed them made-up
// runs with one planted fault each.

type checkFixture struct {
	r      *run
	events []event
	byID   map[string]*event
	copies map[string][]copyRec
	recs   []copyRec
	fails  []string
}

// newFixture: aggregate "a", events seq 1..4 committed every 10ms with
// post-commit LSNs 100..400, each appended 5ms after its commit by process
// #1 (producer 7) and consumed 20ms after.
func newFixture(t *testing.T) *checkFixture {
	t0 := time.Now().Truncate(time.Second)
	f := &checkFixture{byID: map[string]*event{}, copies: map[string][]copyRec{}}
	f.r = &run{t: t, prefix: "p", live: newLiveConsumer(), samp: &sampler{},
		conn: &connector{incs: []*incarnation{{N: 1, Reason: "initial", Start: t0.Add(-time.Second)}}}}
	for i := 1; i <= 4; i++ {
		e := event{ID: fmt.Sprintf("e%d", i), Agg: "a", Type: "order", Seq: i,
			PostLSN: lsn.LSN(100 * i), Committed: t0.Add(time.Duration(i) * 10 * time.Millisecond)}
		f.events = append(f.events, e)
		f.addCopy(e, e.Committed.Add(5*time.Millisecond), 7)
		f.r.live.seen[e.ID] = e.Committed.Add(20 * time.Millisecond)
	}
	for i := range f.events {
		f.byID[f.events[i].ID] = &f.events[i]
	}
	return f
}

func (f *checkFixture) addCopy(e event, at time.Time, producer int64) {
	c := copyRec{Topic: "p." + e.Type, Key: e.Agg, ID: e.ID, Seq: e.Seq, Producer: producer,
		Append: at.Truncate(time.Millisecond), Offset: int64(len(f.recs)), LogAppend: true}
	f.recs = append(f.recs, c)
	f.copies[e.ID] = append(f.copies[e.ID], c)
}

func (f *checkFixture) fail(format string, args ...any) {
	f.fails = append(f.fails, fmt.Sprintf(format, args...))
}

func (f *checkFixture) sample(at time.Time, slot lsn.LSN) {
	f.r.samp.samples = append(f.r.samp.samples, sample{T: at, Slot: slot})
}

func TestCheckWatermark(t *testing.T) {
	t.Run("confirmed after the broker had it", func(t *testing.T) {
		f := newFixture(t)
		f.sample(f.events[1].Committed.Add(10*time.Millisecond), 200) // e2 appended 5ms before
		rep := &Report{}
		f.r.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 0 || len(f.fails) != 0 || rep.WatermarkChecks != 1 {
			t.Fatalf("violations %d, checks %d, fails %v", rep.WatermarkViolations, rep.WatermarkChecks, f.fails)
		}
	})
	t.Run("confirmed a few ms before the broker had it", func(t *testing.T) {
		f := newFixture(t)
		// e3 is appended at +35ms; confirming 300 at +32ms is too early,
		// even though the consumer saw it well within the slack.
		f.sample(f.events[2].Committed.Add(2*time.Millisecond), 300)
		rep := &Report{}
		f.r.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 1 || len(f.fails) != 1 || !strings.Contains(f.fails[0], "event e3") {
			t.Fatalf("violations %d, fails %v", rep.WatermarkViolations, f.fails)
		}
	})
	t.Run("confirmed while the broker was down", func(t *testing.T) {
		f := newFixture(t)
		// e4 reaches the broker only 10s later (restart); the connector
		// confirmed it at once.
		e4 := f.events[3]
		f.copies[e4.ID][0].Append = e4.Committed.Add(10 * time.Second)
		f.r.live.seen[e4.ID] = e4.Committed.Add(10 * time.Second)
		f.sample(e4.Committed.Add(50*time.Millisecond), 400)
		rep := &Report{}
		f.r.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 1 || rep.ConsumerViolations != 1 {
			t.Fatalf("violations %d / consumer %d, fails %v", rep.WatermarkViolations, rep.ConsumerViolations, f.fails)
		}
	})
	t.Run("broker died before serving the consumer", func(t *testing.T) {
		f := newFixture(t)
		e4 := f.events[3]
		f.r.live.seen[e4.ID] = e4.Committed.Add(10 * time.Second)
		f.sample(e4.Committed.Add(50*time.Millisecond), 400)
		rep := &Report{}
		f.r.checkWatermark(rep, f.events, f.copies, f.fail)
		if rep.WatermarkViolations != 0 || rep.ConsumerLateChecks != 1 || len(f.fails) != 0 {
			t.Fatalf("violations %d, late %d, fails %v", rep.WatermarkViolations, rep.ConsumerLateChecks, f.fails)
		}
	})
}

func TestCheckOrder(t *testing.T) {
	seqs := func(s ...int) []copyRec {
		var out []copyRec
		for i, q := range s {
			out = append(out, copyRec{Topic: "p.order", Key: "a", Seq: q, Offset: int64(i)})
		}
		return out
	}
	for _, tt := range []struct {
		name string
		recs []copyRec
		bad  int
	}{
		{"in order", seqs(1, 2, 3, 4), 0},
		{"replayed tail", seqs(1, 2, 3, 2, 3, 4, 5), 0},
		{"replay inside a replay", seqs(1, 2, 3, 4, 2, 3, 3, 4, 5), 0},
		{"gap", seqs(1, 2, 4), 1},
		{"replay that skips", seqs(1, 2, 3, 4, 2, 4, 5), 1},
		{"backwards to an unseen seq", seqs(2, 3), 1},
		{"two partitions", append(seqs(1, 2), copyRec{Topic: "p.order", Partition: 1, Key: "a", Seq: 3}), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			rep := &Report{}
			f.r.checkOrder(rep, tt.recs, f.fail)
			if rep.OrderViolations != tt.bad {
				t.Fatalf("violations %d, want %d: %v", rep.OrderViolations, tt.bad, rep.OrderExamples)
			}
		})
	}
}

func TestCheckDuplicates(t *testing.T) {
	t.Run("resent after the confirmed position", func(t *testing.T) {
		f := newFixture(t)
		t1 := f.events[3].Committed.Add(time.Second)
		f.r.conn.incs = append(f.r.conn.incs, &incarnation{N: 2, Reason: "after-kill", Start: t1, SlotAtStart: 200})
		f.addCopy(f.events[2], t1.Add(10*time.Millisecond), 8)
		f.addCopy(f.events[3], t1.Add(10*time.Millisecond), 8)
		f.sample(t1.Add(-time.Millisecond), 200)
		rep := &Report{DuplicatesByIncarnation: map[string]int{}}
		f.r.checkDuplicates(rep, f.copies, f.byID, f.fail)
		if len(f.fails) != 0 || rep.Duplicates != 2 || rep.MaxDuplicatesPerKill != 2 {
			t.Fatalf("dups %d, max per kill %d, fails %v", rep.Duplicates, rep.MaxDuplicatesPerKill, f.fails)
		}
	})
	t.Run("resent below the position the process started from", func(t *testing.T) {
		f := newFixture(t)
		t1 := f.events[3].Committed.Add(time.Second)
		f.r.conn.incs = append(f.r.conn.incs, &incarnation{N: 2, Reason: "after-kill", Start: t1, SlotAtStart: 300})
		f.addCopy(f.events[2], t1.Add(10*time.Millisecond), 8) // e3 at LSN 300 was confirmed
		rep := &Report{DuplicatesByIncarnation: map[string]int{}}
		f.r.checkDuplicates(rep, f.copies, f.byID, f.fail)
		if rep.DupsBelowConfirmed != 1 || len(f.fails) != 1 {
			t.Fatalf("below confirmed %d, fails %v", rep.DupsBelowConfirmed, f.fails)
		}
	})
	t.Run("resent within a process after it was confirmed", func(t *testing.T) {
		f := newFixture(t)
		t1 := f.events[3].Committed.Add(time.Second)
		f.sample(t1, 400)
		f.addCopy(f.events[3], t1.Add(100*time.Millisecond), 7)
		rep := &Report{DuplicatesByIncarnation: map[string]int{}}
		f.r.checkDuplicates(rep, f.copies, f.byID, f.fail)
		if rep.DupsBelowEarlierSample != 1 || rep.InProcessDuplicates != 1 || len(f.fails) != 1 {
			t.Fatalf("below earlier sample %d, in process %d, fails %v", rep.DupsBelowEarlierSample, rep.InProcessDuplicates, f.fails)
		}
	})
	t.Run("a PostgreSQL restart may lose the confirmed position", func(t *testing.T) {
		f := newFixture(t)
		t1 := f.events[3].Committed.Add(time.Second)
		f.sample(t1, 400)
		f.r.faults = []faultRecord{{Kind: fPGCrash, Start: t1.Add(10 * time.Millisecond), End: t1.Add(50 * time.Millisecond)}}
		f.sample(t1.Add(60*time.Millisecond), 300)
		f.addCopy(f.events[3], t1.Add(100*time.Millisecond), 7)
		rep := &Report{DuplicatesByIncarnation: map[string]int{}}
		f.r.checkDuplicates(rep, f.copies, f.byID, f.fail)
		if rep.DupsBelowEarlierSample != 0 || len(f.fails) != 0 {
			t.Fatalf("below earlier sample %d, fails %v", rep.DupsBelowEarlierSample, f.fails)
		}
	})
}
