package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// RetentionColumn is the column retention selects rows by age on, the one
// verify selects them by (verify_rows.go), so what is kept is what verify sees.
const RetentionColumn = "created_at"

// retentionLockClass is the high half of the advisory lock key that the
// retention batches and `verify` share (verify shared, a batch exclusive); the low half is the
// table's OID, so each table has its own lock.
const retentionLockClass = 0x6f62 // "ob"

// RetentionLockKey is the advisory lock key for the table with OID relid.
func RetentionLockKey(relid uint32) int64 { return retentionLockClass<<32 | int64(relid) }

// checkRetention adds a problem for each thing outbox.retention needs of
// src's table and lacks: DELETE, a created_at column and its index; for a
// partitioned table, what checkPartitioned asks.
func checkRetention(ctx context.Context, conn *pgx.Conn, src Source, role string, add func(problem, fix string)) error {
	table := src.qualified()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return fmt.Errorf("check retention on %s: %w", table, err)
	}
	if !exists {
		return nil // checkTable reports it
	}
	var canDelete, partitioned, hasColumn, indexed bool
	err := conn.QueryRow(ctx, `SELECT has_table_privilege(c.oid, 'DELETE'), c.relkind = 'p',
	       EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped),
	       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
	               WHERE i.indrelid = c.oid AND a.attname = $2)
	FROM pg_class c WHERE c.oid = to_regclass($1)`, table, RetentionColumn).
		Scan(&canDelete, &partitioned, &hasColumn, &indexed)
	if err != nil {
		return fmt.Errorf("check retention on %s: %w", table, err)
	}
	if partitioned {
		if err := checkPartitioned(ctx, conn, table, role, add); err != nil {
			return err
		}
	} else if !canDelete {
		add(fmt.Sprintf("outbox.retention: role %q cannot DELETE from %s", role, table),
			fmt.Sprintf("run GRANT DELETE ON %s TO %s, or unset outbox.retention", table, pgx.Identifier{role}.Sanitize()))
	}
	switch create := "CREATE INDEX CONCURRENTLY ON "; {
	case !hasColumn:
		add(fmt.Sprintf("outbox.retention: %s has no %s column to measure rows' age on", table, RetentionColumn),
			"ALTER TABLE "+table+" ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(), or unset outbox.retention")
	case !indexed:
		if partitioned { // CONCURRENTLY is refused on a partitioned table; its partitions get the index too
			create = "CREATE INDEX ON "
		}
		add(fmt.Sprintf("outbox.retention: %s has no index on %s; every round would read the whole table", table, RetentionColumn),
			"run "+create+table+" ("+RetentionColumn+"), or unset outbox.retention")
	}
	return nil
}

// Retainer deletes one outbox table's delivered rows past the retention.
// It owns one connection (to the primary), opened on first use and again
// after an error.
type Retainer struct {
	db           *DB
	schema, name string // unquoted
	table        string // quoted
	relid        uint32
	partitioned  bool // the table is partitioned (partitions.go)
	major        int  // the server's major version
	slot         string
	conn         *pgx.Conn
	// conns counts the connections opened: a reading of one is compared
	// only with readings of the same (retention.Epoch).
	conns uint64
}

// NewRetainer returns the retainer for src's outbox table, on src's primary.
func NewRetainer(src Source) *Retainer {
	return &Retainer{db: src.Writer(), schema: src.Schema, name: src.OutboxTable.Table, table: src.qualified(), slot: src.Slot}
}

// Partitioned reports whether the table is partitioned (read at connect).
func (r *Retainer) Partitioned(ctx context.Context) (bool, error) {
	if _, err := r.connect(ctx); err != nil {
		return false, err
	}
	return r.partitioned, nil
}

// Table is the quoted name of the table.
func (r *Retainer) Table() string { return r.table }

