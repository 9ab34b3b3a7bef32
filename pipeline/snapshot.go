package pipeline

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// snapshot publishes the rows already in the outbox table, read in the
// snapshot the new slot exported: exactly what was committed before the
// slot's first change, so there is neither a gap nor a duplicate at the
// cut-over. It returns once every row is acknowledged, before streaming.
func (p *Pipeline) snapshot(ctx, produceCtx context.Context, snap *replication.ExportedSnapshot) error {
	defer snap.Close(context.WithoutCancel(ctx))
	tx, done, err := p.readTx(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer done()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snap.Name)); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	order, err := p.snapshotOrder(ctx, tx)
	if err != nil {
		return err
	}
	query, err := p.rowsQuery(ctx, tx, p.cfg.SnapshotFilter, order)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("snapshot: %s: %w", query, err)
	}
	defer rows.Close()

	// Snapshot rows carry the snapshot's time: their commit times are gone.
	txn := p.tracker.Begin()
	n, err := p.publishRows(produceCtx, rows, txn, time.Now(), p.m.SnapshotEvents.Inc)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	p.tracker.Commit(txn, snap.ConsistentPoint)
	p.log.Info("snapshot rows produced; waiting for acknowledgements", "rows", n)

	for p.tracker.InFlight() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if p.cfg.Checkpoints != nil {
		// Replace: the marker this run saved before creating the slot is
		// the one to overwrite, whatever position it held.
		if err := p.cfg.Checkpoints.Replace(ctx, offsets.Checkpoint{LSN: max(p.tracker.Acked(), snap.ConsistentPoint), SnapshotDone: true}); err != nil {
			return fmt.Errorf("snapshot: save checkpoint: %w", err)
		}
	}
	p.snapDone.Store(true)
	p.log.Info("snapshot published", "rows", n, "consistent_point", snap.ConsistentPoint)
	return nil
}

// snapshotSQL builds the snapshot query.
func snapshotSQL(m decode.Mapping, schema, table string, payloadBytea bool, filter string, order []string) string {
	text := func(col string) string { return pgx.Identifier{col}.Sanitize() + "::text" }
	cols := []string{text(m.ID), text(m.AggregateType), text(m.AggregateID), text(m.EventType)}
	if payloadBytea {
		cols = append(cols, pgx.Identifier{m.Payload}.Sanitize())
	} else {
		cols = append(cols, "convert_to("+text(m.Payload)+", 'UTF8')")
	}
	for _, h := range m.HeaderColumns {
		cols = append(cols, text(h))
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + pgx.Identifier{schema, table}.Sanitize()
	if f := strings.TrimSpace(filter); f != "" {
		q += " WHERE (" + f + ")"
	}
	if len(order) > 0 {
		quoted := make([]string, len(order))
		for i, c := range order {
			quoted[i] = pgx.Identifier{c}.Sanitize()
			if strings.HasPrefix(c, "(") { // an expression (the backfill's transaction order)
				quoted[i] = c
			}
		}
		q += " ORDER BY " + strings.Join(quoted, ", ")
	}
	return q
}

// rowQuerier is a connection or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// snapshotOrder returns the snapshot's ORDER BY columns: snapshot.order_by,
// then the primary key (pg_index), which makes the order total and the same
// on every run. A table without a primary key needs snapshot.order_by.
func (p *Pipeline) snapshotOrder(ctx context.Context, q rowQuerier) ([]string, error) {
	src := p.cfg.Source
	table := pgx.Identifier{src.Schema, src.Table}.Sanitize()
	var pk []string
	// indkey is an int2vector, subscripted from 0; the key columns come first.
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text ORDER BY k), '{}')
		FROM pg_index i CROSS JOIN generate_series(0, i.indnkeyatts - 1) k
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k]
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary`, table).Scan(&pk)
	if err != nil {
		return nil, fmt.Errorf("snapshot: primary key of %s: %w", table, err)
	}
	by := p.cfg.SnapshotOrderBy
	// Without snapshot.order_by, created_at (the column of sql/outbox.sql,
	// set at insert) keeps each aggregate's events in the order they were
	// written, which a random uuid key does not.
	want := by
	if want == "" {
		want = "created_at"
	}
	var exists bool
	err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped)`, table, want).Scan(&exists)
	if err != nil {
		return nil, fmt.Errorf("snapshot: column %s: %w", want, err)
	}
	switch {
	case exists:
		by = want
	case by != "":
		return nil, &replication.PrerequisiteError{Problem: fmt.Sprintf("snapshot.order_by: %s has no column %s", table, by),
			Fix: "set snapshot.order_by to a column of the outbox table, or leave it empty to order by created_at or the primary key"}
	}
	order := orderColumns(by, pk)
	if len(order) == 0 {
		return nil, &replication.PrerequisiteError{Problem: fmt.Sprintf("%s has no primary key, so its snapshot has no stable order", table),
			Fix: "set snapshot.order_by to a column such as created_at, or add a primary key"}
	}
	return order, nil
}

// orderColumns is by (if set) and ctid, followed by the primary key columns
// not already in it. Rows of one transaction share created_at (now() is the
// transaction's start); ctid, the row's place in the heap, keeps them in the
// order they were inserted, where a random key would shuffle them.
func orderColumns(by string, pk []string) []string {
	var out []string
	if by != "" {
		out = append(out, by, "ctid")
	}
	for _, c := range pk {
		if c != by {
			out = append(out, c)
		}
	}
	return out
}

// checkSnapshotOrder finds the snapshot order before the slot is created, so
// a table that has none is refused before anything changes.
func (p *Pipeline) checkSnapshotOrder(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.cfg.Source.DSN)
	if err != nil {
		return fmt.Errorf("snapshot: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = p.snapshotOrder(ctx, conn)
	return err
}

func strValue(s *string) decode.Value {
	if s == nil {
		return decode.Value{Null: true}
	}
	return decode.Value{Bytes: []byte(*s)}
}
