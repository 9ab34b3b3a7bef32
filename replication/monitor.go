package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
)

// Monitor runs beside the stream: it writes the heartbeat and reads the
// slot's statistics (retained WAL, lag, WAL status, failover readiness). It
// is the one writer of those gauges.
type Monitor struct {
	Source Source
	// Standby: the server is a hot standby (it writes no WAL, and its own
	// slot is never a failover slot).
	Standby bool
	// Heartbeat is the interval of the non-transactional heartbeat message
	// (0: none).
	Heartbeat time.Duration
	// Interval is how often slot statistics are read.
	Interval time.Duration
	// RetainedWALWarn logs a warning above this many retained bytes.
	RetainedWALWarn int64
	Metrics         *metrics.Metrics
	Log             *slog.Logger
	// Fail stops the connector: the slot was dropped or invalidated.
	Fail func(error)

	warned bool
	fo     failoverReport
}

// Run writes heartbeats and reads the slot's statistics until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	var hb <-chan time.Time
	src := m.Source
	heartbeat := m.Heartbeat > 0
	if heartbeat && m.Standby && src.Primary == nil {
		// A standby writes no WAL: pg_logical_emit_message fails there.
		heartbeat = false
		m.Log.Warn("heartbeat disabled: the server is a standby and postgres.primary_dsn is not set; while the outbox is quiet "+
			"the slot does not advance, so the standby keeps WAL and the primary (hot_standby_feedback) keeps catalog rows "+
			"until the next outbox write", "fix", "set postgres.primary_dsn to the primary, where the heartbeat is written")
	}
	if heartbeat {
		t := time.NewTicker(m.Heartbeat)
		defer t.Stop()
		hb = t.C
	}
	stats := time.NewTicker(m.Interval)
	defer stats.Stop()
	beat := NewHeartbeat(src.Writer()) // the primary of a standby
	defer beat.Close()
	hbDenied := false
	m.slotStats(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-stats.C:
			m.slotStats(ctx)
		case <-hb:
			if hbDenied {
				continue
			}
			// Other failures are transient: the stream reports connection trouble.
			if errors.Is(beat.Beat(ctx), ErrHeartbeatDenied) {
				hbDenied = true
				m.Log.Error("heartbeat disabled: the role may not call pg_logical_emit_message; a database without other writes "+
					"will hold WAL until the outbox is written", "fix", "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <role>")
			}
		}
	}
}

// slotStats updates the slot metrics, warns about retained WAL, reports
// whether a standby can take the slot over and stops the connector when
// the slot was invalidated or dropped.
func (m *Monitor) slotStats(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	slot := m.Source.Slot
	info, err := m.Source.DB.Slot(ctx, slot)
	switch {
	case errors.Is(err, ErrNoSlot):
		m.Fail(&fault.FatalError{Reason: "slot_missing", Err: fmt.Errorf("replication slot %s was dropped while the connector ran; "+
			"events committed since are not in any stream: restart to recreate it, then reconcile from the last checkpoint", slot)})
		return
	case err != nil:
		return // transient; the stream reports connection trouble
	}
	m.Metrics.RetainedWAL.Set(float64(info.RetainedBytes()))
	m.Metrics.LagBytes.Set(float64(info.LagBytes())) // its only writer, with status's definition
	m.Metrics.SetWALStatus(info.WALStatus)
	if info.WALStatus == "lost" {
		m.Fail(ErrSlotLost(slot))
		return
	}
	m.failoverStats(ctx)
	if w := m.RetainedWALWarn; w > 0 {
		if r := info.RetainedBytes(); r > w && !m.warned {
			m.warned = true
			m.Log.Warn("replication slot retains a lot of WAL", "slot", info.Name, "retained_bytes", r, "threshold", w,
				"restart_lsn", info.Restart, "confirmed", info.Confirmed,
				"fix", "check that the connector is streaming and Kafka acknowledges; see docs/operations.md")
		} else if r <= w {
			m.warned = false
		}
	}
}

// failoverReport is what the log last said about the slot's failover
// readiness, so a state is logged once, when it is first seen.
type failoverReport struct {
	logged  bool
	ready   bool
	problem string
}

// failoverStats sets the failover-ready gauge (its only writer) and logs
// each change of readiness: a standby that stopped streaming, a slot that
// lost its failover property, or a server too old for failover slots
// (postgres.failover_slot auto), said once.
func (m *Monitor) failoverStats(ctx context.Context) {
	src := m.Source
	// A standby's own slot is never a failover slot: synchronization is
	// the primary's (docs/operations.md, "Decoding on a standby").
	if !src.wantsFailover() || m.Standby {
		m.Metrics.SlotFailoverReady.Set(0)
		return
	}
	f, err := src.DB.Failover(ctx, src.Slot)
	if err != nil {
		return // transient; the stream reports connection trouble
	}
	ready := f.Ready()
	if ready {
		m.Metrics.SlotFailoverReady.Set(1)
	} else {
		m.Metrics.SlotFailoverReady.Set(0)
	}
	problem, fix := f.Problem(src.Slot)
	if m.fo.logged && m.fo.ready == ready && m.fo.problem == problem {
		return
	}
	m.fo = failoverReport{logged: true, ready: ready, problem: problem}
	switch {
	case ready:
		m.Log.Info("failover slot ready: a standby synchronizes it and receives its changes first", "slot", src.Slot,
			"standby_slots", strings.Join(f.Active, ","))
	case !f.Supported():
		// auto on an older server: on was refused at start.
		m.Log.Info("failover slots need PostgreSQL 17; running without one", "slot", src.Slot, "server", f.Version,
			"detail", problem)
	default:
		m.Log.Warn("no standby can take the slot over after a failover", "slot", src.Slot, "problem", problem, "fix", fix)
	}
}
