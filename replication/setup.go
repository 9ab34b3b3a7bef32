package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// PrerequisiteError is a server setting or privilege that must change before
// the connector can run. It is fatal: retrying cannot fix it.
type PrerequisiteError struct {
	Problem string
	Fix     string
}

func (e *PrerequisiteError) Error() string { return e.Problem + "; " + e.Fix }

// Check verifies the server prerequisites. It returns every problem it finds,
// joined, each a *PrerequisiteError, or a connection error.
func Check(ctx context.Context, src Source) error {
	conn, err := src.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return check(ctx, conn, src)
}

func check(ctx context.Context, conn *pgx.Conn, src Source) error {
	var problems []error
	add := func(problem, fix string) { problems = append(problems, &PrerequisiteError{problem, fix}) }

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		add(fmt.Sprintf("wal_level is %q, logical decoding needs \"logical\"", walLevel),
			"set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")
	}
	if err := checkVersion(ctx, conn, src, add); err != nil {
		return err
	}
	facts, err := readStandbyFacts(ctx, conn, src)
	if err != nil {
		return err
	}
	for _, p := range facts.problems() {
		problems = append(problems, p)
	}
	primary, err := checkPrimary(ctx, conn, src)
	if err != nil {
		return err
	}
	for _, p := range primary {
		problems = append(problems, p)
	}
	var canReplicate bool
	var role string
	if err := conn.QueryRow(ctx,
		"SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&role, &canReplicate); err != nil {
		return fmt.Errorf("read role: %w", err)
	}
	if !canReplicate {
		add(fmt.Sprintf("role %q has no REPLICATION privilege", role),
			fmt.Sprintf("run ALTER ROLE %s WITH REPLICATION as a superuser", pgx.Identifier{role}.Sanitize()))
	}
	for _, t := range src.Tables() {
		if err := checkTable(ctx, conn, t, role, add); err != nil {
			return err
		}
	}
	return errors.Join(problems...)
}

