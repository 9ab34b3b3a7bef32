package chaos

import (
	"fmt"
	"strings"
	"time"
)

// deadSeqs are the dead-lettered events by key and seq. In dlq.mode skip
// (the exactly_once run) a key's later events go on to its topic past its
// dead letter: the order checks step over these seqs. In dlq.mode
// quarantine nothing may pass a dead letter (quarantine_test.go) until a
// redrive lifts the quarantine: with --skip its later events then follow
// on the topic without it.
type deadSeqs map[string]map[int]bool

func deadLettered(dlq []copyRec) deadSeqs {
	d := deadSeqs{}
	for _, c := range dlq {
		if d[c.Key] == nil {
			d[c.Key] = map[int]bool{}
		}
		d[c.Key][c.Seq] = true
	}
	return d
}

// add adds the events named in lost (parked events the parking topic's
// retention deleted before the redrive that lifted their quarantine with
// --skip): they never reach the topic either; and removes the dead letters
// a redrive republished (in republished) to their topic.
func (d deadSeqs) add(byID map[string]*event, lost map[string]string, republished map[string]bool) {
	for id := range republished {
		if e := byID[id]; e != nil && e.Oversize {
			delete(d[e.Agg], e.Seq)
		}
	}
	for id := range lost {
		if e := byID[id]; e != nil {
			if d[e.Agg] == nil {
				d[e.Agg] = map[int]bool{}
			}
			d[e.Agg][e.Seq] = true
		}
	}
}

// next is the seq that follows last for key: last+1, past dead letters.
func (d deadSeqs) next(key string, last int) int {
	n := last + 1
	for d[key][n] {
		n++
	}
	return n
}

// checkOrder: per aggregate, in partition order, the first sequence number
// is 1 and each next one is the previous plus one (past dead letters in
// dlq.mode skip), or goes back to one already seen (a replayed tail
// starting); every aggregate stays in one partition.
func (o *observation) checkOrder(rep *Report, recs []copyRec, dead deadSeqs, fail func(string, ...any)) {
	type state struct {
		topic     string
		partition int32
		last, max int
	}
	st := map[string]*state{}
	proc := processOf(o.Incarnations, recs)
	// A process started after a publication gap may replay across it
	// without the gap's record (ops-foreign-checkpoint deleted the
	// checkpoint that held it): the gap's rows were never in the WAL
	// stream, so its replay of delivered events jumps over them; and a
	// process killed during an at_least_once repair leaves its copies cut,
	// which the next one's replay does not take up where they stopped.
	var gapAt time.Time
	for _, f := range o.Faults {
		if gapKind(f.Kind) {
			gapAt = f.Start
			break
		}
	}
	of := incarnationOf(o.Incarnations, recs)
	replaysAcrossGap := func(c copyRec) bool {
		in := of(c)
		return !gapAt.IsZero() && in != nil && in.Start.After(gapAt)
	}
	// The process after ops-foreign-checkpoint deleted the checkpoint lost
	// the gap's record with it, and with it the repair the process before
	// had begun (copies of delivered events, from the table) and a stop
	// cut: a key's first record there may be its next new event.
	deletedBy := o.checkpointDeletion()
	seenThere := map[string]bool{}
	firstAfterDeletion := func(c copyRec) bool {
		if in := of(c); in == nil || in.N != deletedBy || seenThere[c.Key] {
			return false
		}
		seenThere[c.Key] = true
		return true
	}
	repaired := o.repairOrder(rep, recs, fail) // lostorder_test.go
	bad := func(c copyRec, format string, args ...any) {
		rep.OrderViolations++
		if who := proc(c); who != "" {
			if rep.OrderViolationsByProcess == nil {
				rep.OrderViolationsByProcess = map[string]int{}
			}
			rep.OrderViolationsByProcess[strings.Trim(who, " ()")]++
		}
		if len(rep.OrderExamples) < 10 {
			rep.OrderExamples = append(rep.OrderExamples, fmt.Sprintf(format, args...)+proc(c)+repaired.note(c))
		}
	}
	for _, c := range recs {
		if o.Redrive.Lost[c.ID] != "" {
			// An event lost to parking retention has a copy only if a
			// verify --repair (a runbook's) republished it later: late by
			// design, it is not held to the order.
			rep.RepairedAfterRetention++ // repairedLost: verify takes them for found
			continue
		}
		s := st[c.Key]
		if s == nil {
			s = &state{topic: c.Topic, partition: c.Partition}
			st[c.Key] = s
		}
		if s.topic != c.Topic || s.partition != c.Partition {
			bad(c, "aggregate %s in %s/%d and %s/%d", c.Key, s.topic, s.partition, c.Topic, c.Partition)
			continue
		}
		first := firstAfterDeletion(c)
		switch {
		case c.Seq == dead.next(c.Key, s.last):
		case c.Seq <= s.last && c.Seq >= 1:
			// A replay restarting at an event already delivered (every seq
			// up to last has been seen); it must then continue +1.
		case repaired.excuses(c, dead):
			// A lost slot's rows, republished late and in table order.
			rep.LostSlotRepairJumps++
		case c.Seq <= s.max && replaysAcrossGap(c), first && c.Seq == dead.next(c.Key, s.max):
			// A replay of delivered events over the rows of a gap, or a
			// cut repair's record lost (above).
			rep.GapReplayJumps++
		default:
			bad(c, "aggregate %s: seq %d after %d (max seen %d) at %s/%d@%d", c.Key, c.Seq, s.last, s.max, c.Topic, c.Partition, c.Offset)
		}
		// Diagnosis only: the first copies alone, are they in order?
		if c.Seq > s.max && c.Seq != dead.next(c.Key, s.max) {
			rep.FirstCopyOrderViolations++
		}
		s.last = c.Seq
		s.max = max(s.max, c.Seq)
		repaired.observe(c)
	}
	if rep.OrderViolations > 0 {
		fail("%d order violations (%d of them among first copies; by process %v); first: %s", rep.OrderViolations, rep.FirstCopyOrderViolations,
			rep.OrderViolationsByProcess, strings.Join(rep.OrderExamples, "; "))
	}
}

