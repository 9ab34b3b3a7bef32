package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
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

// Report is what a run found; it is written to results/last-run.json.
type Report struct {
	Mode         string  `json:"mode"`
	Seed         uint64  `json:"seed"`
	Pass         bool    `json:"pass"`
	WallSeconds  float64 `json:"wall_seconds"`
	ChaosSeconds float64 `json:"chaos_seconds"`

	EventsWritten    int   `json:"events_written"`
	MessageEvents    int   `json:"table_less_events_written"` // of EventsWritten (messages_test.go)
	Transactions     int64 `json:"transactions"`
	WriterRetries    int64 `json:"writer_retries"`
	UnknownCommits   int64 `json:"commits_with_unknown_outcome"`
	UnknownCommitted int64 `json:"unknown_outcomes_found_committed"`
	RecordsInKafka   int   `json:"records_in_kafka"`

	FaultsTotal    int            `json:"faults_total"`
	FaultsByKind   map[string]int `json:"faults_by_kind"`
	FaultsByClass  map[string]int `json:"faults_by_class"`
	SkippedKinds   []string       `json:"fault_kinds_skipped,omitempty"`
	ConnectorKills int            `json:"connector_kills"`
	// Operations faults: the exits they required (exit 1 and the message)
	// and what went wrong with them.
	ExpectedExits    []string `json:"connector_expected_exits,omitempty"`
	OpsFailures      []string `json:"operations_failures,omitempty"`
	WriterRefusedCol int64    `json:"writer_attempts_refused_missing_column"`

	EventsLost        int      `json:"events_lost"`
	LostExamples      []string `json:"lost_examples,omitempty"`
	TableMismatches   int      `json:"table_vs_writers_mismatches"`
	UnexpectedRecords int      `json:"unexpected_records"`
	DeadLettered      int      `json:"dead_lettered"`
	// DeadLetteredIntended are copies of events written oversize on
	// purpose (ops-oversize); every other dead-lettered record fails.
	DeadLetteredIntended   int      `json:"dead_lettered_intended_oversize"`
	DeadLetteredUnexpected int      `json:"dead_lettered_unexpected"`
	DeadLetterExamples     []string `json:"dead_letter_examples,omitempty"`
	OversizeEvents         int      `json:"oversize_events_written"`
	OrderViolations        int      `json:"order_violations"`
	OrderExamples          []string `json:"order_examples,omitempty"`
	// FirstCopyOrderViolations (diagnosis): first copies of an aggregate's
	// events that skip a seq, i.e. new events out of order, not replays.
	FirstCopyOrderViolations int            `json:"order_violations_among_first_copies"`
	OrderViolationsByProcess map[string]int `json:"order_violations_by_process,omitempty"`

	Duplicates              int            `json:"duplicate_copies"`
	DuplicatesAfterKills    int            `json:"duplicates_after_connector_kills"`
	MaxDuplicatesPerKill    int            `json:"max_duplicates_per_connector_kill"`
	InProcessDuplicates     int            `json:"duplicates_within_one_process"`
	InProcessExamples       []string       `json:"duplicates_within_one_process_examples,omitempty"`
	DuplicatesByIncarnation map[string]int `json:"duplicates_by_incarnation,omitempty"`
	DupsBelowConfirmed      int            `json:"duplicates_below_confirmed_position"`
	DupsBelowCheckpoint     int            `json:"duplicates_below_checkpoint"`
	DupsBelowEarlierSample  int            `json:"duplicates_below_a_position_confirmed_before"`
	DupExamples             []string       `json:"duplicate_violation_examples,omitempty"`
	// Copies sent by a process that published rows of a publication gap
	// from the table (started after ops-publication-gap, or its log says it
	// backfilled): allowed, not held to the two "below" rules above.
	GapBackfillDuplicates     int      `json:"duplicates_after_publication_gap"`
	Backfills                 []string `json:"gap_backfills,omitempty"`
	GapBackfillBelowConfirmed int      `json:"duplicates_after_publication_gap_below_start_position"`
	KillsAfterAck             int      `json:"kills_after_ack"`
	KillsBeforeConfirm        int      `json:"kills_after_ack_before_confirmation"`
	KillsInAckWindow          int      `json:"kills_between_an_ack_and_its_confirmation"`
	MaxResentAckedAge         int64    `json:"max_ms_an_event_resent_after_a_kill_had_been_appended"`
	AckedResent               int      `json:"events_acked_before_a_kill_and_resent"`

	WatermarkSamples          int      `json:"watermark_samples"`
	WatermarkSamplesKafkaDown int      `json:"watermark_samples_while_kafka_unreachable"`
	WatermarkChecks           int      `json:"watermark_checks"`
	WatermarkViolations       int      `json:"watermark_violations"`
	WatermarkExamples         []string `json:"watermark_examples,omitempty"`
	ConsumerViolations        int      `json:"consumer_check_violations"`
	ConsumerLateChecks        int      `json:"consumer_late_checks_excused_by_append_time"`
	ConsumerLateOutsideOutage int      `json:"consumer_late_checks_outside_kafka_outages"`
	ConsumerLagP50Millis      int64    `json:"consumer_lag_after_append_p50_ms"`
	ConsumerLagP99Millis      int64    `json:"consumer_lag_after_append_p99_ms"`
	ConsumerLagMaxMillis      int64    `json:"consumer_lag_after_append_max_ms"`
	ConfirmLagP50Millis       int64    `json:"confirm_lag_after_append_p50_ms"`
	ConfirmLagP99Millis       int64    `json:"confirm_lag_after_append_p99_ms"`
	ConfirmLagMaxMillis       int64    `json:"confirm_lag_after_append_max_ms"`
	SlackMillis               int64    `json:"consume_slack_ms"`

	LongestFirstDelivery recovery            `json:"longest_recovery_first_delivery"`
	LongestCaughtUp      recovery            `json:"longest_recovery_caught_up"`
	RecoveryByKind       map[string]recovery `json:"longest_caught_up_by_kind"`
	UnmeasuredRecoveries int                 `json:"recoveries_not_measured_next_fault_too_soon"`

	UnexpectedExits []string `json:"connector_unexpected_exits,omitempty"`
	// HangingAborted: stops on a hanging transaction and the suite's abort
	// (the connector's runbook, hanging_test.go).
	HangingAborted []string `json:"hanging_transactions_aborted,omitempty"`
	Hangs          []string `json:"hangs,omitempty"`
	Failures       []string `json:"failures,omitempty"`

	Faults       []faultJSON `json:"faults"`
	Incarnations []incJSON   `json:"connector_processes"`

	// Parked copies (dlq.mode quarantine) and violations of the per-key
	// order across the topic, the dead-letter and the parking topics.
	Parked               int `json:"parked"`
	QuarantineViolations int `json:"quarantine_order_violations"`
	// ParkedDeleted: parked records retention deleted (ops-parking-retention);
	// LostToRetention: events whose only copies those were, each named by
	// the refused redrive (LostToRetentionIDs: id and offset); Redriven:
	// copies republished by a redrive, not held to the duplicate rules.
	ParkedDeleted   int `json:"parked_deleted_by_retention"`
	LostToRetention int `json:"lost_to_retention_named_by_redrive"`
	// RepairedAfterRetention: copies of events lost to parking retention
	// that a later verify --repair republished (left out of the order check).
	RepairedAfterRetention int      `json:"copies_repaired_after_retention"`
	LostToRetentionIDs     []string `json:"lost_to_retention,omitempty"`
	Redriven               int      `json:"redriven_copies"`
	// ExactlyOnce holds the exactly_once run's checks (eos_test.go).
	ExactlyOnce *eosReport `json:"exactly_once,omitempty"`
	// GapReplayJumps: delivered events replayed, by a process started after
	// a publication gap, with the gap's rows (never in the WAL) left out.
	GapReplayJumps int `json:"gap_replay_jumps,omitempty"`
	// LostSlotRepairJumps: order breaks of a lost slot's rows republished
	// by its verify --repair (LostSlotRepairs: each run; lostorder_test.go).
	LostSlotRepairJumps int      `json:"lost_slot_repair_jumps,omitempty"`
	LostSlotRepairs     []string `json:"lost_slot_repairs,omitempty"`
	// Verify is outbox-cdc verify over the run, after the last stop.
	Verify *verifyJSON `json:"verify,omitempty"`
	// Retention: the rows outbox.retention deleted (retention_test.go);
	// SecondSlot: the second logical slot's checks (secondslot_test.go);
	// Slow: the backdated rows and held transactions (slow_test.go).
	Retention  *retentionReport  `json:"retention,omitempty"`
	SecondSlot *secondSlotReport `json:"second_slot,omitempty"`
	Slow       *slowReport       `json:"backdated_and_held,omitempty"`
	// SlotLostMessages: table-less events a lost slot took (no row to
	// repair them from; lostslot_test.go).
	SlotLostMessages []string `json:"table_less_events_lost_with_a_slot,omitempty"`
	// Events a restore or a promotion undid (restore_test.go), and their
	// copies in Kafka: expected, neither lost nor unexpected records.
	EventsUndone int `json:"events_undone_by_restore_or_promotion"`
	UndoneCopies int `json:"records_of_undone_events"`
	// Compaction: the compacted topic of pg-restore-compacted.
	Compaction *compactionReport `json:"compaction,omitempty"`
}

