package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// statusOpts is outbox-cdc status.
type statusOpts struct {
	json bool
	lsn  lsnFlag
}

// Status is what `outbox-cdc status --json` prints.
type Status struct {
	Slot             string   `json:"slot"`
	Exists           bool     `json:"exists"`
	Active           bool     `json:"active"`
	ActivePID        int32    `json:"active_pid,omitempty"`
	ConfirmedLSN     lsn.LSN  `json:"confirmed_lsn"`
	RestartLSN       lsn.LSN  `json:"restart_lsn"`
	CurrentWALLSN    lsn.LSN  `json:"current_wal_lsn"`
	LagBytes         int64    `json:"lag_bytes"` // SlotInfo.LagBytes, as outbox_cdc_replication_lag_bytes
	RetainedWALBytes int64    `json:"retained_wal_bytes"`
	WALStatus        string   `json:"wal_status"`
	Checkpoint       *lsn.LSN `json:"checkpoint_lsn"`
	CheckpointAt     string   `json:"checkpoint_at,omitempty"`
	OldestReplayable lsn.LSN  `json:"oldest_replayable_lsn"`
	Covers           *bool    `json:"replay_window_covers,omitempty"`
	// Failover is nil when the slot or the reading is missing.
	Failover *FailoverStatus `json:"failover,omitempty"`
	// Tables are the outbox tables (outbox.table or outbox.tables, tables.go).
	Tables []TableStatus `json:"tables"`
}

// FailoverStatus is whether a standby can take the slot over
// (replication.FailoverState, the outbox_cdc_slot_failover_ready gauge).
type FailoverStatus struct {
	SlotFailover bool     `json:"slot_failover"`
	StandbySlots []string `json:"synchronized_standby_slots"`
	Active       []string `json:"active_standby_slots"`
	Ready        bool     `json:"ready"`
	Problem      string   `json:"problem,omitempty"`
	Fix          string   `json:"fix,omitempty"`
}

func (o *statusOpts) register(fs *flag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print JSON")
	fs.Var(&o.lsn, "lsn", "report whether the replay window covers this LSN")
}

func (*statusOpts) problem() string { return "" }

func (o *statusOpts) run(ctx context.Context, e env) int {
	cfg, pc, stdout, stderr := e.cfg, e.pc, e.stdout, e.stderr
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st := Status{Slot: cfg.Postgres.Slot}
	info, err := pc.Source.DB.Slot(ctx, cfg.Postgres.Slot)
	switch {
	case errors.Is(err, replication.ErrNoSlot):
	case err != nil:
		fmt.Fprintf(stderr, "outbox-cdc status: %v\n", err)
		return ExitFailure
	default:
		st.Exists, st.Active, st.ActivePID = true, info.Active, info.ActivePID
		st.ConfirmedLSN, st.RestartLSN, st.CurrentWALLSN = info.Confirmed, info.Restart, info.CurrentWAL
		st.LagBytes, st.RetainedWALBytes, st.WALStatus = info.LagBytes(), info.RetainedBytes(), info.WALStatus
		// Transactions whose commit lies at or after the confirmed position are
		// still decodable from the slot (replay starts there).
		st.OldestReplayable = info.Confirmed
		if f, err := pc.Source.DB.Failover(ctx, cfg.Postgres.Slot); err != nil {
			fmt.Fprintf(stderr, "outbox-cdc status: %v\n", err)
		} else {
			problem, fix := f.Problem(cfg.Postgres.Slot)
			st.Failover = &FailoverStatus{SlotFailover: f.SlotFailover, StandbySlots: f.StandbySlots, Active: f.Active,
				Ready: f.Ready(), Problem: problem, Fix: fix}
		}
	}
	if pc.Checkpoints != nil {
		c, err := pc.Checkpoints.Load(ctx)
		pc.Checkpoints.Close()
		switch {
		case err == nil:
			st.Checkpoint, st.CheckpointAt = &c.LSN, c.UpdatedAt.UTC().Format(time.RFC3339)
		case !errors.Is(err, offsets.ErrNoCheckpoint):
			fmt.Fprintf(stderr, "outbox-cdc status: %v\n", err)
		}
	}
	st.Tables = tablesStatus(ctx, pc.Source)
	if o.lsn.LSN != 0 {
		covers := st.Exists && st.WALStatus != "lost" && o.lsn.LSN >= st.OldestReplayable
		st.Covers = &covers
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	} else {
		printStatus(stdout, st, o.lsn.LSN)
	}
	if !st.Exists {
		return ExitFailure
	}
	return ExitOK
}

func printStatus(w io.Writer, st Status, want lsn.LSN) {
	if !st.Exists {
		fmt.Fprintf(w, "slot %s: does not exist (run creates it)\n", st.Slot)
		return
	}
	active := "inactive"
	if st.Active {
		active = fmt.Sprintf("active (pid %d)", st.ActivePID)
	}
	fmt.Fprintf(w, "slot            %s, %s, wal_status %s\n", st.Slot, active, st.WALStatus)
	fmt.Fprintf(w, "confirmed LSN   %v\nrestart LSN     %v\ncurrent WAL     %v\n", st.ConfirmedLSN, st.RestartLSN, st.CurrentWALLSN)
	fmt.Fprintf(w, "lag             %s\nretained WAL    %s\n", bytesText(st.LagBytes), bytesText(st.RetainedWALBytes))
	if st.Checkpoint != nil {
		fmt.Fprintf(w, "checkpoint      %v (saved %s)\n", *st.Checkpoint, st.CheckpointAt)
	} else {
		fmt.Fprintln(w, "checkpoint      none")
	}
	fmt.Fprintf(w, "replayable from %v\n", st.OldestReplayable)
	printTables(w, st.Tables)
	if f := st.Failover; f != nil {
		standby := "none"
		if len(f.StandbySlots) > 0 {
			standby = fmt.Sprintf("%s (active: %s)", strings.Join(f.StandbySlots, ", "), orNone(f.Active))
		}
		fmt.Fprintf(w, "failover slot   %v, synchronized_standby_slots %s\n", f.SlotFailover, standby)
		if f.Ready {
			fmt.Fprintln(w, "failover ready  yes: a standby synchronizes the slot and receives its changes first")
		} else {
			fmt.Fprintf(w, "failover ready  no: %s; %s\n", f.Problem, f.Fix)
		}
	}
	if st.Covers != nil {
		fmt.Fprintf(w, "covers %v       %v\n", want, *st.Covers)
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB (%d bytes)", float64(n)/(1<<30), n)
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB (%d bytes)", float64(n)/(1<<20), n)
	}
	return fmt.Sprintf("%d bytes", n)
}
