package chaos

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// checkWatermark: for every sample (T, C) of the slot's confirmed position
// and of the checkpoint, every event whose post-commit LSN is ≤ C must
//
//   - have a copy the broker appended by T (LogAppendTime, no slack): a
//     failure is a violation of guarantee 3;
//   - have been consumed by the live consumer by T + consumeSlack; a miss is
//     excused (and counted) only when the broker had appended the event by
//     T, i.e. the broker died or was cut off between acknowledging the
//     record and serving it to the consumer.
func (o *observation) checkWatermark(rep *Report, events []event, copies map[string][]copyRec, fail func(string, ...any)) {
	seen := o.Seen
	samples := o.Samples
	rep.WatermarkSamples = len(samples)
	for _, s := range samples {
		if o.inKafkaOutage(s.T) {
			rep.WatermarkSamplesKafkaDown++
		}
	}
	// How long after the broker appended a record the live consumer saw it.
	var lags []time.Duration
	for id, ts := range seen {
		if cs := copies[id]; len(cs) > 0 {
			lags = append(lags, ts.Sub(cs[0].Append))
		}
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		rep.ConsumerLagP50Millis = lags[len(lags)/2].Milliseconds()
		rep.ConsumerLagP99Millis = lags[len(lags)*99/100].Milliseconds()
		rep.ConsumerLagMaxMillis = lags[len(lags)-1].Milliseconds()
	}
	// Each history of the server's WAL (a restore or a promotion starts a
	// new one, walEpochs) is checked on its own: a sample covers only the
	// events that history holds.
	var clags []time.Duration
	reported := map[string]bool{}
	for _, ep := range o.walEpochs(events, samples) {
		o.watermarkEpoch(rep, ep.events, ep.samples, copies, seen, reported, &clags)
	}
	if len(clags) > 0 {
		slices.Sort(clags)
		rep.ConfirmLagP50Millis = clags[len(clags)/2].Milliseconds()
		rep.ConfirmLagP99Millis = clags[len(clags)*99/100].Milliseconds()
		rep.ConfirmLagMaxMillis = clags[len(clags)-1].Milliseconds()
	}
	if rep.WatermarkViolations > 0 {
		fail("%d samples confirm events the broker had not acknowledged; first: %s",
			rep.WatermarkViolations, strings.Join(rep.WatermarkExamples, "; "))
	}
}

// watermarkEpoch runs the watermark check over the samples and events of
// one history of the server's WAL; clags collects the confirmation lags.
func (o *observation) watermarkEpoch(rep *Report, events []event, samples []sample, copies map[string][]copyRec, seen map[string]time.Time,
	reported map[string]bool, clags *[]time.Duration) {
	evs := slices.Clone(events) // this history's events
	sort.Slice(evs, func(i, j int) bool { return evs[i].PostLSN < evs[j].PostLSN })
	far := time.Unix(math.MaxInt32, 0)
	type pmax struct {
		t   time.Time
		idx int
	}
	// Over the events sorted by post-commit LSN, the running maximum of
	// the time by which each had a copy in the broker's log, and of the
	// time by which the live consumer had it (minus the slack).
	appended := make([]pmax, len(evs))
	consumed := make([]pmax, len(evs))
	var curA, curC pmax
	for i, e := range evs {
		c := far
		if ts, ok := seen[e.ID]; ok {
			c = ts.Add(-consumeSlack)
		}
		a := far
		for _, cp := range copies[e.ID] {
			if t := cp.Append.Add(-appendTolerance); t.Before(a) {
				a = t
			}
		}
		if i == 0 || a.After(curA.t) {
			curA = pmax{a, i}
		}
		if i == 0 || c.After(curC.t) {
			curC = pmax{c, i}
		}
		appended[i], consumed[i] = curA, curC
	}
	// How long after the broker appended an event the slot's confirmed
	// position covered it (to the 50ms sampling), away from faults.
	next := 0
	for _, s := range samples {
		for next < len(evs) && evs[next].PostLSN <= s.Slot {
			e := evs[next]
			next++
			if cs := copies[e.ID]; len(cs) > 0 && !o.inFault(cs[0].Append) && !o.inFault(s.T) {
				*clags = append(*clags, s.T.Sub(cs[0].Append))
			}
		}
	}

	describe := func(what string, s sample, c lsn.LSN, e event) string {
		cons, app := "never", "never"
		if ts, ok := seen[e.ID]; ok {
			cons = ts.Format("15:04:05.000")
		}
		if cs := copies[e.ID]; len(cs) > 0 {
			app = cs[0].Append.Format("15:04:05.000")
		}
		return fmt.Sprintf("%s %v read at %s covers event %s (%s seq %d, post-commit LSN %v, committed %s), consumed %s, appended %s",
			what, c, s.T.Format("15:04:05.000"), e.ID, e.Agg, e.Seq, e.PostLSN, e.Committed.Format("15:04:05.000"), cons, app)
	}
	check := func(s sample, c lsn.LSN, what string) {
		k := sort.Search(len(evs), func(i int) bool { return evs[i].PostLSN > c })
		if k == 0 {
			return
		}
		rep.WatermarkChecks++
		late := consumed[k-1].t.After(s.T)
		if appended[k-1].t.After(s.T) {
			// Confirmed before the broker had the event: guarantee 3.
			rep.WatermarkViolations++
			if late {
				rep.ConsumerViolations++
			}
			e := evs[appended[k-1].idx]
			if !reported[e.ID] && len(rep.WatermarkExamples) < 10 {
				reported[e.ID] = true
				rep.WatermarkExamples = append(rep.WatermarkExamples, describe(what, s, c, e))
			}
			return
		}
		if late {
			// The live consumer had not seen it within the slack, but the
			// broker had appended it before T: the broker died (or was cut
			// off) between acknowledging and serving it.
			rep.ConsumerLateChecks++
			if !o.inKafkaOutage(s.T) {
				rep.ConsumerLateOutsideOutage++
			}
		}
	}
	for _, s := range samples {
		check(s, s.Slot, "slot confirmed_flush_lsn")
		if s.Ckpt != 0 {
			check(s, s.Ckpt, "checkpoint")
		}
	}
}