type recovery struct {
	Millis int64  `json:"ms"`
	Fault  string `json:"fault,omitempty"`
	At     string `json:"at,omitempty"`
}

type faultJSON struct {
	Kind          string  `json:"kind"`
	Start         string  `json:"start"`
	Seconds       float64 `json:"seconds"`
	Detail        string  `json:"detail"`
	ExpectedExit  string  `json:"expected_exit,omitempty"`
	FirstDelivery int64   `json:"first_delivery_ms"`
	CaughtUp      int64   `json:"caught_up_ms"`
	Measured      bool    `json:"measured"`
}

type incJSON struct {
	N           int    `json:"n"`
	Reason      string `json:"reason"`
	Start       string `json:"start"`
	ReadyMillis int64  `json:"ready_ms"`
	SlotAtStart string `json:"slot_confirmed_at_start"`
	CkptAtStart string `json:"checkpoint_at_start"`
	Duplicates  int    `json:"duplicates"`
	// ResentAckedAge is, for a process started after a kill, the longest
	// time an event it sent again had been in the broker's log when the
	// process that first sent it died: how long an acknowledged event
	// stayed unconfirmed.
	ResentAckedAge int64 `json:"resent_oldest_appended_ms_before_kill,omitempty"`
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

// tableRow is an outbox row the database holds: in its table, or deleted
// by retention (deleted: when; tbl: which table, for those only).
type tableRow struct {
	agg     string
	seq     int
	tbl     string
	deleted time.Time
}

func readTable(ctx context.Context, dsn string) (map[string]tableRow, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	// Rows in the tables first: a deletion record never hides one.
	rows, err := conn.Query(ctx, `SELECT id::text, aggregate_id, (payload->>'seq')::int, NULL::timestamptz, '' FROM outbox`+secondTableRows+deletedRows)
	if err != nil {
		return nil, err
	}
	out := map[string]tableRow{}
	for rows.Next() {
		var id string
		var r tableRow
		var deleted *time.Time
		if err := rows.Scan(&id, &r.agg, &r.seq, &deleted, &r.tbl); err != nil {
			return nil, err
		}
		if deleted != nil {
			if _, ok := out[id]; ok {
				continue
			}
			r.deleted = *deleted
		}
		out[id] = r
	}
	return out, rows.Err()
}

// readAll reads every partition of topics and dlq up to its end offset.
func readAll(ctx context.Context, topics []string, dlq string) (recs, dead []copyRec, err error) {
	cl, err := newKafkaClient()
	if err != nil {
		return nil, nil, err
	}
	all := append(slices.Clone(topics), dlq)
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, all...)
	cl.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("end offsets: %w", err)
	}
	parts := map[string]map[int32]kgo.Offset{}
	remaining := map[string]map[int32]int64{} // topic → partition → end offset
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset <= 0 {
			return
		}
		if parts[o.Topic] == nil {
			parts[o.Topic] = map[int32]kgo.Offset{}
			remaining[o.Topic] = map[int32]int64{}
		}
		parts[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		remaining[o.Topic][o.Partition] = o.Offset
	})
	if len(parts) == 0 {
		return nil, nil, nil
	}
	cl, err = newKafkaClient(append([]kgo.Opt{kgo.ConsumePartitions(parts), kgo.FetchMaxBytes(64 << 20)}, isolation()...)...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	left := 0
	for _, ps := range remaining {
		left += len(ps)
	}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("read topics: %d partitions not read to the end: %w", left, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Attrs.IsControl() { // a transaction marker (exactly_once run): it only counts toward the end
				if end, ok := remaining[r.Topic][r.Partition]; ok && r.Offset >= end-1 {
					delete(remaining[r.Topic], r.Partition)
					left--
				}
				return
			}
			c := toCopy(r)
			if r.Topic == dlq {
				dead = append(dead, c)
			} else {
				recs = append(recs, c)
			}
			if end, ok := remaining[r.Topic][r.Partition]; ok && r.Offset >= end-1 {
				delete(remaining[r.Topic], r.Partition)
				left--
			}
		})
	}
	sort.Slice(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return recs, dead, nil
}

