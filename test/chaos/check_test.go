package chaos

import (
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
	// Txn and TxnPart are the headers of a transaction exactly_once
	// committed in parts (largetxn_test.go).
	Txn     string `json:",omitempty"`
	TxnPart string `json:",omitempty"`
}

// checked is what check found: the report, the failures the run had not
// reported yet (the test reports them) and notes for the log.
type checked struct {
	Report *Report
	Errors []string
	Notes  []string
}

// check runs every check over o. It reads nothing but o.
func (o *observation) check() checked {
	var v checked
	rep := &Report{FaultsByKind: map[string]int{}, FaultsByClass: map[string]int{}, RecoveryByKind: map[string]recovery{},
		DuplicatesByIncarnation: map[string]int{}, SlackMillis: consumeSlack.Milliseconds()}
	v.Report = rep
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		rep.Failures = append(rep.Failures, msg)
		v.Errors = append(v.Errors, msg)
	}
	o.summarize(rep)
	events := slices.Clone(o.Events)
	byID := make(map[string]*event, len(events))
	for i := range events {
		if byID[events[i].ID] != nil {
			fail("writer bookkeeping: event %s recorded twice", events[i].ID)
		}
		byID[events[i].ID] = &events[i]
	}
	o.checkTable(rep, byID, fail)

	if o.ReadErr != "" {
		fail("read topics: %v", o.ReadErr)
	}
	recs, dlq := slices.Clone(o.Records), slices.Clone(o.DeadLetters)
	rep.RecordsInKafka = len(recs)
	recs = o.withCompacted(rep, recs)
	rep.EventsUndone = len(o.Undone)
	recs, dlq = dropUndone(rep, recs, o.Undone), dropUndone(rep, dlq, o.Undone)
	copies := o.copiesOf(rep, recs, dlq, byID, fail)
	o.checkParking(rep, recs, dlq, byID, copies, fail)
	dead := deadLettered(dlq)
	checkLoss(rep, o.withoutSlotLost(rep, events, copies, byID, dead), copies, o.Redrive.Lost, fail)
	o.checkRetention(rep, copies, fail)
	rep.Slow = o.slowCounts(events)
	v.Notes = append(v.Notes, rep.Slow.String())
	if note := o.checkSecondSlot(rep, fail); note != "" {
		v.Notes = append(v.Notes, note)
	}

	o.noteBackfills(rep)
	dead.add(byID, o.Redrive.Lost, o.Redrive.Republished)
	o.checkOrder(rep, recs, dead, fail)
	o.checkDuplicates(rep, o.withoutRedriven(rep, copies), byID, fail)
	eoRecs, eoCopies := o.withoutReadBackCopies(rep, recs, copies, byID)
	o.checkExactlyOnce(rep, eoRecs, eoCopies, byID, dead, fail)
	v.Notes = append(v.Notes, o.checkLargeTxns(rep, recs, fail)...)
	o.checkWatermark(rep, events, copies, fail)
	o.recoveries(rep, events)
	rep.Verify = o.checkVerify(repairedLost(recs, o.Redrive.Lost), fail)

	for _, f := range o.Faults {
		rep.Faults = append(rep.Faults, faultJSON{Kind: f.Kind, Start: f.Start.Format("15:04:05.000"),
			Seconds: round2(f.End.Sub(f.Start).Seconds()), Detail: f.Detail, ExpectedExit: f.ExpectedExit,
			FirstDelivery: f.FirstDelivery.Milliseconds(), CaughtUp: f.CaughtUp.Milliseconds(), Measured: f.Measured})
	}
	rep.Pass = len(rep.Failures) == 0 && !o.Failed
	return v
}

// summarize fills the report's counts of the writers and the faults, and
// the failures the fault phase reported already.
func (o *observation) summarize(rep *Report) {
	rep.EventsWritten = len(o.Events)
	for _, e := range o.Events {
		if e.Message {
			rep.MessageEvents++
		}
	}
	rep.Transactions = o.Writers.Txns
	rep.WriterRetries = o.Writers.Retries
	rep.UnknownCommits = o.Writers.Unknown
	rep.UnknownCommitted = o.Writers.UnknownWon
	for _, f := range o.Faults {
		rep.FaultsByKind[f.Kind]++
		rep.FaultsByClass[faultClass(f.Kind)]++
		rep.ConnectorKills += f.Kills
	}
	rep.SkippedKinds = o.Skipped
	rep.FaultsTotal = len(o.Faults)
	rep.ExpectedExits = o.ExpectedExits
	rep.OpsFailures = o.OpsFailures
	for _, f := range o.OpsFailures {
		rep.Failures = append(rep.Failures, "operations: "+strings.SplitN(f, "\n", 2)[0])
	}
	rep.WriterRefusedCol = o.Writers.UndefinedColumn
	rep.UnexpectedExits = o.Exits
	rep.HangingAborted = o.Runbooks
	rep.Hangs = o.Hangs
	for _, h := range o.Hangs {
		rep.Failures = append(rep.Failures, "hang: "+h)
	}
	for _, e := range o.Exits {
		rep.Failures = append(rep.Failures, "unexpected exit: "+strings.SplitN(e, "\n", 2)[0])
	}
}