func (r *Retainer) connect(ctx context.Context) (*pgx.Conn, error) {
	if r.conn != nil && !r.conn.IsClosed() {
		return r.conn, nil
	}
	conn, err := r.db.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention %s: connect: %w", r.table, err)
	}
	var relid *uint32
	var kind *string
	err = conn.QueryRow(ctx, "SELECT c.oid, c.relkind::text, current_setting('server_version_num')::int / 10000 FROM (SELECT to_regclass($1) AS oid) r LEFT JOIN pg_class c ON c.oid = r.oid",
		r.table).Scan(&relid, &kind, &r.major)
	if err == nil && (relid == nil || kind == nil) {
		err = errors.New("no such table")
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("retention %s: look up table: %w", r.table, err)
	}
	r.relid, r.partitioned, r.conn = *relid, *kind == "p", conn
	r.conns++
	return conn, nil
}

// readingQuery is one statement, so one snapshot: its xmin and xmax, then
// the WAL insert position (evaluated after the snapshot was taken; the
// insert position, not the write position, since an asynchronous commit may
// not be written yet), the history it belongs to (the timeline is the WAL
// file's: pg_walfile_name uses the insert timeline), and the other logical
// slots of the database with what they confirmed (a slot that confirmed
// nothing yet reads as 0/0). Temporary slots are the connector's own
// copies (replay, read-back) and a session's, which keeps nothing.
const readingQuery = `SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, w.lsn,
	('x' || substr(pg_walfile_name(w.lsn), 1, 8))::bit(32)::bigint, (pg_control_system()).system_identifier::text,
	ARRAY(SELECT slot_name::text FROM pg_replication_slots o WHERE o.slot_type = 'logical' AND o.database = current_database()
		AND NOT o.temporary AND o.slot_name <> $1 ORDER BY slot_name),
	ARRAY(SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots o WHERE o.slot_type = 'logical'
		AND o.database = current_database() AND NOT o.temporary AND o.slot_name <> $1 ORDER BY slot_name)
FROM pg_current_snapshot() s, LATERAL (SELECT pg_current_wal_insert_lsn() AS lsn) w`

// Read takes a reading (retention.Reading) on the primary.
func (r *Retainer) Read(ctx context.Context) (retention.Reading, error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return retention.Reading{}, err
	}
	var x retention.Reading
	var xmin, xmax, tli int64
	var names, confirmed []string
	if err := conn.QueryRow(ctx, readingQuery, r.slot).Scan(&xmin, &xmax, &x.WAL, &tli, &x.Epoch.SystemID, &names, &confirmed); err != nil {
		r.drop(ctx)
		return retention.Reading{}, fmt.Errorf("retention %s: reading: %w", r.table, err)
	}
	if len(names) != len(confirmed) {
		return retention.Reading{}, fmt.Errorf("retention %s: reading: %d slots, %d positions", r.table, len(names), len(confirmed))
	}
	for i, name := range names {
		pos, err := lsn.Parse(confirmed[i])
		if err != nil {
			return retention.Reading{}, fmt.Errorf("retention %s: slot %s: %w", r.table, name, err)
		}
		x.Slots = append(x.Slots, retention.Slot{Name: name, Confirmed: pos})
	}
	x.Xmin, x.Next, x.At = uint64(xmin), uint64(xmax), time.Now()
	x.Epoch.Timeline, x.Epoch.Conn = uint32(tli), r.conns
	return x, nil
}

// deleteBatch deletes up to limit rows older than the retention (on the
// server's clock) whose xmin precedes below and that a repair hold does not
// keep (%[4]s: the hold's condition, or false). xmin is a 32-bit xid: it
// precedes below when (below - xmin) mod 2^32 is in [1, 2^31), as
// PostgreSQL's TransactionIdPrecedes decides; a reading is recent
// (retention.maxReadingAge) so every live row's xid is within 2^31 of it,
// and a frozen row misjudged as newer is only kept longer.
const deleteBatch = `WITH doomed AS (
	SELECT ctid FROM %[1]s
	WHERE %[2]s < now() - make_interval(secs => $1::float8)
	  AND %[3]s
	  AND NOT %[4]s
	ORDER BY %[2]s LIMIT $3
	FOR UPDATE SKIP LOCKED)
DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))`

// xidPrecedes is true when the 32-bit xid a precedes the one b (both
// bigint expressions holding 0..2^32-1), as TransactionIdPrecedes decides
// for normal xids (transam.c: (int32) (a - b) < 0).
const xidPrecedes = "((%[2]s - %[1]s) & 4294967295) BETWEEN 1 AND 2147483647"

