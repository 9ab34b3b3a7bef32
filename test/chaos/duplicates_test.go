package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// checkDuplicates attributes every extra copy to the connector process
// that produced it (by producer id) and checks that a process only resent
// events after the position the slot had confirmed when it started.
func (o *observation) checkDuplicates(rep *Report, copies map[string][]copyRec, byID map[string]*event, fail func(string, ...any)) {
	incs := o.Incarnations
	// A producer id belongs to the last process started before its first
	// append.
	firstAppend := map[int64]time.Time{}
	for _, cs := range copies {
		for _, c := range cs {
			if t, ok := firstAppend[c.Producer]; !ok || c.Append.Before(t) {
				firstAppend[c.Producer] = c.Append
			}
		}
	}
	incOf := map[int64]*incarnation{}
	for pid, t := range firstAppend {
		for _, in := range incs {
			if !in.Start.Truncate(time.Millisecond).After(t) {
				incOf[pid] = in
			}
		}
	}
	// Within one PostgreSQL lifetime the slot's confirmed position only
	// moves forward (a restart may lose its last value), so a copy appended
	// at A must not be of an event already confirmed by a sample before A.
	var pgStarts []time.Time
	for _, f := range o.Faults {
		if strings.HasPrefix(f.Kind, "pg-") {
			pgStarts = append(pgStarts, f.Start)
		}
		// The restored slot, or the promoted server's new one, is behind
		// what was confirmed before.
		pgStarts = append(pgStarts, f.rewinds()...)
	}
	slices.SortFunc(pgStarts, func(a, b time.Time) int { return a.Compare(b) })
	epochOf := func(t time.Time) int {
		return sort.Search(len(pgStarts), func(i int) bool { return pgStarts[i].After(t) })
	}
	samples := o.Samples
	runMax := make([]lsn.LSN, len(samples))
	for i, s := range samples {
		runMax[i] = s.Slot
		if i > 0 && epochOf(samples[i-1].T) == epochOf(s.T) {
			runMax[i] = max(runMax[i], runMax[i-1])
		}
	}
	confirmedBefore := func(a time.Time) (lsn.LSN, time.Time) {
		cut := a.Add(-appendTolerance)
		i := sort.Search(len(samples), func(i int) bool { return !samples[i].T.Before(cut) }) - 1
		if i < 0 || epochOf(samples[i].T) != epochOf(a) {
			return 0, time.Time{}
		}
		return runMax[i], samples[i].T
	}

	// The process before each one, to tell events the broker had appended
	// before a kill.
	prev := map[int]*incarnation{}
	for i := 1; i < len(incs); i++ {
		prev[incs[i].N] = incs[i-1]
	}
	ackedResent := map[int]int{}
	oldestResent := map[int]time.Duration{}

	perInc := map[int]int{}
	for id, cs := range copies {
		if len(cs) < 2 {
			continue
		}
		e := byID[id]
		first := incOf[cs[0].Producer]
		for _, c := range cs[1:] {
			rep.Duplicates++
			in := incOf[c.Producer]
			if conf, at := confirmedBefore(c.Append); conf != 0 && e.PostLSN <= conf && (in == nil || (in.Reason != reasonAfterGap && !in.Backfilled)) {
				rep.DupsBelowEarlierSample++
				if len(rep.DupExamples) < 10 {
					rep.DupExamples = append(rep.DupExamples, fmt.Sprintf("event %s (%s seq %d, post-commit LSN %v) appended again at %s although the slot had confirmed %v by %s",
						id, e.Agg, e.Seq, e.PostLSN, c.Append.Format("15:04:05.000"), conf, at.Format("15:04:05.000")))
				}
			}
			if in == nil || in == first {
				// Resent by the process that sent it first: a replication
				// reconnect resending the open transaction.
				rep.InProcessDuplicates++
				if len(rep.InProcessExamples) < 10 {
					rep.InProcessExamples = append(rep.InProcessExamples, fmt.Sprintf("event %s (%s seq %d) appended at %s and again at %s (%s)",
						id, e.Agg, e.Seq, cs[0].Append.Format("15:04:05.000"), c.Append.Format("15:04:05.000"), o.faultAt(c.Append)))
				}
				continue
			}
			perInc[in.N]++
			if in.Reason == reasonAfterGap || in.Backfilled {
				// The gap's backfill reads rows from the table and may send
				// again events confirmed before the gap: allowed
				// (at-least-once), counted.
				rep.GapBackfillDuplicates++
				if e.PostLSN <= in.SlotAtStart {
					rep.GapBackfillBelowConfirmed++
				}
				continue
			}
			if p := prev[in.N]; p != nil && in.Reason == "after-kill" && cs[0].Append.Before(p.ExitAt) {
				ackedResent[in.N]++
				// Age at the death of the process that sent it first.
				if first != nil && !first.ExitAt.IsZero() {
					age := first.ExitAt.Sub(cs[0].Append)
					if age > oldestResent[in.N] {
						oldestResent[in.N] = age
					}
				}
			}
			if e.PostLSN <= in.SlotAtStart {
				rep.DupsBelowConfirmed++
				if len(rep.DupExamples) < 10 {
					rep.DupExamples = append(rep.DupExamples, fmt.Sprintf("event %s (%s seq %d, post-commit LSN %v) resent by process #%d, which started after slot position %v",
						id, e.Agg, e.Seq, e.PostLSN, in.N, in.SlotAtStart))
				}
			}
			if e.PostLSN <= in.CkptAtStart {
				rep.DupsBelowCheckpoint++
			}
		}
	}
	for _, in := range incs {
		n := perInc[in.N]
		if n > 0 {
			rep.DuplicatesByIncarnation[fmt.Sprintf("#%d", in.N)] = n
		}
		if in.Reason == "after-kill" {
			if ackedResent[in.N] > 0 {
				rep.KillsInAckWindow++
				rep.AckedResent += ackedResent[in.N]
			}
			rep.DuplicatesAfterKills += n
			rep.MaxDuplicatesPerKill = max(rep.MaxDuplicatesPerKill, n)
		}
		ij := incJSON{N: in.N, Reason: in.Reason, Start: in.Start.Format("15:04:05.000"), ReadyMillis: -1,
			SlotAtStart: in.SlotAtStart.String(), CkptAtStart: in.CkptAtStart.String(), Duplicates: n}
		if !in.Ready.IsZero() {
			ij.ReadyMillis = in.Ready.Sub(in.Start).Milliseconds()
		}
		if o, ok := oldestResent[in.N]; ok {
			ij.ResentAckedAge = o.Milliseconds()
			rep.MaxResentAckedAge = max(rep.MaxResentAckedAge, ij.ResentAckedAge)
		}
		rep.Incarnations = append(rep.Incarnations, ij)
	}
	if rep.DupsBelowConfirmed > 0 || rep.DupsBelowEarlierSample > 0 {
		fail("duplicates of confirmed events: %d at or below the slot's position when their process started, %d below a position confirmed earlier; first: %s",
			rep.DupsBelowConfirmed, rep.DupsBelowEarlierSample, strings.Join(rep.DupExamples, "; "))
	}
	// Did the after-ack kills land between the acknowledgement and the
	// status update? Then the burst's last event was sent again.
	for _, f := range o.Faults {
		if f.AckEvent == "" {
			continue
		}
		rep.KillsAfterAck++
		if len(copies[f.AckEvent]) > 1 {
			rep.KillsBeforeConfirm++
		}
	}
}