// checkTable: the table is the ground truth of what committed.
func (o *observation) checkTable(rep *Report, byID map[string]*event, fail func(string, ...any)) {
	if o.TableErr != "" {
		fail("read outbox table: %v", o.TableErr)
	}
	for id, row := range o.Table {
		e := byID[id]
		if e == nil {
			rep.TableMismatches++
			fail("row %s (%s seq %d) is in the table but no writer counted it committed", id, row.Agg, row.Seq)
		} else if e.Agg != row.Agg || e.Seq != row.Seq {
			rep.TableMismatches++
			fail("row %s is %s seq %d in the table, %s seq %d for its writer", id, row.Agg, row.Seq, e.Agg, e.Seq)
		}
	}
	if o.TableErr == "" {
		for id, e := range byID {
			if _, ok := o.Table[id]; !ok && !e.Message { // a table-less event has no row
				rep.TableMismatches++
				fail("event %s (%s seq %d) counted committed but not in the table", id, e.Agg, e.Seq)
			}
		}
	}
}

// copiesOf are the copies per event, in partition order; the dead-letter
// copies of the events written oversize on purpose count as their delivery.
func (o *observation) copiesOf(rep *Report, recs, dlq []copyRec, byID map[string]*event, fail func(string, ...any)) map[string][]copyRec {
	copies := map[string][]copyRec{}
	createTime := 0
	for _, c := range dlq {
		if !c.LogAppend {
			createTime++
		}
	}
	o.checkDeadLetters(rep, dlq, byID, copies, fail)
	for _, c := range recs {
		if !c.LogAppend {
			createTime++
		}
		e := byID[c.ID]
		if e != nil && e.Oversize && !o.Redrive.Republished[c.ID] { // a redrive republishes it with the limit raised
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
		if c.Key != e.Agg || c.Topic != o.Prefix+"."+e.Type || c.Seq != e.Seq {
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
	return copies
}

// backfillLine is how a connector process says it publishes (begins to:
// a stop can cut the repair) or published rows of a publication gap from
// the table.
var backfillLine = regexp.MustCompile(`(?i)publish(ed|ing) the rows written while|backfill`)

// noteBackfills marks the processes that published rows of a publication
// gap from the table (their log lines) and lists what each said.
func (o *observation) noteBackfills(rep *Report) {
	for _, in := range o.Incarnations {
		for _, l := range o.BackfillLines[in.N] {
			in.Backfilled = true
			if _, rest, ok := strings.Cut(l, "msg="); ok {
				l = rest
			}
			rep.Backfills = append(rep.Backfills, fmt.Sprintf("#%d (%s): %s", in.N, in.Reason, l))
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
func (o *observation) withoutRedriven(rep *Report, copies map[string][]copyRec) map[string][]copyRec {
	out := make(map[string][]copyRec, len(copies))
	for id, cs := range copies {
		redriven, lost := o.Redrive.Republished[id], o.Redrive.Lost[id] != ""
		if !redriven && !lost {
			out[id] = cs
			continue
		}
		// The original of a lost event is its first parked copy (the
		// parking topic has one partition); retention can delete the copy
		// parked again too, once a redrive delivered it.
		orig := -1
		for i, c := range cs {
			if c.Topic == o.ParkingTopic && (orig < 0 || c.Offset < cs[orig].Offset) {
				orig = i
			}
		}
		reparked, repaired := false, false
		for i, c := range cs {
			aside := c.Topic == o.ParkingTopic || c.Topic == o.DLQ
			switch {
			case redriven && !aside:
				rep.Redriven++
			case lost && i != orig && aside && !reparked:
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
func (o *observation) checkDeadLetters(rep *Report, dlq []copyRec, byID map[string]*event, copies map[string][]copyRec, fail func(string, ...any)) {
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
			rep.DeadLetteredUnexpected, o.DLQ, strings.Join(rep.DeadLetterExamples, "; "))
	}
}
