// Package orders is the producing side of the adoption example: an order
// service that stores an order and its OrderPlaced event in one PostgreSQL
// transaction with the outbox package. outbox-cdc then publishes the event to
// the topic outbox.event.order (key = order id), where examples/inventory
// consumes it.
//
// The command is examples/orders/cmd/orders; internal/demo runs this code
// in-process (make demo).
package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// AggregateType is the aggregate_type of order events: with the connector's
// default topic template they go to outbox.event.order.
const AggregateType = "order"

// EventOrderPlaced is the event_type of a new order.
const EventOrderPlaced = "OrderPlaced"

// EventOrderCancelled is the event_type of a cancelled order.
const EventOrderCancelled = "OrderCancelled"

// OrderCancelled is the payload of EventOrderCancelled (JSON).
type OrderCancelled struct {
	OrderID string `json:"order_id"`
}

// Schema creates the service's orders table and the outbox table
// (sql/outbox.sql) if missing.
const Schema = `CREATE TABLE IF NOT EXISTS orders (
  id         text        PRIMARY KEY,
  customer   text        NOT NULL,
  sku        text        NOT NULL,
  quantity   integer     NOT NULL CHECK (quantity > 0),
  status     text        NOT NULL DEFAULT 'placed',
  created_at timestamptz NOT NULL DEFAULT now()
);
` + outbox.TableDDL

// DB is what the service needs from PostgreSQL: *pgxpool.Pool or *pgx.Conn.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Order is a placed order.
type Order struct {
	ID       string    `json:"id"`
	Customer string    `json:"customer"`
	SKU      string    `json:"sku"`
	Quantity int       `json:"quantity"`
	PlacedAt time.Time `json:"placed_at"`
}

// OrderPlaced is the event payload (JSON). It is the service's published
// contract: consumers decode it with their own types.
type OrderPlaced struct {
	OrderID  string    `json:"order_id"`
	Customer string    `json:"customer"`
	SKU      string    `json:"sku"`
	Quantity int       `json:"quantity"`
	PlacedAt time.Time `json:"placed_at"`
}

// Service places orders.
type Service struct {
	DB DB
	// Outbox writes the events; nil uses the contract defaults
	// (public.outbox).
	Outbox *outbox.Writer
}

// EnsureSchema creates the tables (Schema).
func (s *Service) EnsureSchema(ctx context.Context) error {
	_, err := s.DB.Exec(ctx, Schema)
	return err
}

// Place stores a new order and its OrderPlaced event atomically: both are
// committed, or neither is.
func (s *Service) Place(ctx context.Context, customer, sku string, quantity int) (Order, error) {
	if customer == "" || sku == "" || quantity <= 0 {
		return Order{}, errors.New("orders: customer, sku and a positive quantity are required")
	}
	o := Order{ID: "ord-" + uuid.NewString(), Customer: customer, SKU: sku, Quantity: quantity}
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return Order{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit

	if err := tx.QueryRow(ctx, `INSERT INTO orders (id, customer, sku, quantity) VALUES ($1, $2, $3, $4)
		RETURNING created_at`, o.ID, o.Customer, o.SKU, o.Quantity).Scan(&o.PlacedAt); err != nil {
		return Order{}, fmt.Errorf("orders: insert: %w", err)
	}
	ev := outbox.Event{
		AggregateType: AggregateType,
		AggregateID:   o.ID,
		EventType:     EventOrderPlaced,
		Payload:       OrderPlaced{OrderID: o.ID, Customer: o.Customer, SKU: o.SKU, Quantity: o.Quantity, PlacedAt: o.PlacedAt},
	}
	w := s.Outbox
	if w == nil {
		err = outbox.Write(ctx, tx, ev)
	} else {
		err = w.Write(ctx, tx, ev)
	}
	if err != nil {
		return Order{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return Order{}, fmt.Errorf("orders: commit: %w", err)
	}
	return o, nil
}

// Cancel cancels a placed order and writes its OrderCancelled event in the
// same transaction. An order that is not placed (unknown, cancelled before)
// is an error, and no event is written.
func (s *Service) Cancel(ctx context.Context, orderID string) error {
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	tag, err := tx.Exec(ctx, `UPDATE orders SET status = 'cancelled' WHERE id = $1 AND status = 'placed'`, orderID)
	if err != nil {
		return fmt.Errorf("orders: cancel: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("orders: cancel %s: no placed order", orderID)
	}
	ev := outbox.Event{AggregateType: AggregateType, AggregateID: orderID, EventType: EventOrderCancelled,
		Payload: OrderCancelled{OrderID: orderID}}
	if s.Outbox == nil {
		err = outbox.Write(ctx, tx, ev)
	} else {
		err = s.Outbox.Write(ctx, tx, ev)
	}
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("orders: commit: %w", err)
	}
	return nil
}
