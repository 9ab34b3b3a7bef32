package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Tolerances of the watermark check.
const (
	// consumeSlack: an event the connector confirmed at time T must have
	// been consumed by the live consumer by T + consumeSlack.
	consumeSlack = time.Second
	// appendTolerance: or the broker must have appended a copy of it by T
	// (LogAppendTime, whole milliseconds on the same clock).
	appendTolerance = 2 * time.Millisecond
)

// copyRec is one record of the final read.
type copyRec struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	ID        string
	Seq       int
	Producer  int64
	Epoch     int16     // producer epoch: one per Kafka transaction under KIP-890
	Append    time.Time // LogAppendTime
	LogAppend bool      // the timestamp is the broker's append time
	Err       string    // the error header (dead-letter records)
	HasErr    bool
	// Deleted: a parked record the live consumer read that the parking
	// topic's retention deleted before the final read. It was appended
	// (the watermark and duplicate checks count it) but is no delivery.
	Deleted bool
	// Compacted: a record of the compacted topic the live consumer read
	// that the cleaner removed before the final read: a delivery
	// (compacted_test.go).
	Compacted bool
}

// analyze reads everything back and runs the checks.
func (r *run) analyze(ctx context.Context) *Report {
	t := r.t
	rep := &Report{FaultsByKind: map[string]int{}, FaultsByClass: map[string]int{}, RecoveryByKind: map[string]recovery{},
		DuplicatesByIncarnation: map[string]int{}, SlackMillis: consumeSlack.Milliseconds()}
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		rep.Failures = append(rep.Failures, msg)
		t.Errorf("%s", msg)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	events := r.ledger.all()
	rep.EventsWritten = len(events)
	for _, e := range events {
		if e.Message {
			rep.MessageEvents++
		}
	}
	rep.Transactions = r.wstats.txns.Load()
	rep.WriterRetries = r.wstats.retries.Load()
	rep.UnknownCommits = r.wstats.unknown.Load()
	rep.UnknownCommitted = r.wstats.unknownWon.Load()
	for _, f := range r.faults {
		rep.FaultsByKind[f.Kind]++
		rep.FaultsByClass[faultClass(f.Kind)]++
		rep.ConnectorKills += f.Kills
	}
	for _, k := range allFaults {
		if r.skip[k] {
			rep.SkippedKinds = append(rep.SkippedKinds, k)
		}
	}
	rep.FaultsTotal = len(r.faults)
	rep.ExpectedExits = r.expectedExits
	rep.OpsFailures = r.opsFailures
	for _, f := range r.opsFailures {
		rep.Failures = append(rep.Failures, "operations: "+strings.SplitN(f, "\n", 2)[0])
	}
	rep.WriterRefusedCol = r.wstats.undefinedColumn.Load()
	rep.UnexpectedExits = r.exits
	rep.HangingAborted = append(append([]string(nil), r.runbooks...), r.conn.startRunbooks()...)
	rep.Hangs = r.hangs
	for _, h := range r.hangs {
		rep.Failures = append(rep.Failures, "hang: "+h)
	}
	for _, e := range r.exits {
		rep.Failures = append(rep.Failures, "unexpected exit: "+strings.SplitN(e, "\n", 2)[0])
	}

	byID := make(map[string]*event, len(events))
	for i := range events {
		if byID[events[i].ID] != nil {
			fail("writer bookkeeping: event %s recorded twice", events[i].ID)
		}
		byID[events[i].ID] = &events[i]
	}

	// The table is the ground truth of what committed.
	table, err := readTable(rctx, direct(r.dsn))
	if err != nil {
		fail("read outbox table: %v", err)
	}
	for id, row := range table {
		e := byID[id]
		if e == nil {
			rep.TableMismatches++
			fail("row %s (%s seq %d) is in the table but no writer counted it committed", id, row.agg, row.seq)
		} else if e.Agg != row.agg || e.Seq != row.seq {
			rep.TableMismatches++
			fail("row %s is %s seq %d in the table, %s seq %d for its writer", id, row.agg, row.seq, e.Agg, e.Seq)
		}
	}
	if err == nil {
		for id, e := range byID {
			if _, ok := table[id]; !ok && !e.Message { // a table-less event has no row
				rep.TableMismatches++
				fail("event %s (%s seq %d) counted committed but not in the table", id, e.Agg, e.Seq)
			}
		}
	}

	recs, dlq, err := readAll(rctx, append(slices.Clone(r.topics), r.bigTopic), r.dlq)
	if err != nil {
		fail("read topics: %v", err)
	}
	rep.RecordsInKafka = len(recs)
	recs = r.withCompacted(rep, recs)
	undone := r.ledger.undoneIDs()
	rep.EventsUndone = len(undone)
	recs, dlq = dropUndone(rep, recs, undone), dropUndone(rep, dlq, undone)

	// Copies per event, in partition order; the dead-letter copies of the
	// events written oversize on purpose count as their delivery.
	copies := map[string][]copyRec{}
	createTime := 0
	for _, c := range dlq {
		if !c.LogAppend {
			createTime++
		}
	}
	r.checkDeadLetters(rep, dlq, byID, copies, fail)
	for _, c := range recs {
		if !c.LogAppend {
			createTime++
		}
		e := byID[c.ID]
		if e != nil && e.Oversize && !r.rd.republished[c.ID] { // a redrive republishes it with the limit raised
			rep.UnexpectedRecords++
			fail("record %s/%d@%d is event %s, written larger (%d-byte pad) than its topic's max.message.bytes (%d): the broker accepted it",
				c.Topic, c.Partition, c.Offset, c.ID, oversizePad, bigTopicMaxBytes)
			continue
		}
		if e == nil {
			rep.UnexpectedRecords++
			if rep.UnexpectedRecords <= 5 {
				fail("record %s/%d@%d id %q key %s is no committed event", c.Topic, c.Partition, c.Offset, c.ID, c.Key)
			}
			continue
		}
		if c.Key != e.Agg || c.Topic != r.prefix+"."+e.Type || c.Seq != e.Seq {
			rep.UnexpectedRecords++
			if rep.UnexpectedRecords <= 5 {
				fail("record %s/%d@%d (key %s seq %d) does not match event %s (%s %s seq %d)",
					c.Topic, c.Partition, c.Offset, c.Key, c.Seq, e.ID, e.Type, e.Agg, e.Seq)
			}
		}
		copies[c.ID] = append(copies[c.ID], c)
	}
	if createTime > 0 {
		fail("%d records without a LogAppendTime timestamp: the watermark and duplicate checks need the topics' message.timestamp.type", createTime)
	}
	if rep.UnexpectedRecords > 5 {
		fail("%d unexpected records in all", rep.UnexpectedRecords)
	}
	r.checkParking(rctx, rep, recs, dlq, byID, copies, fail)
	dead := deadLettered(dlq)
	checkLoss(rep, r.withoutSlotLost(rep, events, copies, byID, dead), copies, r.rd.lost, fail)
	r.checkRetention(rep, table, copies, fail)
	rep.Slow = r.slowSummary(events)
	r.checkSecondSlot(rctx, rep, fail)

	r.noteBackfills(rep)
	dead.add(byID, r.rd.lost, r.rd.republished)
	r.checkOrder(rep, recs, dead, fail)
	r.checkDuplicates(rep, r.withoutRedriven(rep, copies), byID, fail)
	eoRecs, eoCopies := r.withoutReadBackCopies(rep, recs, copies, byID)
	r.checkExactlyOnce(rep, eoRecs, eoCopies, byID, dead, fail)
	r.checkWatermark(rep, events, copies, fail)
	r.recoveries(rep, events)
	rep.Verify = r.verifyRun(ctx, r.verifySince(), fail)

	for _, f := range r.faults {
		rep.Faults = append(rep.Faults, faultJSON{Kind: f.Kind, Start: f.Start.Format("15:04:05.000"),
			Seconds: round2(f.End.Sub(f.Start).Seconds()), Detail: f.Detail, ExpectedExit: f.ExpectedExit,
			FirstDelivery: f.FirstDelivery.Milliseconds(), CaughtUp: f.CaughtUp.Milliseconds(), Measured: f.Measured})
	}
	rep.Pass = len(rep.Failures) == 0 && !t.Failed()
	return rep
}

