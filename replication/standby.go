package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
)

// walPosition is the server's WAL position as a query reads it: on a
// primary the current write position, on a hot standby the replay position
// (pg_current_wal_lsn() cannot be executed during recovery; PG docs, "Backup
// Control Functions" and "Recovery Information Functions"). It is the one
// definition for the guard's readings, the gap read, the slot statistics
// and the checkpoint table's timeline.
const walPosition = `(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)`

// standbyVersion: logical decoding on a standby arrived in PostgreSQL 16
// (PG 16 docs, "Logical Decoding Concepts", "Logical Decoding on Standby").
const standbyVersion = 16

// standbyFacts are what decides whether the connector can run against a
// server in recovery, read at start.
type standbyFacts struct {
	Recovery bool
	Major    int
	Version  string
	// HotStandbyFeedback and PrimarySlot: without both, the primary removes
	// catalog rows the standby's slot still needs and the standby
	// invalidates the slot on the conflict (PG 16 docs, "Logical Decoding
	// on Standby").
	HotStandbyFeedback bool
	PrimarySlot        string
	// Primary: postgres.primary_dsn is set.
	Primary bool
	// TableStore: checkpoint.store is table, written on the server.
	TableStore bool
	// Failover is postgres.failover_slot.
	Failover string
}

// problems are the prerequisites facts fail, every one (none on a primary).
func (f standbyFacts) problems() []*fault.PrerequisiteError {
	if !f.Recovery {
		return nil
	}
	if f.Major < standbyVersion {
		return []*fault.PrerequisiteError{{
			Problem: fmt.Sprintf("the server is a standby (in recovery) running PostgreSQL %s; logical decoding on a standby needs %d or later",
				f.Version, standbyVersion),
			Fix: fmt.Sprintf("point postgres.dsn at the primary, or upgrade to PostgreSQL %d", standbyVersion),
		}}
	}
	var out []*fault.PrerequisiteError
	if !f.HotStandbyFeedback {
		out = append(out, &fault.PrerequisiteError{
			Problem: "hot_standby_feedback is off on the standby: the primary would remove catalog rows the slot needs and the standby would invalidate the slot",
			Fix:     "set hot_standby_feedback = on on the standby (ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf())",
		})
	}
	if f.PrimarySlot == "" {
		out = append(out, &fault.PrerequisiteError{
			Problem: "primary_slot_name is not set on the standby: without a physical slot the primary may remove WAL and catalog rows the standby's slot still needs",
			Fix:     "create a physical slot on the primary (SELECT pg_create_physical_replication_slot('standby1')) and set primary_slot_name on the standby",
		})
	}
	if f.TableStore && !f.Primary {
		out = append(out, &fault.PrerequisiteError{
			Problem: "checkpoint.store is table, but the server is a read-only standby",
			Fix:     "set postgres.primary_dsn so the checkpoint table is written on the primary, or set checkpoint.store: file",
		})
	}
	if f.Failover == FailoverOn {
		out = append(out, &fault.PrerequisiteError{
			Problem: "postgres.failover_slot is on, but failover slots are created on a primary; this server is a standby",
			Fix:     "set postgres.failover_slot: auto or off, or point postgres.dsn at the primary",
		})
	}
	return out
}