// xidHeld is true when the row's 32-bit xmin lies in the hold [from, below)
// (retention.Hold): modulo 2^32 from the hold's start, which the decision
// keeps within 2^30 of every live xid; with the start unknown, every xid
// preceding below.
func xidHeld(xmin string, h retention.Hold) string {
	switch {
	case !h.Set():
		return "false"
	case h.From == 0:
		return fmt.Sprintf(xidPrecedes, xmin, strconv.FormatUint(h.Below&0xffffffff, 10))
	}
	return fmt.Sprintf("(((%s - %d) & 4294967295) < %d)", xmin, h.From&0xffffffff, (h.Below-h.From)&0xffffffff)
}

// Delete deletes one batch in its own transaction (d: the decision, with
// the hold it keeps). busy reports that `verify` holds the table's lock:
// nothing was deleted.
func (r *Retainer) Delete(ctx context.Context, d retention.Decision, olderThan time.Duration, limit int) (n int64, busy bool, err error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return 0, false, err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var got bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", RetentionLockKey(r.relid)).Scan(&got); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if !got {
			busy = true
			return nil
		}
		below32 := fmt.Sprintf(xidPrecedes, "xmin::text::bigint", "$2::bigint")
		tag, err := tx.Exec(ctx, fmt.Sprintf(deleteBatch, r.table, pgx.Identifier{RetentionColumn}.Sanitize(), below32,
			xidHeld("xmin::text::bigint", d.Keep)), olderThan.Seconds(), int64(d.Below&0xffffffff), limit)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		r.drop(ctx)
		return 0, false, fmt.Errorf("retention %s: delete: %w", r.table, err)
	}
	return n, busy, nil
}

// TableStats are the table's figures for the metrics.
type TableStats struct {
	Oldest time.Time // created_at of the oldest row; zero when empty
	Bytes  int64     // pg_total_relation_size: heap, indexes, TOAST
}

// Stats reads the oldest row's created_at (on its index) and the size.
func (r *Retainer) Stats(ctx context.Context) (TableStats, error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return TableStats{}, err
	}
	var s TableStats
	var oldest *time.Time
	// A partitioned root has no storage of its own: its size is its
	// partitions' (pg_partition_tree lists nothing for a plain table).
	q := fmt.Sprintf("SELECT min(%s), greatest(pg_total_relation_size($1::regclass), (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree($1::regclass)))::bigint FROM %s",
		pgx.Identifier{RetentionColumn}.Sanitize(), r.table)
	if err := conn.QueryRow(ctx, q, r.table).Scan(&oldest, &s.Bytes); err != nil {
		r.drop(ctx)
		return TableStats{}, fmt.Errorf("retention %s: stats: %w", r.table, err)
	}
	if oldest != nil {
		s.Oldest = *oldest
	}
	return s, nil
}

func (r *Retainer) drop(ctx context.Context) {
	if r.conn != nil {
		r.conn.Close(context.WithoutCancel(ctx))
		r.conn = nil
	}
}

// Close closes the connection.
func (r *Retainer) Close(ctx context.Context) { r.drop(ctx) }

// VerifyLock holds the retention lock of every table in srcs, shared, for
// `verify` (which reads the rows twice, and with --repair republishes the
// missing ones), so no retention batch deletes a row meanwhile; several
// verify runs share it. It waits for a batch in progress (each is short).
// release unlocks.
func VerifyLock(ctx context.Context, srcs []Source) (release func(), err error) {
	conn, err := srcs[0].Writer().connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention lock: connect: %w", err)
	}
	release = func() {
		// Unlocked before the close returns: the server ends a closed session
		// (and its locks) a little later.
		c := context.WithoutCancel(ctx)
		_, _ = conn.Exec(c, "SELECT pg_advisory_unlock_all()")
		conn.Close(c)
	}
	for _, s := range srcs {
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared(($1::bigint << 32) | oid::bigint) FROM (SELECT to_regclass($2)::oid AS oid) t WHERE oid IS NOT NULL",
			int64(retentionLockClass), s.qualified()); err != nil {
			release()
			return nil, fmt.Errorf("retention lock %s: %w", s.qualified(), err)
		}
	}
	return release, nil
}
