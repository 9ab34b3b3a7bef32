package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// gapWaitLog spaces the warnings of a repair waiting for open transactions.
const gapWaitLog = 10 * time.Second

// waitGapWriters waits until every transaction at or after xmin that may
// have inserted rows while a table was outside the publication, and is
// still open, has ended: it commits after the repair's snapshot would be
// taken, and the stream never decodes those rows. Such a transaction wrote
// before the change that brought the table back committed. Two kinds:
//   - ids up to that change's own (the catalog rows it wrote, gapCatalogXid):
//     each is waited for, whatever it touched;
//   - ids above it: a writer that took its id after the change did and
//     inserted before it committed (ADD TABLE's ShareUpdateExclusiveLock
//     does not conflict with INSERT's RowExclusiveLock). It still holds that
//     lock on the outbox table (locks last until the transaction ends), so
//     those open now that hold a lock on an outbox table, or a partition of
//     one, are waited for (outboxLockHolders). Later ones write with the
//     table back, and are decoded; unrelated long transactions hold nothing
//     of the outbox, and the repair does not wait for them.
//
// It waits as long as they run (an idle-in-transaction session holds the
// repair, and with it the stream, back), saying which every gapWaitLog.
func (s Source) waitGapWriters(ctx context.Context, xmin uint64, waiting func(xids []int64)) error {
	conn, err := s.Writer().connect(ctx)
	if err != nil {
		return fmt.Errorf("backfill: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	upper, err := s.gapCatalogXid(ctx, conn)
	if err != nil {
		return err
	}
	above, err := s.outboxLockHolders(ctx, conn, max(upper+1, int64(xmin)))
	if err != nil {
		return err
	}
	// A snapshot's xip lists the running ids below its xmax, the newest
	// ended id + 1; a running id at or above xmax is not listed, so the ids
	// above the catalog's (an id that ended since is below xmax) are
	// running when listed or at or above xmax (PG docs, "pg_snapshot").
	// The comment names the wait in pg_stat_activity.
	const running = `/* outbox-cdc: the gap repair waits */ WITH s AS (SELECT pg_current_snapshot() AS s)
		SELECT coalesce(array_agg(x), '{}') FROM (
			SELECT x::text::bigint AS x FROM s, pg_snapshot_xip(s.s) x WHERE x::text::bigint >= $1 AND x::text::bigint <= $2
			UNION SELECT a FROM s, unnest($3::bigint[]) a
				WHERE a >= pg_snapshot_xmax(s.s)::text::bigint OR a::text::xid8 IN (SELECT pg_snapshot_xip(s.s))) r`
	logged := time.Now()
	for {
		var open []int64
		if err := conn.QueryRow(ctx, running, int64(xmin), upper, above).Scan(&open); err != nil {
			return fmt.Errorf("backfill: read the running transactions: %w", err)
		}
		if len(open) == 0 {
			return s.waitReplay(ctx, conn)
		}
		if time.Since(logged) >= gapWaitLog && waiting != nil {
			logged = time.Now()
			waiting(open)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// outboxLockHolders lists the open transactions with a full id at or above
// from that hold a lock on an outbox table or one of its partitions (an
// insert into a partitioned table locks the partition too). It is read
// once (pg_partition_tree lists nothing for a table outside a partition
// tree, so the tables are listed themselves): a transaction that takes such a lock later writes with the table
// back in the publication. A prepared transaction keeps its locks, with
// its virtual transaction id, and is listed too. Every transaction with an
// id holds the ExclusiveLock on it (PG docs, "pg_locks": "Every
// transaction holds an exclusive lock on its transaction ID"). Its 32-bit
// id is made full against xmax, the newest ended id + 1, in the window of
// 2^31 either side: a running id can be above xmax (a wider window than a
// row's xmin needs, xid8), and every live id is within 2^31 of it.
func (s Source) outboxLockHolders(ctx context.Context, conn *pgx.Conn, from int64) ([]int64, error) {
	var tables []string
	for _, t := range s.Tables() {
		tables = append(tables, t.qualified())
	}
	var ids []int64
	err := conn.QueryRow(ctx, `WITH rels AS (
			SELECT to_regclass(t) AS relid FROM unnest($1::text[]) t
			UNION SELECT p.relid FROM unnest($1::text[]) t, pg_partition_tree(to_regclass(t)) p),
		r AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS ref),
		x AS (SELECT DISTINCT l.virtualtransaction, r.ref + (((l.transactionid::text::bigint - (r.ref & 4294967295) + 2147483648)
					& 4294967295) - 2147483648) AS id
				FROM pg_locks l, r WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted)
		SELECT coalesce(array_agg(DISTINCT x.id), '{}') FROM x JOIN pg_locks l ON l.virtualtransaction = x.virtualtransaction
			WHERE l.locktype = 'relation' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND l.relation IN (SELECT relid FROM rels) AND x.id >= $2`,
		tables, from).Scan(&ids)
	if err != nil {
		return nil, fmt.Errorf("backfill: read the transactions that hold a lock on the outbox: %w", err)
	}
	return ids, nil
}

// gapCatalogXid is the newest full transaction id among the catalog rows
// that put the outbox tables in the publication as they are now (the
// pg_publication_rel row, the publication's row, the table's pg_class
// row): the change that brought a table back, committed, so every id up to
// it lies below the xmax of later snapshots and is listed when running.
// A table that is a member through its schema (FOR TABLES IN SCHEMA writes
// pg_publication_namespace) or FOR ALL TABLES has no pg_publication_rel
// row, and the next id stands in (assigned and rolled back; on a standby
// the snapshot's xmax, which misses a writer newer than the newest
// transaction that ended).
func (s Source) gapCatalogXid(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var tables []string
	for _, t := range s.Tables() {
		tables = append(tables, t.qualified())
	}
	var upper *int64
	var standby bool
	var xmax, listed int64
	err := conn.QueryRow(ctx, `WITH r AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS ref),
		rel AS (SELECT pr.xmin::text::bigint AS x FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
				WHERE p.pubname = $1 AND pr.prrelid IN (SELECT to_regclass(t) FROM unnest($2::text[]) t)),
		c AS (SELECT x FROM rel
			UNION ALL SELECT xmin::text::bigint FROM pg_publication WHERE pubname = $1
			UNION ALL SELECT xmin::text::bigint FROM pg_class WHERE oid IN (SELECT to_regclass(t) FROM unnest($2::text[]) t))
		SELECT max((r.ref & ~4294967295::bigint) + c.x - CASE WHEN (r.ref & ~4294967295::bigint) + c.x > r.ref THEN 4294967296 ELSE 0 END),
			(SELECT count(*) FROM rel), pg_is_in_recovery(), r.ref FROM c, r GROUP BY r.ref`, s.Publication, tables).Scan(&upper, &listed, &standby, &xmax)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("backfill: read the publication's catalog rows: %w", err)
	}
	if upper != nil && err == nil && listed >= int64(len(tables)) {
		return *upper, nil
	}
	if standby {
		return xmax, nil
	}
	var next int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&next); err != nil {
			return err
		}
		return errRollback
	})
	if err != nil && !errors.Is(err, errRollback) {
		return 0, fmt.Errorf("backfill: read the next transaction id: %w", err)
	}
	return next, nil
}

// waitReplay waits, when the stream reads a standby and the wait ran on the
// primary (conn), until the standby replayed what the primary has written:
// the repair's snapshot, taken there, then sees the commits waited for.
// A standby promoted meanwhile replays no more (pg_last_wal_replay_lsn
// stays where recovery ended) and has every commit it will ever have: no
// wait then.
func (s Source) waitReplay(ctx context.Context, primary *pgx.Conn) error {
	if s.Primary == nil {
		return nil
	}
	var end lsn.LSN
	if err := primary.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&end); err != nil {
		return fmt.Errorf("backfill: read the primary's WAL position: %w", err)
	}
	conn, err := s.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("backfill: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var replayed bool
		if err := conn.QueryRow(ctx, "SELECT NOT pg_is_in_recovery() OR coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, true)", end).Scan(&replayed); err != nil {
			return fmt.Errorf("backfill: read the standby's replay position: %w", err)
		}
		if replayed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errRollback ends a transaction that only read something.
var errRollback = errors.New("rollback")