// checkTable checks src's outbox table: it exists, the role can read it,
// and it has the mapped columns.
func checkTable(ctx context.Context, conn *pgx.Conn, src Source, role string, add func(problem, fix string)) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", src.qualified()).Scan(&exists); err != nil {
		return fmt.Errorf("look up table: %w", err)
	}
	if !exists {
		add(fmt.Sprintf("outbox table %s does not exist", src.qualified()),
			"create it (see sql/outbox.sql) or set outbox.table (or the entry's table in outbox.tables) to the right schema.table")
		return nil
	}
	var canSelect bool
	if err := conn.QueryRow(ctx, "SELECT has_table_privilege($1, 'SELECT')", src.qualified()).Scan(&canSelect); err != nil {
		return fmt.Errorf("check privilege: %w", err)
	}
	if !canSelect {
		add(fmt.Sprintf("role %q cannot SELECT from %s", role, src.qualified()),
			fmt.Sprintf("run GRANT SELECT ON %s TO %s", src.qualified(), pgx.Identifier{role}.Sanitize()))
	}
	rows, err := conn.Query(ctx, `SELECT attname FROM pg_attribute
	WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, src.qualified())
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	have := make(map[string]bool, len(cols))
	for _, c := range cols {
		have[c] = true
	}
	for _, c := range src.Columns {
		if !have[c] {
			add(fmt.Sprintf("column %q is missing from %s (it has %s)", c, src.qualified(), strings.Join(cols, ", ")),
				"map the right column under outbox.columns or outbox.header_columns")
		}
	}
	return nil
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

// EnsurePublication creates the publication if it is missing and checks it
// publishes inserts of the outbox table.
func EnsurePublication(ctx context.Context, src Source) error {
	conn, err := src.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var recovery, exists bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery(), EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)",
		src.Publication).Scan(&recovery, &exists); err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	if recovery && !exists {
		if err := publishOnPrimary(ctx, conn, src); err != nil {
			return err
		}
	}
	return ensurePublication(ctx, conn, src)
}

// publishOnPrimary creates the publication a standby lacks on its primary
// (a standby is read-only; the catalog row reaches it by replay) and waits
// until the standby has replayed it.
func publishOnPrimary(ctx context.Context, conn *pgx.Conn, src Source) error {
	if src.Primary == nil {
		create, _, err := createPublication(ctx, conn, src)
		if err != nil {
			return err
		}
		return &PrerequisiteError{
			Problem: fmt.Sprintf("publication %s does not exist, and the server is a standby where it cannot be created", src.Publication),
			Fix:     "run on the primary: " + create + "; or set postgres.primary_dsn so the connector creates it there",
		}
	}
	pc, err := src.Primary.connect(ctx)
	if err != nil {
		return fmt.Errorf("connect to postgres.primary_dsn: %w", classify(err))
	}
	defer pc.Close(context.WithoutCancel(ctx))
	if err := ensurePublication(ctx, pc, src); err != nil {
		return fmt.Errorf("on the primary: %w", err)
	}
	var at string
	if err := pc.QueryRow(ctx, "SELECT "+walPosition+"::text").Scan(&at); err != nil {
		return fmt.Errorf("on the primary: read wal position: %w", err)
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var replayed bool
		err := conn.QueryRow(wait, "SELECT "+walPosition+" >= $1::pg_lsn", at).Scan(&replayed)
		if err != nil {
			return fmt.Errorf("wait for the standby to replay publication %s: %w", src.Publication, err)
		}
		if replayed {
			return nil
		}
		select {
		case <-wait.Done():
			return fmt.Errorf("wait for the standby to replay publication %s (created on the primary at %s): %w", src.Publication, at, wait.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createPublication returns the statement that creates the publication for
// every outbox table, and which of them are partitioned.
func createPublication(ctx context.Context, conn *pgx.Conn, src Source) (sql string, partitioned []bool, err error) {
	var names []string
	anyPartitioned := false
	for _, t := range src.Tables() {
		var relkind string
		if err := conn.QueryRow(ctx, "SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')",
			t.qualified()).Scan(&relkind); err != nil {
			return "", nil, fmt.Errorf("read table kind: %w", err)
		}
		names = append(names, t.qualified())
		partitioned = append(partitioned, relkind == "p")
		anyPartitioned = anyPartitioned || relkind == "p"
	}
	// A partitioned outbox is published under its root's name only with
	// publish_via_partition_root (PG docs, CREATE PUBLICATION); otherwise
	// each row arrives as an insert into its partition, which is not the
	// configured table. With it, partitions attached later are covered too.
	// publish = 'insert': UPDATEs and DELETEs of outbox rows (cleanup jobs)
	// are never even decoded into the stream.
	with := "publish = 'insert'"
	if anyPartitioned {
		with += ", publish_via_partition_root = true"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)",
		pgx.Identifier{src.Publication}.Sanitize(), strings.Join(names, ", "), with), partitioned, nil
}

func ensurePublication(ctx context.Context, conn *pgx.Conn, src Source) error {
	sql, partitioned, err := createPublication(ctx, conn, src)
	if err != nil {
		return err
	}
	var pubInsert, viaRoot bool
	err = conn.QueryRow(ctx, "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1", src.Publication).Scan(&pubInsert, &viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := conn.Exec(ctx, sql); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return &PrerequisiteError{
					Problem: fmt.Sprintf("cannot create publication %s: %s", src.Publication, pgErr.Message),
					Fix:     "have the table owner run: " + sql,
				}
			}
			return fmt.Errorf("create publication: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	pub := pgx.Identifier{src.Publication}.Sanitize()
	if !pubInsert {
		return &PrerequisiteError{
			Problem: fmt.Sprintf("publication %s does not publish inserts", src.Publication),
			Fix:     fmt.Sprintf("run ALTER PUBLICATION %s SET (publish = 'insert')", pub),
		}
	}
	for i, t := range src.Tables() {
		if partitioned[i] && !viaRoot {
			return &PrerequisiteError{
				Problem: fmt.Sprintf("publication %s publishes the partitions of %s under their own names (publish_via_partition_root is off), "+
					"so their rows would not be recognised as outbox rows", src.Publication, t.qualified()),
				Fix: fmt.Sprintf("run ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub),
			}
		}
		var member bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
			WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`, src.Publication, t.Schema, t.Table).Scan(&member); err != nil {
			return fmt.Errorf("read publication tables: %w", err)
		}
		if !member {
			return &PrerequisiteError{
				Problem: fmt.Sprintf("publication %s does not include %s", src.Publication, t.qualified()),
				Fix:     fmt.Sprintf("run ALTER PUBLICATION %s ADD TABLE %s", pub, t.qualified()),
			}
		}
	}
	return nil
}

// ensureSlot creates the slot, a failover slot when failover is set, or
// checks the existing one and makes it a failover slot if it is not.
func ensureSlot(ctx context.Context, conn *pgx.Conn, src Source, failover bool) (confirmed lsn.LSN, created bool, err error) {
	info, err := slotInfo(ctx, conn, src.Slot)
	if err == nil {
		if info.Plugin != "pgoutput" {
			return 0, false, &PrerequisiteError{
				Problem: fmt.Sprintf("replication slot %s uses plugin %q, not pgoutput", src.Slot, info.Plugin),
				Fix:     "choose another postgres.slot, or drop this slot if nothing else uses it",
			}
		}
		if info.Database != conn.Config().Database {
			return 0, false, &PrerequisiteError{
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
	return &FatalError{Reason: "slot_invalidated", Err: &PrerequisiteError{
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
