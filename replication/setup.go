package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Source names what to replicate.
type Source struct {
	// DB opens the connections.
	DB          *DB
	Slot        string
	Publication string
	// OutboxTable is the outbox table (the first of outbox.tables); Others
	// are the rest. Every one of them is checked, published and guarded.
	OutboxTable
	Others []OutboxTable
	// Messages: events also come as logical decoding messages (the
	// table-less outbox), which pgoutput sends from PostgreSQL 14 on.
	Messages bool
	// Failover is postgres.failover_slot: FailoverAuto, FailoverOn or
	// FailoverOff ("" is off).
	Failover string
	// Primary opens connections to the primary of a standby
	// (postgres.primary_dsn); nil when unset. Heartbeats, a missing
	// publication and the checkpoint table are written there.
	Primary *DB
	// CheckpointTable: checkpoint.store is table, which writes to Writer().
	CheckpointTable bool
	// Retention: outbox.retention is set; Check asks what it needs of
	// each table (retention.go).
	Retention bool
}

// OutboxTable names one outbox table.
type OutboxTable struct {
	Schema string
	Table  string
	// Columns are the mapped column names that must exist in the table.
	Columns []string
}

func (t OutboxTable) qualified() string {
	return pgx.Identifier{t.Schema, t.Table}.Sanitize()
}

// Tables returns one Source per outbox table, the first one first: each
// is s with that table as its OutboxTable and no Others.
func (s Source) Tables() []Source {
	out := []Source{s}
	out[0].Others = nil
	for _, t := range s.Others {
		o := out[0]
		o.OutboxTable = t
		out = append(out, o)
	}
	return out
}

// Setup is the state of the slot after setup.
type SetupResult struct {
	// Confirmed is the slot's confirmed position.
	Confirmed lsn.LSN
	// Created is true when the slot was created by this call.
	Created bool
	// Snapshot is set when the slot was created with an exported snapshot;
	// the caller reads it, then closes it.
	Snapshot *ExportedSnapshot
}

// ExportedSnapshot is the snapshot a new slot exported: reading the table in
// it (SET TRANSACTION SNAPSHOT) sees exactly the rows committed before the
// slot's first change (PG docs 55.4, CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT).
// It stays valid until Close.
type ExportedSnapshot struct {
	Name            string
	ConsistentPoint lsn.LSN
	conn            *pgconn.PgConn
}

// Close ends the snapshot.
func (e *ExportedSnapshot) Close(ctx context.Context) { e.conn.Close(ctx) }

// Setup creates the slot when it is missing; call Check and
// EnsurePublication first. With exportSnapshot, a slot it creates exports its snapshot
// in the result.
func Setup(ctx context.Context, src Source, exportSnapshot bool) (SetupResult, error) {
	conn, err := src.DB.connect(ctx)
	if err != nil {
		return SetupResult{}, fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	major, _, err := ServerMajor(ctx, conn)
	if err != nil {
		return SetupResult{}, err
	}
	var recovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil {
		return SetupResult{}, fmt.Errorf("read recovery state: %w", err)
	}
	// A slot created on a standby cannot be a failover slot (PG 17 docs,
	// "Replication Slot Synchronization": failover slots are synchronized
	// from the primary); Check refused postgres.failover_slot on.
	failover := src.wantsFailover() && major >= failoverVersion && !recovery
	if recovery && src.Primary != nil {
		if _, err := slotInfo(ctx, conn, src.Slot); errors.Is(err, errNoSlot) {
			nudge, stop := context.WithCancel(ctx)
			defer stop()
			go nudgeStandby(nudge, src.Primary)
		}
	}
	if exportSnapshot {
		if _, err := slotInfo(ctx, conn, src.Slot); errors.Is(err, errNoSlot) {
			res, err := createWithSnapshot(ctx, src, failover)
			if recovery {
				err = standbySlotError(src.Slot, err)
			}
			return res, err
		}
	}
	confirmed, created, err := ensureSlot(ctx, conn, src, failover)
	if recovery {
		err = standbySlotError(src.Slot, err)
	}
	return SetupResult{Confirmed: confirmed, Created: created}, err
}

// createWithSnapshot creates the slot on a replication connection, which
// must stay open while the exported snapshot is in use.
func createWithSnapshot(ctx context.Context, src Source, failover bool) (SetupResult, error) {
	rc, err := src.DB.replication(ctx)
	if err != nil {
		return SetupResult{}, fmt.Errorf("connect: %w", classify(err))
	}
	action := "EXPORT_SNAPSHOT"
	if failover {
		// FAILOVER exists only in the parenthesized option list (PG 17
		// docs, "Streaming Replication Protocol", CREATE_REPLICATION_SLOT),
		// which spells the snapshot action as an option too.
		action = "(SNAPSHOT 'export', FAILOVER true)"
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, rc, src.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: action})
	if err != nil {
		rc.Close(context.WithoutCancel(ctx))
		return SetupResult{}, fmt.Errorf("create replication slot %s: %w", src.Slot, classify(err))
	}
	cp, err := lsn.Parse(res.ConsistentPoint)
	if err != nil {
		rc.Close(context.WithoutCancel(ctx))
		return SetupResult{}, fmt.Errorf("create replication slot %s: %w", src.Slot, err)
	}
	return SetupResult{Confirmed: cp, Created: true,
		Snapshot: &ExportedSnapshot{Name: res.SnapshotName, ConsistentPoint: cp, conn: rc}}, nil
}

// DropSlot drops the slot (it must be inactive).
func (d *DB) DropSlot(ctx context.Context, slot string) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		return fmt.Errorf("drop slot %s: %w", slot, err)
	}
	return nil
}

