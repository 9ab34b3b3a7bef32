// Package inventory is the consuming side of the adoption example: an
// inventory service that reserves stock for every OrderPlaced event published
// by examples/orders, exactly once per event, with the inbox package.
//
// The handler does its work in the inbox transaction: the stock update, the
// reservation row and the inbox row commit together. An order that cannot be
// served (unknown SKU, not enough stock, a payload it cannot read) is a
// business outcome, recorded as a rejected reservation, not an error: an
// error would be retried for ever and hold up the partition.
//
// The command is examples/inventory/cmd/inventory; internal/demo runs this
// code in-process (make demo).
package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Defaults of the service.
const (
	// Consumer is the consumer group and the inbox consumer_name.
	Consumer = "inventory"
	// Topic is where outbox-cdc publishes order events (default template
	// outbox.event.{aggregate_type}).
	Topic = "outbox.event.order"
)

// Schema creates the service's tables; the inbox table is created by
// EnsureSchema with inbox.CreateTable.
const Schema = `CREATE TABLE IF NOT EXISTS stock (
  sku       text    PRIMARY KEY,
  available integer NOT NULL CHECK (available >= 0),
  reserved  integer NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS reservations (
  order_id   text        PRIMARY KEY,
  sku        text        NOT NULL,
  quantity   integer     NOT NULL,
  status     text        NOT NULL,
  event_id   text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);`

// EnsureSchema creates the stock, reservations and inbox tables.
func EnsureSchema(ctx context.Context, db inbox.Execer) error {
	if _, err := db.Exec(ctx, Schema); err != nil {
		return err
	}
	return inbox.CreateTable(ctx, db, inbox.DefaultTable)
}

// Seed sets the available stock of each SKU.
func Seed(ctx context.Context, db inbox.Execer, stock map[string]int) error {
	for sku, n := range stock {
		if _, err := db.Exec(ctx, `INSERT INTO stock (sku, available) VALUES ($1, $2)
			ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available`, sku, n); err != nil {
			return err
		}
	}
	return nil
}

// orderPlaced is the part of the order service's OrderPlaced payload this
// service reads.
type orderPlaced struct {
	OrderID  string `json:"order_id"`
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// Reservation statuses.
const (
	Reserved  = "reserved"
	Rejected  = "rejected"  // unknown SKU or not enough stock
	Invalid   = "invalid"   // payload not readable
	Cancelled = "cancelled" // the order was cancelled; its stock released
)

// Handle is the inbox.Handler: it reserves stock for an OrderPlaced event,
// releases it for an OrderCancelled one (cancel) and ignores the order
// aggregate's other event types. It runs once per event id; the reservations
// primary key (order_id) is a second line of defence should the same order
// arrive under another event id (the business-key layer), the reservation's
// status a third (the state machine layer, cancel).
func Handle(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
	switch et, _ := inbox.Header(rec, wire.HeaderEventType); et {
	case "OrderPlaced":
	case "OrderCancelled":
		return cancel(ctx, tx, rec)
	default:
		return nil
	}
	var ev orderPlaced
	if err := json.Unmarshal(rec.Value, &ev); err != nil || ev.OrderID == "" || ev.Quantity <= 0 {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity, status, event_id)
			VALUES ($1, '', 0, $2, $3) ON CONFLICT DO NOTHING`, string(rec.Key), Invalid, inbox.EventID(rec))
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity, status, event_id)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, ev.OrderID, ev.SKU, ev.Quantity, Reserved, inbox.EventID(rec))
	if err != nil {
		return fmt.Errorf("insert reservation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil // this order was reserved before
	}
	tag, err = tx.Exec(ctx, `UPDATE stock SET available = available - $2, reserved = reserved + $2
		WHERE sku = $1 AND available >= $2`, ev.SKU, ev.Quantity)
	if err != nil {
		return fmt.Errorf("reserve stock: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := tx.Exec(ctx, `UPDATE reservations SET status = $2 WHERE order_id = $1`, ev.OrderID, Rejected); err != nil {
			return fmt.Errorf("reject reservation: %w", err)
		}
	}
	return nil
}

// Config returns the inbox configuration of the service; callers may adjust
// it (KafkaOptions, Logger …) before inbox.New.
func Config(brokers []string, db inbox.DB, reg prometheus.Registerer, log *slog.Logger) inbox.Config {
	return inbox.Config{
		Brokers:    brokers,
		Group:      Consumer,
		Topics:     []string{Topic},
		Consumer:   Consumer,
		DB:         db,
		Handler:    Handle,
		Registerer: reg,
		Logger:     log,
	}
}

// Stock is one row of the stock table.
type Stock struct {
	SKU                 string
	Available, Reserved int
}

// StockLevels returns the stock table ordered by SKU.
func StockLevels(ctx context.Context, db Querier) ([]Stock, error) {
	rows, err := db.Query(ctx, `SELECT sku, available, reserved FROM stock ORDER BY sku`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Stock])
}

// Reservation is one row of the reservations table.
type Reservation struct {
	OrderID, SKU string
	Quantity     int
	Status       string
}

// Reservations returns the reservations in the order they were made.
func Reservations(ctx context.Context, db Querier) ([]Reservation, error) {
	rows, err := db.Query(ctx, `SELECT order_id, sku, quantity, status FROM reservations ORDER BY created_at, order_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Reservation])
}

// Querier runs a query: *pgxpool.Pool, *pgx.Conn, pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// cancel handles OrderCancelled: the state machine layer of idempotency. Only
// a reserved order gives its stock back (reserved -> cancelled); a cancelled,
// rejected or invalid one has nothing to release, so a repeated cancellation
// (under any event id) changes nothing. A cancellation that arrives before
// its order (another producer, a repair) records the order as cancelled, so
// the late OrderPlaced finds the row and reserves nothing.
func cancel(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
	orderID := string(rec.Key)
	var sku string
	var qty int
	err := tx.QueryRow(ctx, `UPDATE reservations SET status = $2 WHERE order_id = $1 AND status = $3
		RETURNING sku, quantity`, orderID, Cancelled, Reserved).Scan(&sku, &qty)
	switch {
	case err == nil:
		if _, err := tx.Exec(ctx, `UPDATE stock SET available = available + $2, reserved = reserved - $2 WHERE sku = $1`, sku, qty); err != nil {
			return fmt.Errorf("release stock: %w", err)
		}
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		_, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity, status, event_id)
			VALUES ($1, '', 0, $2, $3) ON CONFLICT DO NOTHING`, orderID, Cancelled, inbox.EventID(rec))
		return err
	default:
		return fmt.Errorf("cancel reservation: %w", err)
	}
}