// backfillLine is how a connector process says it published rows of a
// publication gap from the table.
var backfillLine = regexp.MustCompile(`(?i)published the rows written while|backfill`)

// noteBackfills marks the processes that published rows of a publication
// gap from the table, from their logs, and lists what each said.
func (r *run) noteBackfills(rep *Report) {
	for _, in := range r.conn.incarnations() {
		for l := range strings.SplitSeq(r.conn.logOf(in.N), "\n") {
			if backfillLine.MatchString(l) {
				in.Backfilled = true
				if _, rest, ok := strings.Cut(l, "msg="); ok {
					l = rest
				}
				rep.Backfills = append(rep.Backfills, fmt.Sprintf("#%d (%s): %s", in.N, in.Reason, l))
			}
		}
	}
}

// withoutRedriven leaves out of copies, for the duplicate checks, the
// copies on their topic of the events a redrive republished: the redrive
// sends again on purpose what was parked (or dead-lettered) earlier. So are
// the copies a runbook's verify --repair republished of an event lost to the
// parking topic's retention (outbox retention keeps its row while a lost
// slot's repair is pending; the order check counts them,
// RepairedAfterRetention): one on its topic, and one parked again when its
// aggregate was quarantined then (a later redrive delivers that one, the
// copy on its topic). Any further copy stays a duplicate.
func (r *run) withoutRedriven(rep *Report, copies map[string][]copyRec) map[string][]copyRec {
	out := make(map[string][]copyRec, len(copies))
	for id, cs := range copies {
		redriven, lost := r.rd.republished[id], r.rd.lost[id] != ""
		if !redriven && !lost {
			out[id] = cs
			continue
		}
		reparked, repaired := false, false
		for _, c := range cs {
			aside := c.Topic == r.parkingTopic() || c.Topic == r.dlq
			switch {
			case redriven && !aside:
				rep.Redriven++
			case lost && !c.Deleted && aside && !reparked:
				reparked = true
			case lost && !aside && !repaired:
				repaired = true
			default:
				out[id] = append(out[id], c)
			}
		}
	}
	return out
}