// ensureSlot creates the slot, a failover slot when failover is set, or
// checks the existing one and makes it a failover slot if it is not.
func ensureSlot(ctx context.Context, conn *pgx.Conn, src Source, failover bool) (confirmed lsn.LSN, created bool, err error) {
	info, err := slotInfo(ctx, conn, src.Slot)
	if err == nil {
		if info.Plugin != "pgoutput" {
			return 0, false, &fault.PrerequisiteError{
				Problem: fmt.Sprintf("replication slot %s uses plugin %q, not pgoutput", src.Slot, info.Plugin),
				Fix:     "choose another postgres.slot, or drop this slot if nothing else uses it",
			}
		}
		if info.Database != conn.Config().Database {
			return 0, false, &fault.PrerequisiteError{
				Problem: fmt.Sprintf("replication slot %s belongs to database %q, not %q", src.Slot, info.Database, conn.Config().Database),
				Fix:     "connect to the slot's database or choose another postgres.slot",
			}
		}
		if info.WALStatus == "lost" {
			return 0, false, ErrSlotLost(src.Slot)
		}
		if failover && !info.Failover {
			if err := enableFailover(ctx, src.DB, src.Slot); err != nil && !isInUse(err) {
				return 0, false, err
			}
		}
		return info.Confirmed, false, nil
	}
	if !errors.Is(err, errNoSlot) {
		return 0, false, err
	}
	var at lsn.LSN
	create := "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')"
	if failover { // (name, plugin, temporary, twophase, failover)
		create = "SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
	}
	if err := conn.QueryRow(ctx, create, src.Slot).Scan(&at); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently by a standby connector
			info, err := slotInfo(ctx, conn, src.Slot)
			return info.Confirmed, false, err
		}
		return 0, false, fmt.Errorf("create replication slot %s: %w", src.Slot, err)
	}
	return at, true, nil
}

var errNoSlot = errors.New("no such slot")

// ErrSlotLost is the fatal error for an invalidated slot.
func ErrSlotLost(slot string) error {
	return &fault.FatalError{Reason: "slot_invalidated", Err: &fault.PrerequisiteError{
		Problem: fmt.Sprintf("replication slot %s was invalidated: the WAL it needed was removed (max_slot_wal_keep_size)", slot),
		Fix:     "events after its last confirmed position may be missing from Kafka; drop the slot, recreate it and reconcile",
	}}
}

// SlotInfo describes a replication slot (pg_replication_slots).
type SlotInfo struct {
	Name      string
	Plugin    string
	Database  string
	Active    bool
	ActivePID int32
	Restart   lsn.LSN
	Confirmed lsn.LSN
	WALStatus string
	// Failover is pg_replication_slots.failover (false before 17).
	Failover bool
	// CurrentWAL is the server's current WAL write position; on a standby
	// its replay position (walPosition).
	CurrentWAL lsn.LSN
}

// RetainedBytes is the WAL the slot keeps from being removed.
func (s SlotInfo) RetainedBytes() int64 {
	if s.Restart == 0 || s.CurrentWAL < s.Restart {
		return 0
	}
	return int64(s.CurrentWAL - s.Restart)
}

// LagBytes is the WAL written but not yet confirmed: the current WAL
// position (on a standby, the replayed one) minus confirmed_flush_lsn. It is the one definition of
// replication lag, for the metric and for outbox-cdc status alike: a reading
// of the server, so it keeps growing while the stream is down, and the
// figure an operator gets from pg_replication_slots by hand.
func (s SlotInfo) LagBytes() int64 {
	if s.Confirmed == 0 || s.CurrentWAL < s.Confirmed {
		return 0
	}
	return int64(s.CurrentWAL - s.Confirmed)
}

func slotInfo(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	var s SlotInfo
	var pid *int32
	var plugin, db, walStatus *string
	// restart_lsn and confirmed_flush_lsn are NULL for a slot that never
	// reserved WAL (and confirmed_flush_lsn for a physical slot): both read
	// as Invalid then, which LagBytes and RetainedBytes treat as unknown.
	var restart, confirmed *lsn.LSN
	// failover is read through to_jsonb: servers before 17 lack the column.
	err := conn.QueryRow(ctx, `SELECT slot_name, plugin, database, active, active_pid,
		restart_lsn, confirmed_flush_lsn, wal_status, `+walPosition+`,
		coalesce((to_jsonb(s) ->> 'failover')::boolean, false)
		FROM pg_replication_slots s WHERE slot_name = $1`, slot).
		Scan(&s.Name, &plugin, &db, &s.Active, &pid, &restart, &confirmed, &walStatus, &s.CurrentWAL, &s.Failover)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, errNoSlot
	}
	if err != nil {
		return s, fmt.Errorf("read slot %s: %w", slot, err)
	}
	s.Plugin, s.Database, s.WALStatus = deref(plugin), deref(db), deref(walStatus)
	if pid != nil {
		s.ActivePID = *pid
	}
	if restart != nil {
		s.Restart = *restart
	}
	if confirmed != nil {
		s.Confirmed = *confirmed
	}
	return s, nil
}

// ErrNoSlot is returned by Slot when the slot does not exist.
var ErrNoSlot = errNoSlot

// Slot reads the slot's state on a connection of its own for tests and
// tools that hold a DSN; the connector uses DB.Slot.
func Slot(ctx context.Context, dsn, slot string) (SlotInfo, error) {
	d, err := ParseDB(dsn, nil)
	if err != nil {
		return SlotInfo{}, err
	}
	return d.Slot(ctx, slot)
}

// Slot reads the slot's state.
func (d *DB) Slot(ctx context.Context, slot string) (SlotInfo, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return SlotInfo{}, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return slotInfo(ctx, conn, slot)
}

// isInUse: the object (a slot) is held by another process.
func isInUse(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