// toCopy is r as the checks see it.
func toCopy(r *kgo.Record) copyRec {
	c := copyRec{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
		Producer: r.ProducerID, Epoch: r.ProducerEpoch, Append: r.Timestamp}
	c.ID, _ = header(r, "id")
	c.Err, c.HasErr = header(r, "error")
	c.LogAppend = r.Attrs.TimestampType() == 1
	var v struct{ Seq int }
	if json.Unmarshal(r.Value, &v) == nil {
		c.Seq = v.Seq
	}
	return c
}

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
func (r *run) checkOrder(rep *Report, recs []copyRec, dead deadSeqs, fail func(string, ...any)) {
	type state struct {
		topic     string
		partition int32
		last, max int
	}
	st := map[string]*state{}
	proc := processOf(r.conn.incarnations(), recs)
	// A process started after a publication gap may replay across it
	// without the gap's record (ops-foreign-checkpoint deleted the
	// checkpoint that held it): the gap's rows were never in the WAL
	// stream, so its replay of delivered events jumps over them.
	var gapAt time.Time
	for _, f := range r.faults {
		if gapKind(f.Kind) {
			gapAt = f.Start
			break
		}
	}
	of := incarnationOf(r.conn.incarnations(), recs)
	replaysAcrossGap := func(c copyRec) bool {
		in := of(c)
		return !gapAt.IsZero() && in != nil && in.Start.After(gapAt)
	}
	repaired := r.repairOrder(rep, recs, fail) // lostorder_test.go
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
		if r.rd.lost[c.ID] != "" {
			// An event lost to parking retention has a copy only if a
			// verify --repair (a runbook's) republished it later: late by
			// design, it is not held to the order.
			rep.RepairedAfterRetention++
			if r.repairedLost == nil {
				r.repairedLost = map[string]bool{}
			}
			r.repairedLost[c.ID] = true // verify_test.go: not missing
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
		switch {
		case c.Seq == dead.next(c.Key, s.last):
		case c.Seq <= s.last && c.Seq >= 1:
			// A replay restarting at an event already delivered (every seq
			// up to last has been seen); it must then continue +1.
		case repaired.excuses(c, dead):
			// A lost slot's rows, republished late and in table order.
			rep.LostSlotRepairJumps++
		case c.Seq <= s.max && replaysAcrossGap(c):
			// A replay of delivered events over the rows of a gap (above).
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

// checkDuplicates attributes every extra copy to the connector process
// that produced it (by producer id) and checks that a process only resent
// events after the position the slot had confirmed when it started.
func (r *run) checkDuplicates(rep *Report, copies map[string][]copyRec, byID map[string]*event, fail func(string, ...any)) {
	incs := r.conn.incarnations()
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
	for _, f := range r.faults {
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
	samples := r.samp.all()
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
						id, e.Agg, e.Seq, cs[0].Append.Format("15:04:05.000"), c.Append.Format("15:04:05.000"), r.faultAt(c.Append)))
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
	for _, f := range r.faults {
		if f.AckEvent == "" {
			continue
		}
		rep.KillsAfterAck++
		if len(copies[f.AckEvent]) > 1 {
			rep.KillsBeforeConfirm++
		}
	}
}

// checkWatermark: for every sample (T, C) of the slot's confirmed position
// and of the checkpoint, every event whose post-commit LSN is ≤ C must
//
//   - have a copy the broker appended by T (LogAppendTime, no slack): a
//     failure is a violation of guarantee 3;
//   - have been consumed by the live consumer by T + consumeSlack; a miss is
//     excused (and counted) only when the broker had appended the event by
//     T, i.e. the broker died or was cut off between acknowledging the
//     record and serving it to the consumer.
func (r *run) checkWatermark(rep *Report, events []event, copies map[string][]copyRec, fail func(string, ...any)) {
	seen := r.live.snapshot()
	samples := r.samp.all()
	rep.WatermarkSamples = len(samples)
	for _, s := range samples {
		if r.inKafkaOutage(s.T) {
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
	for _, ep := range r.walEpochs(events, samples) {
		r.watermarkEpoch(rep, ep.events, ep.samples, copies, seen, reported, &clags)
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
func (r *run) watermarkEpoch(rep *Report, events []event, samples []sample, copies map[string][]copyRec, seen map[string]time.Time,
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
			if cs := copies[e.ID]; len(cs) > 0 && !r.inFault(cs[0].Append) && !r.inFault(s.T) {
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
			if !r.inKafkaOutage(s.T) {
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
func (r *run) inKafkaOutage(t time.Time) bool {
	for _, f := range r.faults {
		if kafkaUnreachable(f.Kind) && !t.Before(f.Start) && !t.After(f.End) {
			return true
		}
	}
	return false
}

// inFault reports whether t lies in a fault or the second after it.
func (r *run) inFault(t time.Time) bool {
	for _, f := range r.faults {
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
	case fKafkaKill, fKafkaKillCommit, fKafkaStop, fNetKafkaDrop, fNetKafkaStall:
		return true
	}
	return false
}

// recoveries measures, for each fault, the time from its end to the first
// event consumed that had not been consumed before, and to every event
// committed before its end being consumed.
func (r *run) recoveries(rep *Report, events []event) {
	seen := r.live.snapshot()
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
	for i := range r.faults {
		f := &r.faults[i]
		j := sort.Search(len(times), func(k int) bool { return times[k].After(f.End) })
		if j < len(times) {
			f.FirstDelivery = times[j].Sub(f.End)
		}
		k := sort.Search(len(evs), func(k int) bool { return evs[k].Committed.After(f.End) })
		if k > 0 && prefix[k-1].After(f.End) {
			f.CaughtUp = prefix[k-1].Sub(f.End)
		}
		next := time.Now()
		if i+1 < len(r.faults) {
			next = r.faults[i+1].Start
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

// report logs the summary and writes it as JSON.
func (r *run) report(rep *Report) {
	t := r.t
	kinds := make([]string, 0, len(rep.FaultsByKind))
	for _, k := range allFaults {
		if n := rep.FaultsByKind[k]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		}
	}
	var classList []string
	for _, c := range []string{"connector", "kafka", "postgres", "network", "operations"} {
		classList = append(classList, fmt.Sprintf("%s=%d", c, rep.FaultsByClass[c]))
	}
	classes := strings.Join(classList, " ")
	skipped := "none"
	if len(rep.SkippedKinds) > 0 {
		skipped = strings.Join(rep.SkippedKinds, ",")
	}
	lines := []string{
		fmt.Sprintf("mode %s, seed %d, pass %v, wall %.1fs (fault phase %.1fs)", rep.Mode, rep.Seed, rep.Pass, rep.WallSeconds, rep.ChaosSeconds),
		fmt.Sprintf("events written %d in %d transactions (writer retries %d, unknown commit outcomes %d of which committed %d); records in Kafka %d",
			rep.EventsWritten, rep.Transactions, rep.WriterRetries, rep.UnknownCommits, rep.UnknownCommitted, rep.RecordsInKafka),
		fmt.Sprintf("faults %d: %s", rep.FaultsTotal, strings.Join(kinds, " ")),
		fmt.Sprintf("faults by class: %s; skipped kinds: %s", classes, skipped),
		fmt.Sprintf("events lost %d; unexpected records %d; dead-lettered %d (%d intended oversize of %d written, %d unexpected); order violations %d (replays over a gap's rows %d, over a lost slot's rows %d); table/writer mismatches %d",
			rep.EventsLost, rep.UnexpectedRecords, rep.DeadLettered, rep.DeadLetteredIntended, rep.OversizeEvents, rep.DeadLetteredUnexpected, rep.OrderViolations, rep.GapReplayJumps, rep.LostSlotRepairJumps, rep.TableMismatches),
		fmt.Sprintf("operations: %d expected connector exits (exit 1 with the message), %d failed expectations; writer attempts refused for a missing column %d",
			len(rep.ExpectedExits), len(rep.OpsFailures), rep.WriterRefusedCol),
		fmt.Sprintf("duplicates %d: %d after %d connector kills (max %d per kill), %d within one process; of confirmed events: %d below the start position, %d below an earlier sample (below the checkpoint: %d)",
			rep.Duplicates, rep.DuplicatesAfterKills, rep.ConnectorKills, rep.MaxDuplicatesPerKill, rep.InProcessDuplicates, rep.DupsBelowConfirmed, rep.DupsBelowEarlierSample, rep.DupsBelowCheckpoint),
		fmt.Sprintf("duplicates sent by processes that backfilled a publication gap (allowed): %d, %d of them at or below the start position; %d backfills: %s",
			rep.GapBackfillDuplicates, rep.GapBackfillBelowConfirmed, len(rep.Backfills), strings.Join(rep.Backfills, "; ")),
		fmt.Sprintf("kills between a broker ack and its confirmation (an event appended before the kill was sent again): %d of %d, %d such events, the oldest appended %dms before its kill; burst kills: %d, %d of them before the burst's last event was confirmed",
			rep.KillsInAckWindow, rep.ConnectorKills, rep.AckedResent, rep.MaxResentAckedAge, rep.KillsAfterAck, rep.KillsBeforeConfirm),
		fmt.Sprintf("watermark: %d samples of slot and checkpoint (%d while Kafka was unreachable), %d checks; violations: %d against broker append time, %d against the live consumer (slack %v); %d consumer-late checks excused by append time (%d outside Kafka outages)",
			rep.WatermarkSamples, rep.WatermarkSamplesKafkaDown, rep.WatermarkChecks, rep.WatermarkViolations, rep.ConsumerViolations, consumeSlack, rep.ConsumerLateChecks, rep.ConsumerLateOutsideOutage),
		fmt.Sprintf("after broker append: live consumer saw it p50 %dms, p99 %dms, max %dms; slot confirmed it (outside faults, 50ms sampling) p50 %dms, p99 %dms, max %dms",
			rep.ConsumerLagP50Millis, rep.ConsumerLagP99Millis, rep.ConsumerLagMaxMillis, rep.ConfirmLagP50Millis, rep.ConfirmLagP99Millis, rep.ConfirmLagMaxMillis),
		fmt.Sprintf("longest recovery: first new delivery %dms (%s at %s), all caught up %dms (%s at %s); %d recoveries overlapped by the next fault",
			rep.LongestFirstDelivery.Millis, rep.LongestFirstDelivery.Fault, rep.LongestFirstDelivery.At,
			rep.LongestCaughtUp.Millis, rep.LongestCaughtUp.Fault, rep.LongestCaughtUp.At, rep.UnmeasuredRecoveries),
		fmt.Sprintf("connector processes %d, unexpected exits %d, hangs %d, stops on a hanging transaction (aborted by the suite, the runbook) %d", len(rep.Incarnations), len(rep.UnexpectedExits), len(rep.Hangs), len(rep.HangingAborted)),
		fmt.Sprintf("table-less events (messages) written %d; parked records %d (%d deleted by retention); lost to retention, named by the redrive's refusal: %d %v; copies republished by redrives %d, by a verify --repair after retention %d; quarantine order violations %d",
			rep.MessageEvents, rep.Parked, rep.ParkedDeleted, rep.LostToRetention, rep.LostToRetentionIDs, rep.Redriven, rep.RepairedAfterRetention, rep.QuarantineViolations),
		fmt.Sprintf("undone by a restore or a promotion: %d events, %d of their records in Kafka (expected, not counted as delivered or unexpected)",
			rep.EventsUndone, rep.UndoneCopies),
	}
	if er := rep.ExactlyOnce; er != nil {
		lines = append(lines, er.String())
	}
	if cr := rep.Compaction; cr != nil {
		lines = append(lines, cr.String())
	}
	if rr := rep.Retention; rr != nil {
		lines = append(lines, rr.String())
	}
	if v := rep.Verify; v != nil {
		lines = append(lines, fmt.Sprintf("verify over the run: exit %d, %d rows, %d found, %d missing, %.1fs %s",
			v.Exit, v.Rows, v.Found, v.Missing, v.Seconds, v.Error))
	}
	for _, l := range lines {
		t.Logf("chaos report: %s", l)
	}
	if err := os.MkdirAll("results", 0o755); err != nil {
		t.Errorf("results dir: %v", err)
		return
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	b = append(b, '\n')
	for _, name := range []string{"last-run.json", "last-run-" + rep.Mode + ".json"} {
		if err := os.WriteFile(filepath.Join("results", name), b, 0o644); err != nil {
			t.Errorf("write report: %v", err)
		}
	}
	if !rep.Pass {
		// Keep the evidence: the temp dir goes away with the test.
		if log, err := os.ReadFile(r.conn.logPath); err == nil {
			for _, in := range r.conn.incarnations() {
				if in.ownLog != "" { // a standby's, kept apart while it waited
					log = append(log, fmt.Sprintf("\n===== chaos: standby #%d's own log =====\n%s", in.N, r.conn.logOf(in.N))...)
				}
			}
			_ = os.WriteFile(filepath.Join("results", "last-run-connector.log"), log, 0o644)
		}
		t.Logf("chaos: connector log kept in results/last-run-connector.log")
	}
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// faultAt names the faults under way (or ended within 5s) at t, for the
// examples of a report.
func (r *run) faultAt(t time.Time) string {
	var kinds []string
	for _, f := range r.faults {
		if !t.Before(f.Start) && t.Before(f.End.Add(5*time.Second)) {
			kinds = append(kinds, f.Kind)
		}
	}
	if len(kinds) == 0 {
		return "no fault within 5s"
	}
	return strings.Join(kinds, ", ")
}
