package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The heartbeat the monitor writes (monitor.go): a non-transactional
// logical message that gives the walsender WAL of this database to decode.

// HeartbeatPrefix is the logical message prefix of heartbeats.
const HeartbeatPrefix = "outbox-cdc-heartbeat"

// ErrHeartbeatDenied is returned by Heartbeat.Beat when the role may not
// call pg_logical_emit_message.
var ErrHeartbeatDenied = errors.New("heartbeat denied")

// Heartbeat writes heartbeats on a connection of its own, opened on first
// use and after errors. Use it from one goroutine.
type Heartbeat struct {
	db   *DB
	conn *pgx.Conn
}

// NewHeartbeat returns a Heartbeat on db.
func NewHeartbeat(db *DB) *Heartbeat { return &Heartbeat{db: db} }

// Beat writes one heartbeat. Non-transactional: it is written even with no
// transaction, so the walsender has WAL of this database to decode and
// report. Errors other than ErrHeartbeatDenied are transient: the stream
// reports connection trouble.
func (h *Heartbeat) Beat(ctx context.Context) error {
	if h.conn == nil || h.conn.IsClosed() {
		c, err := h.db.connect(ctx)
		if err != nil {
			return fmt.Errorf("heartbeat: connect: %w", err)
		}
		h.conn = c
	}
	_, err := h.conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, '')", HeartbeatPrefix)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return ErrHeartbeatDenied
	case err != nil && ctx.Err() == nil:
		h.Close()
	}
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Close releases the connection.
func (h *Heartbeat) Close() {
	if h.conn != nil {
		h.conn.Close(context.Background())
		h.conn = nil
	}
}