// readStandbyFacts reads the recovery state and the standby settings.
func readStandbyFacts(ctx context.Context, conn *pgx.Conn, src Source) (standbyFacts, error) {
	f := standbyFacts{Primary: src.Primary != nil, TableStore: src.CheckpointTable, Failover: src.Failover}
	var err error
	if f.Major, f.Version, err = ServerMajor(ctx, conn); err != nil {
		return f, err
	}
	var feedback string
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback'),
		coalesce(current_setting('primary_slot_name', true), '')`).Scan(&f.Recovery, &feedback, &f.PrimarySlot); err != nil {
		return f, fmt.Errorf("read recovery state: %w", err)
	}
	f.HotStandbyFeedback = feedback == "on"
	return f, nil
}

// checkPrimary checks postgres.primary_dsn against the server: the same
// database system (a physical standby shares its primary's system
// identifier), and a server that is not itself in recovery.
func checkPrimary(ctx context.Context, conn *pgx.Conn, src Source) ([]*fault.PrerequisiteError, error) {
	if src.Primary == nil {
		return nil, nil
	}
	pc, err := src.Primary.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres.primary_dsn: %w", classify(err))
	}
	defer pc.Close(context.WithoutCancel(ctx))
	const q = "SELECT system_identifier::text, pg_is_in_recovery(), current_setting('wal_level') FROM pg_control_system()"
	var sys, psys, walLevel string
	var recovery, precovery bool
	if err := conn.QueryRow(ctx, q).Scan(&sys, &recovery, &walLevel); err != nil {
		return nil, fmt.Errorf("read system identifier: %w", err)
	}
	if err := pc.QueryRow(ctx, q).Scan(&psys, &precovery, &walLevel); err != nil {
		return nil, fmt.Errorf("postgres.primary_dsn: read system identifier: %w", err)
	}
	var out []*fault.PrerequisiteError
	switch {
	case psys != sys && recovery:
		out = append(out, &fault.PrerequisiteError{
			Problem: fmt.Sprintf("postgres.primary_dsn is database system %s, but the standby of postgres.dsn is %s: not its primary", psys, sys),
			Fix:     "point postgres.primary_dsn at the primary the standby replicates from",
		})
	case psys != sys:
		out = append(out, &fault.PrerequisiteError{
			Problem: fmt.Sprintf("postgres.dsn is a primary (database system %s) and postgres.primary_dsn another server (database system %s)", sys, psys),
			Fix:     "unset postgres.primary_dsn (it is for a postgres.dsn that is a standby), or point it at the same server",
		})
	case precovery:
		out = append(out, &fault.PrerequisiteError{
			Problem: "postgres.primary_dsn points at a server in recovery (a standby): heartbeats, the publication and the checkpoint table cannot be written there",
			Fix:     "point postgres.primary_dsn at the primary",
		})
	}
	if recovery && walLevel != "logical" {
		out = append(out, &fault.PrerequisiteError{
			Problem: fmt.Sprintf("wal_level is %q on the primary; logical decoding on a standby needs \"logical\" there", walLevel),
			Fix:     "set wal_level = logical on the primary and restart it (the standby replays the change)",
		})
	}
	return out, nil
}

// InRecovery reports whether the server is a standby (pg_is_in_recovery()).
func (d *DB) InRecovery(ctx context.Context) (bool, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var r bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r); err != nil {
		return false, fmt.Errorf("read recovery state: %w", err)
	}
	return r, nil
}

// Writer is where the connector writes: the primary of postgres.primary_dsn
// when set, else the server itself.
func (s Source) Writer() *DB {
	if s.Primary != nil {
		return s.Primary
	}
	return s.DB
}

// standbySnapshotEvery paces pg_log_standby_snapshot while a slot is
// created on a standby.
const standbySnapshotEvery = time.Second

// nudgeStandby calls pg_log_standby_snapshot() on the primary until ctx
// ends. Creating a slot on a standby waits for a running-xacts record from
// the primary, which an idle primary writes only at its next checkpoint or
// every 15 s of bgwriter activity (PG 16 docs, "Logical Decoding on
// Standby"); the function writes one now. Failures are left to the slot
// creation, which keeps waiting.
func nudgeStandby(ctx context.Context, primary *DB) {
	conn, err := primary.connect(ctx)
	if err != nil {
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(standbySnapshotEvery)
	defer t.Stop()
	for {
		if _, err := conn.Exec(ctx, "SELECT pg_log_standby_snapshot()"); err != nil && ctx.Err() == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// standbySlotError maps the error of a slot creation on a standby: the
// server refuses it with object_not_in_prerequisite_state (55000) when the
// primary's wal_level is below logical (PG 16, logical.c,
// CheckLogicalDecodingRequirements), which no retry fixes.
func standbySlotError(slot string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55000" {
		return &fault.PrerequisiteError{
			Problem: fmt.Sprintf("cannot create replication slot %s on the standby: %s", slot, pgErr.Message),
			Fix:     "set wal_level = logical on the primary and restart it (the standby replays the change), then start again",
		}
	}
	return err
}
