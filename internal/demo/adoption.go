package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/examples/inventory"
	"github.com/outbox-cdc/outbox-cdc/examples/orders"
	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// adoptionKit shows the application side while the connector runs: the
// example order service writes orders and their outbox events in one
// transaction, the connector publishes them, and the example inventory
// service consumes them through the inbox; one record is then produced again
// and the inbox skips it.
func adoptionKit(ctx context.Context, pg *testenv.Postgres, brokers []string, shopDSN string) error {
	say("\nadoption kit: order service -> outbox -> outbox-cdc -> Kafka -> inventory service (inbox) ...")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	a := &adoption{brokers: brokers, reg: prometheus.NewRegistry()}
	defer a.close()
	if err := a.setup(ctx, pg, shopDSN); err != nil {
		return err
	}
	stop, err := a.startInventory(ctx)
	if err != nil {
		return err
	}
	defer stop() //nolint:errcheck // on the error paths only
	if err := a.placeOrders(ctx); err != nil {
		return err
	}
	if err := a.redeliver(ctx); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	return a.report(ctx)
}

// adoption is the kit's two services: the order service's database, the
// inventory service's (its queries and its consumer's pool), an admin
// client, and what the inventory handler saw.
type adoption struct {
	brokers     []string
	svc         *orders.Service
	shop        *pgx.Conn
	invQuery    *pgx.Conn
	invConsumer *pgxpool.Pool
	admCl       *kgo.Client
	reg         *prometheus.Registry

	mu      sync.Mutex
	handled []*kgo.Record
}

func (a *adoption) close() {
	if a.admCl != nil {
		a.admCl.Close()
	}
	if a.invConsumer != nil {
		a.invConsumer.Close()
	}
	if a.invQuery != nil {
		a.invQuery.Close(context.Background())
	}
	if a.shop != nil {
		a.shop.Close(context.Background())
	}
}

func (a *adoption) counter(name string) float64 { return counterValue(a.reg, name) }

