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
	"github.com/outbox-cdc/outbox-cdc/router"
)

// snapshot publishes the rows already in the outbox table, read in the
// snapshot the new slot exported: exactly what was committed before the
// slot's first change, so there is neither a gap nor a duplicate at the
// cut-over. It returns once every row is acknowledged, before streaming.
func (p *Pipeline) snapshot(ctx, produceCtx context.Context, snap *replication.ExportedSnapshot) error {
	defer snap.Close(context.WithoutCancel(ctx))
	conn, err := pgx.Connect(ctx, p.cfg.Source.DSN)
	if err != nil {
		return fmt.Errorf("snapshot: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("snapshot: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snap.Name)); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	query, err := p.snapshotQuery(ctx, tx)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, query)
	if err != nil {
		return fmt.Errorf("snapshot: %s: %w", query, err)
	}
	defer rows.Close()

	// Snapshot rows carry the snapshot's time: their commit times are gone.
	at := time.Now()
	txn := p.tracker.Begin()
	nh := len(p.cfg.Mapping.HeaderColumns)
	var rec router.Record
	n := 0
	for rows.Next() {
		vals := make([]*string, 4)
		var payload []byte
		hdrs := make([]*string, nh)
		dest := []any{&vals[0], &vals[1], &vals[2], &vals[3], &payload}
		for i := range hdrs {
			dest = append(dest, &hdrs[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("snapshot: scan: %w", err)
		}
		ev := decode.Event{ID: strValue(vals[0]), AggregateType: strValue(vals[1]), AggregateID: strValue(vals[2]),
			EventType: strValue(vals[3]), Payload: decode.Value{Bytes: payload, Null: payload == nil}}
		for i, h := range p.cfg.Mapping.HeaderColumns {
			ev.Headers = append(ev.Headers, decode.Header{Name: h, Value: strValue(hdrs[i])})
		}
		if err := p.publish(produceCtx, txn, at, &ev, nil, &rec); err != nil {
			return err
		}
		p.m.SnapshotEvents.Inc()
		n++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("snapshot: read: %w", err)
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
		if err := p.cfg.Checkpoints.Save(ctx, offsets.Checkpoint{LSN: max(p.tracker.Acked(), snap.ConsistentPoint), SnapshotDone: true}); err != nil {
			return fmt.Errorf("snapshot: save checkpoint: %w", err)
		}
	}
	p.snapDone.Store(true)
	p.log.Info("snapshot published", "rows", n, "consistent_point", snap.ConsistentPoint)
	return nil
}

// snapshotQuery selects the mapped columns as text, the payload as bytes
// (bytea raw, other types in their text form), in insertion order when the
// table has a created_at column.
func (p *Pipeline) snapshotQuery(ctx context.Context, tx pgx.Tx) (string, error) {
	m, src := p.cfg.Mapping, p.cfg.Source
	table := pgx.Identifier{src.Schema, src.Table}.Sanitize()
	var payloadType string
	var hasCreated bool
	err := tx.QueryRow(ctx, `SELECT format_type(a.atttypid, NULL),
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = a.attrelid AND attname = 'created_at' AND NOT attisdropped)
		FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`,
		table, m.Payload).Scan(&payloadType, &hasCreated)
	if err != nil {
		return "", fmt.Errorf("snapshot: payload column %s: %w", m.Payload, err)
	}
	text := func(col string) string { return pgx.Identifier{col}.Sanitize() + "::text" }
	cols := []string{text(m.ID), text(m.AggregateType), text(m.AggregateID), text(m.EventType)}
	if payloadType == "bytea" {
		cols = append(cols, pgx.Identifier{m.Payload}.Sanitize())
	} else {
		cols = append(cols, "convert_to("+text(m.Payload)+", 'UTF8')")
	}
	for _, h := range m.HeaderColumns {
		cols = append(cols, text(h))
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + table
	if f := strings.TrimSpace(p.cfg.SnapshotFilter); f != "" {
		q += " WHERE (" + f + ")"
	}
	if hasCreated {
		q += " ORDER BY created_at"
	}
	return q, nil
}

func strValue(s *string) decode.Value {
	if s == nil {
		return decode.Value{Null: true}
	}
	return decode.Value{Bytes: []byte(*s)}
}