// checkLoss: every committed event has a copy (on its topic, or on the
// dead-letter topic for an event written oversize on purpose), except the
// events a redrive named as deleted by the parking topic's retention
// (lost, event id → where): those are counted apart, and any other event
// without a copy is lost.
func checkLoss(rep *Report, events []event, copies map[string][]copyRec, lost map[string]string, fail func(string, ...any)) {
	for _, e := range events {
		if e.Oversize {
			rep.OversizeEvents++
		}
		if !slices.ContainsFunc(copies[e.ID], func(c copyRec) bool { return !c.Deleted }) {
			if at := lost[e.ID]; at != "" {
				rep.LostToRetention++
				rep.LostToRetentionIDs = append(rep.LostToRetentionIDs, fmt.Sprintf("%s (%s seq %d, parking %s)", e.ID, e.Agg, e.Seq, at))
				continue
			}
			rep.EventsLost++
			if len(rep.LostExamples) < 20 {
				where := ""
				if e.Oversize {
					where = ", oversize: expected on the dead-letter topic"
				}
				if e.Backdate > 0 {
					where += fmt.Sprintf(", created_at backdated %v", e.Backdate)
				}
				rep.LostExamples = append(rep.LostExamples, fmt.Sprintf("%s (%s seq %d, bucket %d, committed %s, post-commit LSN %v, resolved %v%s)",
					e.ID, e.Agg, e.Seq, e.Bucket, e.Committed.Format("15:04:05.000"), e.PostLSN, e.Resolved, where))
			}
		}
	}
	if rep.EventsLost > 0 {
		fail("%d committed events are not in Kafka; first: %s", rep.EventsLost, strings.Join(rep.LostExamples, "; "))
	}
}

// checkDeadLetters accepts on the dead-letter topic only copies of events
// the suite wrote oversize on purpose, each with a non-empty error header,
// and adds them to copies. Any other dead-lettered record fails the run:
// transient failures must never be dead-lettered.
func (r *run) checkDeadLetters(rep *Report, dlq []copyRec, byID map[string]*event, copies map[string][]copyRec, fail func(string, ...any)) {
	rep.DeadLettered = len(dlq)
	bad := func(format string, args ...any) {
		rep.DeadLetteredUnexpected++
		if len(rep.DeadLetterExamples) < 10 {
			rep.DeadLetterExamples = append(rep.DeadLetterExamples, fmt.Sprintf(format, args...))
		}
	}
	for _, c := range dlq {
		e := byID[c.ID]
		switch {
		case e == nil:
			bad("%s/%d@%d id %q key %s (error %q) is no committed event", c.Topic, c.Partition, c.Offset, c.ID, c.Key, c.Err)
		case !e.Oversize:
			bad("%s/%d@%d is event %s (%s seq %d), which was not written oversize (error %q)", c.Topic, c.Partition, c.Offset, c.ID, e.Agg, e.Seq, c.Err)
		case !c.HasErr || strings.TrimSpace(c.Err) == "":
			bad("%s/%d@%d is oversize event %s but has no error header", c.Topic, c.Partition, c.Offset, c.ID)
		case c.Key != e.Agg || c.Seq != e.Seq:
			bad("%s/%d@%d (key %s seq %d) does not match oversize event %s (%s seq %d)", c.Topic, c.Partition, c.Offset, c.Key, c.Seq, c.ID, e.Agg, e.Seq)
		default:
			rep.DeadLetteredIntended++
			copies[c.ID] = append(copies[c.ID], c)
		}
	}
	if rep.DeadLetteredUnexpected > 0 {
		fail("%d unexpected records on the dead-letter topic %s (only events written oversize on purpose may be dead-lettered; transient failures never); first: %s",
			rep.DeadLetteredUnexpected, r.dlq, strings.Join(rep.DeadLetterExamples, "; "))
	}
}
