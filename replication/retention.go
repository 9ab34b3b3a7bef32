package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
	conn         *pgx.Conn
}

// NewRetainer returns the retainer for src's outbox table, on src's primary.
func NewRetainer(src Source) *Retainer {
	return &Retainer{db: src.Writer(), schema: src.Schema, name: src.OutboxTable.Table, table: src.qualified()}
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
	return conn, nil
}

// Read takes a reading: one statement, so one snapshot, whose xmin is read
// and then the WAL insert position (evaluated after the statement's
// snapshot was taken; the insert position, not the write position, since
// an asynchronous commit may not be written yet).
func (r *Retainer) Read(ctx context.Context) (retention.Reading, error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return retention.Reading{}, err
	}
	var x retention.Reading
	var xmin int64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_wal_insert_lsn()").
		Scan(&xmin, &x.WAL); err != nil {
		r.drop(ctx)
		return retention.Reading{}, fmt.Errorf("retention %s: reading: %w", r.table, err)
	}
	x.Xmin, x.At = uint64(xmin), time.Now()
	return x, nil
}

// deleteBatch deletes up to limit rows older than the retention (on the
// server's clock) whose xmin precedes below, and under a repair hold ($4)
// only rows created before it. xmin is a 32-bit xid: it
// precedes below when (below - xmin) mod 2^32 is in [1, 2^31), as
// PostgreSQL's TransactionIdPrecedes decides; a reading is recent
// (retention.maxReadingAge) so every live row's xid is within 2^31 of it,
// and a frozen row misjudged as newer is only kept longer.
const deleteBatch = `WITH doomed AS (
	SELECT ctid FROM %[1]s
	WHERE %[2]s < now() - make_interval(secs => $1::float8)
	  AND ($4::timestamptz IS NULL OR %[2]s < $4)
	  AND %[3]s
	ORDER BY %[2]s LIMIT $3
	FOR UPDATE SKIP LOCKED)
DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))`

// xidPrecedes is true when the 32-bit xid a precedes the one b (both
// bigint expressions holding 0..2^32-1), as TransactionIdPrecedes decides
// for normal xids (transam.c: (int32) (a - b) < 0).
const xidPrecedes = "((%[2]s - %[1]s) & 4294967295) BETWEEN 1 AND 2147483647"

// Delete deletes one batch in its own transaction (hold: rows created at
// or after it are kept; zero: none). busy reports that
// `verify` holds the table's lock: nothing was deleted.
func (r *Retainer) Delete(ctx context.Context, below uint64, olderThan time.Duration, hold time.Time, limit int) (n int64, busy bool, err error) {
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
		tag, err := tx.Exec(ctx, fmt.Sprintf(deleteBatch, r.table, pgx.Identifier{RetentionColumn}.Sanitize(), below32),
			olderThan.Seconds(), int64(below&0xffffffff), limit, nullable(hold))
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