// setup creates both services' schemas, seeds the stock and starts the
// inventory group at the topic's end.
func (a *adoption) setup(ctx context.Context, pg *testenv.Postgres, shopDSN string) error {
	var err error
	if a.shop, err = pgx.Connect(ctx, shopDSN); err != nil {
		return err
	}
	a.svc = &orders.Service{DB: a.shop}
	if err := a.svc.EnsureSchema(ctx); err != nil {
		return fmt.Errorf("orders schema: %w", err)
	}
	// The inventory service has its own database: the inbox lives next to
	// the data it protects.
	invDSN, err := pg.CreateDatabase(ctx, "inventory")
	if err != nil {
		return err
	}
	if a.invQuery, err = pgx.Connect(ctx, invDSN); err != nil {
		return err
	}
	// The consumer's own pool: a pool replaces a connection the server
	// closed, a *pgx.Conn does not (inbox.New refuses one).
	if a.invConsumer, err = pgxpool.New(ctx, invDSN); err != nil {
		return err
	}
	if err := inventory.EnsureSchema(ctx, a.invQuery); err != nil {
		return fmt.Errorf("inventory schema: %w", err)
	}
	if err := inventory.Seed(ctx, a.invQuery, map[string]int{"sku-apple": 10, "sku-pear": 5}); err != nil {
		return err
	}
	// The earlier demo events are on the same topic but are not orders of
	// this service: start the new group at the topic's current end.
	if a.admCl, err = kgo.NewClient(kgo.SeedBrokers(a.brokers...)); err != nil {
		return err
	}
	adm := kadm.NewClient(a.admCl)
	ends, err := adm.ListEndOffsets(ctx, inventory.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err == nil {
		err = adm.CommitAllOffsets(ctx, inventory.Consumer, ends.Offsets())
	}
	if err != nil {
		return fmt.Errorf("start group at the end: %w", err)
	}
	say("  inventory: stock sku-apple=10 sku-pear=5; group %q consumes %s, inbox table %q", inventory.Consumer, inventory.Topic, inbox.DefaultTable)
	return nil
}

// startInventory runs the inventory consumer; stop ends it (once) and
// returns Run's error.
func (a *adoption) startInventory(ctx context.Context) (stop func() error, err error) {
	cfg := inventory.Config(a.brokers, a.invConsumer, a.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cfg.KafkaOptions = []kgo.Opt{kgo.FetchMaxWait(50 * time.Millisecond)}
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if err := inventory.Handle(ctx, tx, rec); err != nil {
			return err
		}
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM reservations WHERE order_id = $1`, string(rec.Key)).Scan(&status); err != nil {
			return err
		}
		et, _ := inbox.Header(rec, wire.HeaderEventType)
		say("  inventory: %s p%d@%-3d %s %s -> %s (first delivery of id %s)", rec.Topic, rec.Partition, rec.Offset, et, short(string(rec.Key)), status, short(inbox.EventID(rec)))
		a.mu.Lock()
		a.handled = append(a.handled, rec)
		a.mu.Unlock()
		return nil
	}
	consumer, err := inbox.New(cfg)
	if err != nil {
		return nil, err
	}
	runCtx, stopConsumer := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	stopped := false
	return func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopConsumer()
		err := <-done
		consumer.Close()
		return err
	}, nil
}

// placeOrders places three orders and waits until inventory processed them.
func (a *adoption) placeOrders(ctx context.Context) error {
	for _, o := range []struct {
		customer, sku string
		qty           int
	}{{"alice", "sku-apple", 3}, {"bob", "sku-pear", 2}, {"carol", "sku-apple", 20}} {
		placed, err := a.svc.Place(ctx, o.customer, o.sku, o.qty)
		if err != nil {
			return err
		}
		say("  orders:    placed %s %s x%d for %s (order row + OrderPlaced outbox row, one transaction)", short(placed.ID), placed.SKU, placed.Quantity, placed.Customer)
	}
	if err := waitUntil(ctx, func() bool { return a.counter(inbox.MetricProcessed) >= 3 }); err != nil {
		return fmt.Errorf("inventory did not process the 3 orders: %w", err)
	}
	return nil
}

// redeliver produces the first record again (as a producer retry, a
// connector restart or a replay would) and waits for inventory to skip it.
func (a *adoption) redeliver(ctx context.Context) error {
	a.mu.Lock()
	first := a.handled[0]
	a.mu.Unlock()
	dup := &kgo.Record{Topic: first.Topic, Key: first.Key, Value: first.Value, Headers: first.Headers}
	if err := a.admCl.ProduceSync(ctx, dup).FirstErr(); err != nil {
		return err
	}
	say("  redeliver: produced p%d@%d again as p%d@%d (same id header %s)", first.Partition, first.Offset, dup.Partition, dup.Offset, short(inbox.EventID(first)))
	if err := waitUntil(ctx, func() bool { return a.counter(inbox.MetricDuplicates) >= 1 }); err != nil {
		return fmt.Errorf("inventory did not skip the duplicate: %w", err)
	}
	say("  inventory: p%d@%d id %s is already in the inbox -> skipped, handler not run, offset committed", dup.Partition, dup.Offset, short(inbox.EventID(dup)))
	return nil
}

// report prints the stock and the inbox's counters.
func (a *adoption) report(ctx context.Context) error {
	levels, err := inventory.StockLevels(ctx, a.invQuery)
	if err != nil {
		return err
	}
	var parts []string
	for _, s := range levels {
		parts = append(parts, fmt.Sprintf("%s %d available / %d reserved", s.SKU, s.Available, s.Reserved))
	}
	say("  stock now: %s", strings.Join(parts, ", "))
	var inboxRows int
	if err := a.invQuery.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&inboxRows); err != nil {
		return err
	}
	say("  inbox: %d rows; outbox_inbox_processed_total %v, outbox_inbox_duplicates_total %v, outbox_inbox_failed_total %v",
		inboxRows, a.counter(inbox.MetricProcessed), a.counter(inbox.MetricDuplicates), a.counter(inbox.MetricFailed))
	return nil
}

// short abbreviates ids for the demo's output.
func short(id string) string {
	if len(id) > 16 {
		return id[:8] + ".." + id[len(id)-4:]
	}
	return id
}

func waitUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// counterValue sums the counter name over its series in reg.
func counterValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
