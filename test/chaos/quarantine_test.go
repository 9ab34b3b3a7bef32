package chaos

import (
	"context"
	"fmt"
	"slices"
)

// The connector runs with dlq.mode quarantine (the default): once an event
// of a key is dead-lettered, the key's later events are parked on the
// parking topic, in order, until a redrive. ops-oversize writes an
// oversize event of aggregate "big" followed by a few that fit.

// parkingTopic and quarantineTopic are the run's own, out of reach of
// the topic template (prefix.{aggregate_type}).
func (r *run) parkingTopic() string    { return r.prefix + "-parking" }
func (r *run) quarantineTopic() string { return r.prefix + "-quarantine" }

// afterOversize is how many events that fit ops-oversize writes after its
// oversize one, of the same aggregate.
const afterOversize = 3

// commitAfterOversize commits the events of "big" that follow an oversize
// one: they are parked, not dead-lettered.
func (r *run) commitAfterOversize(ctx context.Context) error {
	return r.commitBig(ctx, afterOversize)
}

// checkParking counts the parking topic's records as deliveries of the
// committed events they are copies of, and requires per key what
// quarantineViolations says.
func (o *observation) checkParking(rep *Report, recs, dlq []copyRec, byID map[string]*event,
	copies map[string][]copyRec, fail func(string, ...any)) {
	if o.ParkedErr != "" {
		fail("read the parking topic: %v", o.ParkedErr)
		return
	}
	parked := withDeleted(o.Parked, o.Kept[o.ParkingTopic])
	parked = dropUndone(rep, parked, o.Undone)
	for _, c := range parked {
		if c.Deleted {
			rep.ParkedDeleted++
		}
	}
	rep.Parked = len(parked)
	for _, c := range parked {
		e := byID[c.ID]
		if e == nil || c.Key != e.Agg || c.Seq != e.Seq {
			rep.QuarantineViolations++
			fail("parked record %s/%d@%d id %q (key %s seq %d) is no committed event", c.Topic, c.Partition, c.Offset, c.ID, c.Key, c.Seq)
			continue
		}
		copies[c.ID] = append(copies[c.ID], c)
	}
	dlq, parked = lateRepairs(o.Redrive.Lost, dlq, parked)
	for _, v := range quarantineViolations(recs, dlq, parked, o.Redrive.Lifted) {
		rep.QuarantineViolations++
		fail("dlq.mode quarantine: %s", v)
	}
}

// lateRepairs leaves out of dlq and parked the copies of events lost to
// parking retention (lost: id → where the redrive's refusal named it
// parked) other than that parked original: a verify --repair (a runbook's)
// republished them later, by the quarantine rules of its time, late by
// design, as checkOrder treats them.
func lateRepairs(lost map[string]string, dlq, parked []copyRec) (d, p []copyRec) {
	late := func(c copyRec, parking bool) bool {
		at, ok := lost[c.ID]
		return ok && (!parking || at != fmt.Sprintf("partition %d offset %d", c.Partition, c.Offset))
	}
	for _, c := range dlq {
		if !late(c, false) {
			d = append(d, c)
		}
	}
	for _, c := range parked {
		if !late(c, true) {
			p = append(p, c)
		}
	}
	return d, p
}

// withDeleted adds to parked (the final read) the parked records the live
// consumer read (live) that are no longer there: retention deleted them.
// They are marked Deleted and the result is in offset order.
func withDeleted(parked, live []copyRec) []copyRec {
	have := map[[2]int64]bool{}
	for _, c := range parked {
		have[[2]int64{int64(c.Partition), c.Offset}] = true
	}
	out := slices.Clone(parked)
	for _, c := range live {
		if !have[[2]int64{int64(c.Partition), c.Offset}] {
			c.Deleted = true
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b copyRec) int {
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return out
}

// quarantineViolations checks the order across the event topics (recs),
// the dead-letter topic and the parking topic, each in partition order. A
// key's quarantine starts at a dead-lettered seq: after it nothing of the
// key is on its topic, the dead-letter topic holds that event only (again
// after a replay), and the parking topic holds the later events, their
// first occurrences in seq order; until a redrive lifts it (lifted: key →
// the first seqs of the quarantines lifted), after which its events may be
// on the topic and a later dead letter begins the next quarantine. A key
// without a dead letter has nothing parked. Loss is checkLoss's, order on
// the topic checkOrder's.
func quarantineViolations(recs, dlq, parked []copyRec, lifted map[string]map[int]bool) []string {
	var out []string
	starts := map[string][]int{} // key → its dead-lettered seqs, ascending
	for _, c := range dlq {
		if !slices.Contains(starts[c.Key], c.Seq) {
			starts[c.Key] = append(starts[c.Key], c.Seq)
		}
	}
	for k := range starts {
		slices.Sort(starts[k])
	}
	// began is the start of the quarantine seq of key falls in: the
	// largest dead-lettered seq at or below it.
	began := func(key string, seq int) (int, bool) {
		ss := starts[key]
		i, found := slices.BinarySearch(ss, seq)
		if found {
			return ss[i], true
		}
		if i == 0 {
			return 0, false
		}
		return ss[i-1], true
	}
	for _, c := range dlq {
		if s, ok := began(c.Key, c.Seq-1); ok && !lifted[c.Key][s] {
			out = append(out, fmt.Sprintf("%s seq %d dead-lettered after its quarantine began at seq %d (%s/%d@%d): it should be parked",
				c.Key, c.Seq, s, c.Topic, c.Partition, c.Offset))
		}
	}
	for _, c := range recs {
		if s, ok := began(c.Key, c.Seq); ok && !lifted[c.Key][s] && c.Seq > s {
			out = append(out, fmt.Sprintf("%s seq %d on %s/%d@%d overtook its dead-lettered seq %d", c.Key, c.Seq, c.Topic, c.Partition, c.Offset, s))
		}
	}
	seen := map[string][]int{} // key → first occurrences parked, in order
	for _, c := range parked {
		s, ok := began(c.Key, c.Seq)
		switch {
		case !ok && len(starts[c.Key]) == 0:
			out = append(out, fmt.Sprintf("%s seq %d parked (%s/%d@%d) but nothing of the key was dead-lettered", c.Key, c.Seq, c.Topic, c.Partition, c.Offset))
			continue
		case !ok:
			out = append(out, fmt.Sprintf("%s seq %d parked (%s/%d@%d), before its dead-lettered seq %d", c.Key, c.Seq, c.Topic, c.Partition, c.Offset, starts[c.Key][0]))
			continue
		case c.Seq == s || slices.Contains(seen[c.Key], c.Seq): // a replay
			continue
		}
		if prev := seen[c.Key]; len(prev) > 0 && c.Seq < prev[len(prev)-1] {
			out = append(out, fmt.Sprintf("%s seq %d parked (%s/%d@%d) after seq %d", c.Key, c.Seq, c.Topic, c.Partition, c.Offset, prev[len(prev)-1]))
		}
		seen[c.Key] = append(seen[c.Key], c.Seq)
	}
	return out
}
