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
// before the change that brought the table back committed, so its id is
// below the next id of that moment; the catalog rows that change wrote
// (gapCatalogXid) give it. A transaction that began after it writes with
// the table in the publication, and is decoded: the repair need not wait
// for it. It waits as long as they run (an idle-in-transaction session
// holds the repair, and with it the stream, back), saying which every
// gapWaitLog.
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
	const running = "SELECT coalesce(array_agg(x::text::bigint), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) x " +
		"WHERE x::text::bigint >= $1 AND x::text::bigint <= $2"
	logged := time.Now()
	for {
		var open []int64
		if err := conn.QueryRow(ctx, running, int64(xmin), upper).Scan(&open); err != nil {
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
