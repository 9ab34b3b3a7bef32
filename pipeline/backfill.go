package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// backfill is the repair of a gap: rows written while the outbox was outside
// the publication (removed from it, or dropped and created again) were never
// decoded, and PostgreSQL will not decode them on a second read either. They
// are still in the table. A restart after the fix reads them there and
// publishes them where the stream reaches the gap, so per aggregate they
// come after everything the stream delivered before the gap.
type backfill struct {
	gapInfo
	done bool
	// skip holds the transaction ids whose rows were backfilled: the stream
	// decodes some of them too (those written while the table was in the
	// publication), and they are delivered already.
	skip map[uint32]bool
	// clearAt is a WAL position past the commit of every backfilled row:
	// once the watermark passes it the gap is repaired.
	clearAt lsn.LSN
}

// due reports whether the stream has reached the gap: a transaction that
// commits at or after its start, or a keepalive past it between
// transactions.
func (b *backfill) due(pos lsn.LSN) bool { return b != nil && !b.done && pos >= b.Since }

// delivered reports whether the backfill published the rows of transaction
// xid already.
func (b *backfill) delivered(xid uint32) bool { return b != nil && b.done && b.skip[xid] }

// xid8 is the full (64-bit) id of the transaction that wrote a row, from its
// 32-bit xmin and ref, a full transaction id at least as new as any row's:
// the epoch is ref's, or the one before when that would put the row after
// ref.
func xid8(ref uint64) string {
	full := "(" + strconv.FormatUint(ref&^0xffffffff, 10) + " + xmin::text::bigint)"
	return fmt.Sprintf("(%s - CASE WHEN %s > %d THEN 4294967296 ELSE 0 END)", full, full, ref)
}

// xidFilter selects the rows written by transactions at or after xmin8.
func xidFilter(ref, xmin8 uint64) string { return fmt.Sprintf("%s >= %d", xid8(ref), xmin8) }

// runBackfill publishes the gap's rows as one tracked pseudo-transaction
// ending at end (the last position dispatched, so the watermark cannot pass
// the stream), in the snapshot order.
func (p *Pipeline) runBackfill(ctx, produceCtx context.Context, b *backfill, end lsn.LSN) error {
	tx, done, err := p.readTx(ctx)
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	defer done()
	// The first statement fixes the snapshot; the WAL position read in it
	// is past every commit the snapshot sees.
	var ref uint64
	var at string
	if err := tx.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_current_wal_lsn()::text").
		Scan(&ref, &at); err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	if b.clearAt, err = lsn.Parse(at); err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	filter := xidFilter(ref, b.Xmin)
	table := pgx.Identifier{p.cfg.Source.Schema, p.cfg.Source.Table}.Sanitize()
	xids, err := tx.Query(ctx, "SELECT DISTINCT xmin::text::bigint FROM "+table+" WHERE "+filter)
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	ids, err := pgx.CollectRows(xids, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	b.skip = make(map[uint32]bool, len(ids))
	for _, x := range ids {
		b.skip[uint32(x)] = true
	}
	// Per aggregate, a writer's transactions get increasing ids; the stream
	// delivers in commit order, which for one aggregate's serialized writes
	// is the same. Within a transaction, ctid is insertion order.
	query, err := p.rowsQuery(ctx, tx, filter, []string{xid8(ref), "ctid"})
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("backfill: %s: %w", query, err)
	}
	defer rows.Close()
	txn := p.tracker.Begin()
	n, err := p.publishRows(produceCtx, rows, txn, time.Now(), p.m.BackfilledEvents.Inc)
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	p.tracker.Commit(txn, end)
	b.done = true
	p.gapClear.Store(uint64(b.clearAt))
	p.log.Warn("published the rows written while the outbox was outside the publication",
		"rows", n, "since", b.Since, "transactions", len(b.skip))
	return nil
}

// readTx opens a connection and a read-only repeatable-read transaction on
// it, for the snapshot and the backfill; done ends both.
func (p *Pipeline) readTx(ctx context.Context) (pgx.Tx, func(), error) {
	conn, err := pgx.Connect(ctx, p.cfg.Source.DSN)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("begin: %w", err)
	}
	return tx, func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		conn.Close(context.WithoutCancel(ctx))
	}, nil
}

// publishRows publishes rows selected by rowsQuery as events of txn,
// calling counted after each one.
func (p *Pipeline) publishRows(ctx context.Context, rows pgx.Rows, txn *offsets.Txn, at time.Time, counted func()) (int, error) {
	var rec router.Record
	n := 0
	for rows.Next() {
		ev, err := p.scanEvent(rows)
		if err != nil {
			return n, err
		}
		if err := p.publish(ctx, txn, at, &ev, nil, &rec); err != nil {
			return n, err
		}
		counted()
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read rows: %w", err)
	}
	return n, nil
}

// rowsQuery selects the mapped columns as text, the payload as bytes (bytea
// raw, other types in their text form), of the rows matching filter (SQL,
// "" for all), ordered by order (columns, or expressions in parentheses).
// It is the query of the snapshot and of the backfill.
func (p *Pipeline) rowsQuery(ctx context.Context, tx pgx.Tx, filter string, order []string) (string, error) {
	m, src := p.cfg.Mapping, p.cfg.Source
	var payloadType string
	err := tx.QueryRow(ctx, `SELECT format_type(atttypid, NULL) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped`,
		pgx.Identifier{src.Schema, src.Table}.Sanitize(), m.Payload).Scan(&payloadType)
	if err != nil {
		return "", fmt.Errorf("payload column %s: %w", m.Payload, err)
	}
	return snapshotSQL(m, src.Schema, src.Table, payloadType == "bytea", filter, order), nil
}

// scanEvent reads one row of rowsQuery.
func (p *Pipeline) scanEvent(rows pgx.Rows) (decode.Event, error) {
	var vals [4]*string
	var payload []byte
	hdrs := make([]*string, len(p.cfg.Mapping.HeaderColumns))
	dest := []any{&vals[0], &vals[1], &vals[2], &vals[3], &payload}
	for i := range hdrs {
		dest = append(dest, &hdrs[i])
	}
	if err := rows.Scan(dest...); err != nil {
		return decode.Event{}, fmt.Errorf("scan: %w", err)
	}
	ev := decode.Event{ID: strValue(vals[0]), AggregateType: strValue(vals[1]), AggregateID: strValue(vals[2]),
		EventType: strValue(vals[3]), Payload: decode.Value{Bytes: payload, Null: payload == nil}}
	for i, h := range p.cfg.Mapping.HeaderColumns {
		ev.Headers = append(ev.Headers, decode.Header{Name: h, Value: strValue(hdrs[i])})
	}
	return ev, nil
}
