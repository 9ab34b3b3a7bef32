// Command inventory runs the example inventory service: it consumes the
// order service's events from Kafka with the inbox package and reserves stock
// once per event, serves its metrics, and deletes inbox rows older than the
// retention once an hour.
//
//	go run ./examples/inventory/cmd/inventory -dsn postgres://app:app@127.0.0.1:5432/app \
//	    -brokers 127.0.0.1:9092 -init -seed sku-apple=10,sku-pear=5
//
// Flags fall back to the environment: INVENTORY_DSN (or DATABASE_URL),
// KAFKA_BROKERS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-cdc/outbox-cdc/examples/inventory"
	"github.com/outbox-cdc/outbox-cdc/inbox"
)

func main() {
	dsn := flag.String("dsn", env("INVENTORY_DSN", env("DATABASE_URL", "postgres://app:app@127.0.0.1:5432/app?sslmode=disable")), "PostgreSQL DSN of the inventory service (env INVENTORY_DSN, DATABASE_URL)")
	brokers := flag.String("brokers", env("KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka brokers, comma separated (env KAFKA_BROKERS)")
	group := flag.String("group", inventory.Consumer, "consumer group (and inbox consumer_name)")
	topic := flag.String("topic", inventory.Topic, "topic of the order events")
	metricsAddr := flag.String("metrics-listen", "127.0.0.1:9188", `serve /metrics here ("" disables)`)
	initSchema := flag.Bool("init", false, "create the stock, reservations and inbox tables if missing")
	seed := flag.String("seed", "", "set stock levels, e.g. sku-apple=10,sku-pear=5")
	retention := flag.Duration("inbox-retention", 14*24*time.Hour, "delete inbox rows older than this; must exceed the topic's retention and any replay window (docs/guide.md)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, *dsn, strings.Split(*brokers, ","), *group, *topic, *metricsAddr, *initSchema, *seed, *retention); err != nil {
		log.Error("inventory stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, dsn string, brokers []string, group, topic, metricsAddr string,
	initSchema bool, seed string, retention time.Duration) error {
	// A pool, not a *pgx.Conn: it replaces the connections a database
	// restart or failover closes (inbox.New refuses a *pgx.Conn). The
	// consumer uses one connection at a time, Cleanup another.
	conn, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close()
	if initSchema {
		if err := inventory.EnsureSchema(ctx, conn); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	if seed != "" {
		stock, err := parseSeed(seed)
		if err != nil {
			return err
		}
		if err := inventory.Seed(ctx, conn, stock); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	if metricsAddr != "" {
		srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics endpoint", "err", err)
			}
		}()
		defer srv.Close()
	}

	cfg := inventory.Config(brokers, conn, reg, log)
	cfg.Group, cfg.Consumer, cfg.Topics = group, group, []string{topic}
	c, err := inbox.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	go cleanupLoop(ctx, log, c, conn, retention)
	log.Info("inventory consuming", "topic", topic, "group", group, "brokers", brokers)
	return c.Run(ctx)
}

// cleanupLoop deletes expired inbox rows every hour.
func cleanupLoop(ctx context.Context, log *slog.Logger, c *inbox.Consumer, db inbox.Execer, retention time.Duration) {
	tick := time.NewTicker(time.Hour)
	defer tick.Stop()
	for {
		// Only this consumer's rows: services sharing the table keep theirs.
		n, err := c.Cleanup(ctx, db, retention)
		if err != nil {
			log.Warn("inbox cleanup", "err", err)
		} else if n > 0 {
			log.Info("inbox cleanup", "deleted", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func parseSeed(s string) (map[string]int, error) {
	stock := map[string]int{}
	for item := range strings.SplitSeq(s, ",") {
		sku, n, ok := strings.Cut(strings.TrimSpace(item), "=")
		q, err := strconv.Atoi(n)
		if !ok || sku == "" || err != nil || q < 0 {
			return nil, fmt.Errorf("-seed: %q is not sku=quantity", item)
		}
		stock[sku] = q
	}
	return stock, nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