// checkpointDeletion is the process started after the first
// ops-foreign-checkpoint that deleted the checkpoint once a publication gap
// had happened (before one, no gap's record can be lost); 0: none.
func (o *observation) checkpointDeletion() int {
	gap := false
	for _, f := range o.Faults {
		gap = gap || gapKind(f.Kind)
		if !gap || f.Kind != fOpsForeignCkpt || !strings.Contains(f.Detail, "; deleted") {
			continue
		}
		for _, in := range o.Incarnations {
			if in.Start.After(f.Start) && in.Reason == "after-ops-exit" {
				return in.N
			}
		}
	}
	return 0
}

// processOf tells, for the examples, which connector process appended a
// copy: a producer id belongs to the last process started before its first
// append.
func processOf(incs []*incarnation, recs []copyRec) func(copyRec) string {
	of := incarnationOf(incs, recs)
	return func(c copyRec) string {
		in := of(c)
		if in == nil {
			return ""
		}
		return fmt.Sprintf(" (process #%d, %s)", in.N, in.Reason)
	}
}

// incarnationOf finds the process that produced a copy: the last one
// started before its producer id's first append.
func incarnationOf(incs []*incarnation, recs []copyRec) func(copyRec) *incarnation {
	firstAppend := map[int64]time.Time{}
	for _, c := range recs {
		if t, ok := firstAppend[c.Producer]; !ok || c.Append.Before(t) {
			firstAppend[c.Producer] = c.Append
		}
	}
	return func(c copyRec) *incarnation {
		var in *incarnation
		for _, x := range incs {
			if !x.Start.Truncate(time.Millisecond).After(firstAppend[c.Producer]) {
				in = x
			}
		}
		return in
	}
}