// inKafkaOutage reports whether t lies in a fault that cut the connector
// off the broker.
func (o *observation) inKafkaOutage(t time.Time) bool {
	for _, f := range o.Faults {
		if kafkaUnreachable(f.Kind) && !t.Before(f.Start) && !t.After(f.End) {
			return true
		}
	}
	return false
}

// inFault reports whether t lies in a fault or the second after it.
func (o *observation) inFault(t time.Time) bool {
	for _, f := range o.Faults {
		if !t.Before(f.Start) && t.Before(f.End.Add(time.Second)) {
			return true
		}
	}
	return false
}

// kafkaUnreachable tells the faults during which the connector cannot reach
// the broker at all.
func kafkaUnreachable(kind string) bool {
	switch kind {
	case fKafkaKill, fKafkaKillCommit, fKafkaStop, fNetKafkaDrop, fNetKafkaStall, fKafkaKillLarge:
		return true
	}
	return false
}

// recoveries measures, for each fault, the time from its end to the first
// event consumed that had not been consumed before, and to every event
// committed before its end being consumed.
func (o *observation) recoveries(rep *Report, events []event) {
	seen := o.Seen
	times := make([]time.Time, 0, len(seen))
	for _, t := range seen {
		times = append(times, t)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	evs := slices.Clone(events)
	slices.SortFunc(evs, func(a, b event) int { return a.Committed.Compare(b.Committed) })
	prefix := make([]time.Time, len(evs)) // latest consumption among the first i+1 committed
	var cur time.Time
	for i, e := range evs {
		if t, ok := seen[e.ID]; ok && t.After(cur) {
			cur = t
		}
		prefix[i] = cur
	}
	for i := range o.Faults {
		f := &o.Faults[i]
		j := sort.Search(len(times), func(k int) bool { return times[k].After(f.End) })
		if j < len(times) {
			f.FirstDelivery = times[j].Sub(f.End)
		}
		k := sort.Search(len(evs), func(k int) bool { return evs[k].Committed.After(f.End) })
		if k > 0 && prefix[k-1].After(f.End) {
			f.CaughtUp = prefix[k-1].Sub(f.End)
		}
		next := time.Now()
		if i+1 < len(o.Faults) {
			next = o.Faults[i+1].Start
		}
		f.Measured = j < len(times) && !f.End.Add(max(f.FirstDelivery, f.CaughtUp)).After(next)
		if !f.Measured {
			rep.UnmeasuredRecoveries++
			continue
		}
		at := f.End.Format("15:04:05.000")
		if ms := f.FirstDelivery.Milliseconds(); ms > rep.LongestFirstDelivery.Millis {
			rep.LongestFirstDelivery = recovery{ms, f.Kind, at}
		}
		if ms := f.CaughtUp.Milliseconds(); ms > rep.LongestCaughtUp.Millis {
			rep.LongestCaughtUp = recovery{ms, f.Kind, at}
		}
		if ms := f.CaughtUp.Milliseconds(); ms >= rep.RecoveryByKind[f.Kind].Millis {
			rep.RecoveryByKind[f.Kind] = recovery{ms, "", at}
		}
	}
}

// faultAt names the faults under way (or ended within 5s) at t, for the
// examples of a report.
func (o *observation) faultAt(t time.Time) string {
	var kinds []string
	for _, f := range o.Faults {
		if !t.Before(f.Start) && t.Before(f.End.Add(5*time.Second)) {
			kinds = append(kinds, f.Kind)
		}
	}
	if len(kinds) == 0 {
		return "no fault within 5s"
	}
	return strings.Join(kinds, ", ")
}
