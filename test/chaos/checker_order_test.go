package chaos

import (
	"testing"
	"time"
)

// TestCheckOrderAfterCheckpointDeletion: after a publication gap, a
// replay may jump over delivered events in any later process; the next new
// event may follow a cut repair's copies only as a key's first record in
// the process after ops-foreign-checkpoint deleted the checkpoint (short
// chaos seed 4544573273812459008: 40 41 | 40 | 42), never past it.
func TestCheckOrderAfterCheckpointDeletion(t *testing.T) {
	t0 := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// Producer 1 is process #1's, 2 the process after the fault's.
	recs := func(seqs ...[2]int) []copyRec {
		var out []copyRec
		for i, q := range seqs {
			out = append(out, copyRec{Topic: "p.order", Key: "a", Seq: q[1], Offset: int64(i), Producer: int64(q[0]), Append: at(10 * q[0])})
		}
		return out
	}
	for _, tt := range []struct {
		name    string
		detail  string
		gap     bool
		recs    []copyRec
		bad     int
		excused int
	}{
		{"the next event after an unfinished repair", "; deleted", true, recs([2]int{1, 1}, [2]int{1, 2}, [2]int{1, 1}, [2]int{2, 3}, [2]int{2, 4}), 0, 1},
		{"a replay over a gap's rows", "; deleted", true, recs([2]int{1, 1}, [2]int{1, 2}, [2]int{1, 3}, [2]int{2, 1}, [2]int{2, 3}, [2]int{2, 4}), 0, 1},
		{"the next new event only as the key's first record there", "; deleted", true,
			recs([2]int{1, 1}, [2]int{1, 2}, [2]int{2, 2}, [2]int{2, 1}, [2]int{2, 3}), 1, 0},
		{"not past the next new event", "; deleted", true, recs([2]int{1, 1}, [2]int{1, 2}, [2]int{1, 1}, [2]int{2, 4}), 1, 0},
		{"the checkpoint restored, not deleted", "; restored", true, recs([2]int{1, 1}, [2]int{1, 2}, [2]int{1, 1}, [2]int{2, 3}), 1, 0},
		{"no gap before the deletion", "; deleted", false, recs([2]int{1, 1}, [2]int{1, 2}, [2]int{1, 1}, [2]int{2, 3}), 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.o.Faults = nil
			if tt.gap {
				f.o.Faults = append(f.o.Faults, faultRecord{Kind: fOpsPubGap, Start: at(1)})
			}
			f.o.Faults = append(f.o.Faults, faultRecord{Kind: fOpsForeignCkpt, Start: at(15), Detail: "checkpoint replaced" + tt.detail})
			f.o.Incarnations = []*incarnation{{N: 1, Reason: "initial", Start: at(0)}, {N: 2, Reason: "after-ops-exit", Start: at(16)}}
			for i := range tt.recs {
				if tt.recs[i].Producer == 2 {
					tt.recs[i].Append = at(17)
				}
			}
			rep := &Report{}
			f.o.checkOrder(rep, tt.recs, nil, f.fail)
			if rep.OrderViolations != tt.bad || rep.GapReplayJumps != tt.excused {
				t.Fatalf("violations %d (want %d), excused %d (want %d): %v", rep.OrderViolations, tt.bad, rep.GapReplayJumps, tt.excused, rep.OrderExamples)
			}
		})
	}
}
