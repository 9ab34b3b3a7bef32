package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// Holds keeps each slot's lost-slot repair hold (retention.Hold) in a table
// of the source database beside the history marks: not in the checkpoint,
// whose row or file an operator deletes to get past a refusal, and where
// every instance of a deployment (an active and a standby on file stores
// of their own) sees it. One row per slot; a second loss widens it.
type Holds struct {
	db           *DB
	table        string // quoted
	schema, name string
	slot         string
}

// NewHolds returns the holds of slot in table ("schema.table"), on db (the
// primary).
func NewHolds(db *DB, table, slot string) *Holds {
	schema, name, _ := strings.Cut(table, ".")
	return &Holds{db: db, table: pgx.Identifier{schema, name}.Sanitize(), schema: schema, name: name, slot: slot}
}

// DDL creates the holds table (docs/operations.md has it for an
// administrator to run). since is where verify reads Kafka from for the
// held rows (the last delivered commit before the loss, less a margin).
func (h *Holds) DDL() string {
	return fmt.Sprintf(`CREATE TABLE %s (
	slot      text        PRIMARY KEY,
	from_xid  bigint      NOT NULL,
	below_xid bigint      NOT NULL,
	since     timestamptz,
	set_at    timestamptz NOT NULL DEFAULT now())`, h.table)
}

// Table is the quoted table.
func (h *Holds) Table() string { return h.table }

// Load returns the slot's hold; zero when none (or no table yet).
func (h *Holds) Load(ctx context.Context) (retention.Hold, time.Time, error) {
	conn, err := h.db.connect(ctx)
	if err != nil {
		return retention.Hold{}, time.Time{}, fmt.Errorf("repair hold: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", h.table).Scan(&exists); err != nil || !exists {
		return retention.Hold{}, time.Time{}, err
	}
	var from, below int64
	var since *time.Time
	err = conn.QueryRow(ctx, fmt.Sprintf("SELECT from_xid, below_xid, since FROM %s WHERE slot = $1", h.table), h.slot).Scan(&from, &below, &since)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return retention.Hold{}, time.Time{}, nil
	case err != nil:
		return retention.Hold{}, time.Time{}, fmt.Errorf("repair hold: read: %w", err)
	}
	var t time.Time
	if since != nil {
		t = since.UTC()
	}
	return retention.Hold{From: uint64(from), Below: uint64(below)}, t, nil
}

// Add stores hold, widened to cover the one stored (retention.Hold.Merge),
// creating the table when it is missing.
func (h *Holds) Add(ctx context.Context, hold retention.Hold, since time.Time) error {
	conn, err := h.db.connect(ctx)
	if err != nil {
		return fmt.Errorf("repair hold: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", h.table).Scan(&exists); err != nil {
		return fmt.Errorf("repair hold: look up %s: %w", h.table, err)
	}
	if !exists {
		ddl := fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; %s", pgx.Identifier{h.schema}.Sanitize(),
			strings.Replace(h.DDL(), "CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
		if _, err := conn.Exec(ctx, ddl); err != nil {
			schema := pgx.Identifier{h.schema}.Sanitize()
			return &fault.PrerequisiteError{
				Problem: fmt.Sprintf("the repair holds table %s is missing and this role cannot create it: %v", h.table, err),
				Fix: fmt.Sprintf("have an administrator run: CREATE SCHEMA IF NOT EXISTS %s; %s; GRANT USAGE ON SCHEMA %s TO <role>; "+
					"GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO <role>", schema, h.DDL(), schema, h.table),
			}
		}
	}
	// A hold whose start is unknown (0) stays unknown when widened.
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS h (slot, from_xid, below_xid, since) VALUES ($1, $2, $3, $4)
		ON CONFLICT (slot) DO UPDATE SET from_xid = CASE WHEN h.from_xid = 0 OR excluded.from_xid = 0 THEN 0
				ELSE least(h.from_xid, excluded.from_xid) END,
			below_xid = greatest(h.below_xid, excluded.below_xid),
			since = CASE WHEN h.since IS NULL OR excluded.since IS NULL THEN NULL ELSE least(h.since, excluded.since) END,
			set_at = now()`, h.table), h.slot, int64(hold.From), int64(hold.Below), nullable(since))
	if err != nil {
		return fmt.Errorf("repair hold: save: %w", err)
	}
	return nil
}

// Clear removes the slot's hold if a repair covered it: the stored hold
// lies within covered (it was not widened by a loss since the repair
// read it). It reports whether a hold was removed.
func (h *Holds) Clear(ctx context.Context, covered retention.Hold) (bool, error) {
	conn, err := h.db.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("repair hold: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE slot = $1 AND from_xid >= $2 AND below_xid <= $3", h.table),
		h.slot, int64(covered.From), int64(covered.Below))
	if err != nil {
		return false, fmt.Errorf("repair hold: clear: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// NextXid reads the primary's next transaction id: every transaction that
// committed so far has an id below it.
func (h *Holds) NextXid(ctx context.Context) (uint64, error) {
	conn, err := h.db.connect(ctx)
	if err != nil {
		return 0, fmt.Errorf("repair hold: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var x int64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&x); err != nil {
		return 0, fmt.Errorf("repair hold: read the next xid: %w", err)
	}
	return uint64(x), nil
}
