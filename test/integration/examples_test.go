package integration

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/examples/inventory"
	"github.com/outbox-cdc/outbox-cdc/examples/orders"
	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// TestExamplesOrdersToInventory runs the adoption example end to end, each
// service with its own database: orders.Place writes the order and its event,
// the connector publishes it, inventory reserves stock once per order. A
// redelivered copy is skipped by the inbox; the same order under a new event
// id (a second producer, a bug) by the reservations primary key, the
// business-key layer of idempotency; a repeated cancellation by the
// reservation's status, the state machine layer.
func TestExamplesOrdersToInventory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shopDSN, invDSN := newDatabase(t), newDatabase(t)
	shop, err := pgxpool.New(ctx, shopDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer shop.Close()
	inv, err := pgxpool.New(ctx, invDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer inv.Close()
	svc := &orders.Service{DB: shop}
	if err := svc.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inventory.EnsureSchema(ctx, inv); err != nil {
		t.Fatal(err)
	}
	if err := inventory.Seed(ctx, inv, map[string]int{"sku-apple": 3}); err != nil {
		t.Fatal(err)
	}
	// One partition: the stock goes first come, first served across orders,
	// and only one partition keeps the order of events of different orders
	// (keys); with two, the second order could be handled first and take
	// the apples.
	topic := newTopic(t, 1)
	dropSlotAtEnd(t, shopDSN, "examples")
	cfg := testConfig(t, shopDSN, "public.outbox", "examples")
	cfg.Kafka.Topics = map[string]string{orders.AggregateType: topic}
	startConnector(t, cfg)

	var placed []orders.Order
	for _, o := range []struct {
		sku string
		n   int
	}{{"sku-apple", 2}, {"sku-apple", 2}, {"sku-pear", 1}} {
		p, err := svc.Place(ctx, "alice", o.sku, o.n)
		if err != nil {
			t.Fatal(err)
		}
		placed = append(placed, p)
	}

	icfg := inventory.Config(kafkaServer.Brokers(), inv, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(ibLogWriter{t}, nil)))
	icfg.Topics, icfg.Group = []string{topic}, "inventory-"+topic
	icfg.KafkaOptions = []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	var (
		seen  = make(chan *kgo.Record, 16)
		first *kgo.Record
	)
	icfg.Handler = func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if err := inventory.Handle(ctx, tx, rec); err != nil {
			return err
		}
		seen <- rec
		return nil
	}
	c, err := inbox.New(icfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		c.Close()
	}()
	for i := range 3 {
		select {
		case r := <-seen:
			if string(r.Key) == placed[0].ID {
				first = r
			}
		case <-ctx.Done():
			t.Fatalf("%d of 3 orders handled", i)
		}
	}
	// The same event again, and the same order under another event id.
	again := &kgo.Record{Topic: first.Topic, Key: first.Key, Value: first.Value, Headers: slices.Clone(first.Headers)}
	renamed := &kgo.Record{Topic: first.Topic, Key: first.Key, Value: first.Value}
	for _, h := range first.Headers {
		if h.Key == "id" {
			h.Value = []byte("another-id")
		}
		renamed.Headers = append(renamed.Headers, h)
	}
	ibProduce(ctx, t, again, renamed)
	select {
	case r := <-seen: // the renamed one reaches the handler, which finds the reservation
		if inbox.EventID(r) != "another-id" {
			t.Fatalf("handled %s again", inbox.EventID(r))
		}
	case <-ctx.Done():
		t.Fatal("the copy under another event id was not handled")
	}

	stockIs := func(want inventory.Stock, why string) {
		t.Helper()
		stock, err := inventory.StockLevels(ctx, inv)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(stock, []inventory.Stock{want}) {
			t.Errorf("stock %+v, want %+v (%s)", stock, want, why)
		}
	}
	stockIs(inventory.Stock{SKU: "sku-apple", Available: 1, Reserved: 2}, "one reservation of 2; the second order rejected")

	// The state machine layer: a cancellation releases the stock once, even
	// when it arrives again under another event id; cancelling the rejected
	// order releases nothing.
	if err := svc.Cancel(ctx, placed[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := svc.Cancel(ctx, placed[1].ID); err != nil {
		t.Fatal(err)
	}
	var cancelled []*kgo.Record
	for len(cancelled) < 2 {
		select {
		case r := <-seen:
			cancelled = append(cancelled, r)
		case <-ctx.Done():
			t.Fatalf("%d of 2 cancellations handled", len(cancelled))
		}
	}
	stockIs(inventory.Stock{SKU: "sku-apple", Available: 3, Reserved: 0}, "the reserved order's 2 released, nothing for the rejected one")
	var recancel *kgo.Record
	for _, r := range cancelled {
		if string(r.Key) == placed[0].ID {
			recancel = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				if h.Key == "id" {
					h.Value = []byte("another-cancel-id")
				}
				recancel.Headers = append(recancel.Headers, h)
			}
		}
	}
	ibProduce(ctx, t, recancel)
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatal("the repeated cancellation was not handled")
	}
	stockIs(inventory.Stock{SKU: "sku-apple", Available: 3, Reserved: 0}, "a repeated cancellation releases nothing")
	res, err := inventory.Reservations(ctx, inv)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, r := range res {
		status[r.OrderID] = r.Status
	}
	if len(res) != 3 || status[placed[0].ID] != inventory.Cancelled || status[placed[1].ID] != inventory.Rejected || status[placed[2].ID] != inventory.Rejected {
		t.Errorf("reservations %+v: want the first order cancelled, the second (not enough stock) and the third (unknown sku) rejected", res)
	}
}
