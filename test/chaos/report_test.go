package chaos

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

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
	// LargeTxns: the large-transaction kinds' transactions (largetxn_test.go).
	LargeTxns *largeTxnReport `json:"large_transactions,omitempty"`
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
	if lr := rep.LargeTxns; lr != nil {
		lines = append(lines, lr.String())
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
