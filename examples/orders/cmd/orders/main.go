// Command orders places orders with the example order service: each order
// row and its OrderPlaced outbox event are written in one transaction, and a
// running outbox-cdc publishes the event to Kafka.
//
//	go run ./examples/orders/cmd/orders -dsn postgres://app:app@127.0.0.1:5432/app -init \
//	    -customer alice -sku sku-apple -qty 2 -n 3
//
// Flags fall back to the environment: ORDERS_DSN (or DATABASE_URL).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/examples/orders"
)

func main() {
	dsn := flag.String("dsn", env("ORDERS_DSN", env("DATABASE_URL", "postgres://app:app@127.0.0.1:5432/app?sslmode=disable")), "PostgreSQL DSN of the order service (env ORDERS_DSN, DATABASE_URL)")
	initSchema := flag.Bool("init", false, "create the orders and outbox tables if missing")
	customer := flag.String("customer", "alice", "customer")
	sku := flag.String("sku", "sku-apple", "stock keeping unit")
	qty := flag.Int("qty", 1, "quantity per order")
	n := flag.Int("n", 1, "number of orders to place")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *initSchema, *customer, *sku, *qty, *n); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn string, initSchema bool, customer, sku string, qty, n int) error {
	// One connection is enough for a command; a server would use a
	// *pgxpool.Pool, which satisfies orders.DB too.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	svc := &orders.Service{DB: conn}
	if initSchema {
		if err := svc.EnsureSchema(ctx); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	for range n {
		o, err := svc.Place(ctx, customer, sku, qty)
		if err != nil {
			return err
		}
		fmt.Printf("placed %s: %s x%d for %s (order row + OrderPlaced outbox event, one transaction)\n", o.ID, o.SKU, o.Quantity, o.Customer)
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
