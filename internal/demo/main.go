// Command demo shows the whole path on one machine: it starts a private
// PostgreSQL, an Apache Kafka broker and a schema registry (Apicurio, the
// Confluent API) from internal/testenv, creates the outbox table, registers
// one event contract, runs the connector with contracts on, inserts events,
// prints them as consumed from Kafka, shows a contract violation refused by
// the writer library and dead-lettered by the connector (its aggregate's
// next event parked), measures a short burst and a steady stream, then runs the example
// order and inventory services (examples/) through the outbox and the inbox,
// with a duplicate injected. Run it with `make demo`.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// demo is the running demo: the servers, the shop database and the
// connector's metrics.
type demo struct {
	pg       *testenv.Postgres
	kafka    *testenv.Kafka
	registry *testenv.Registry
	dsn      string
	conn     *pgx.Conn
	m        *metrics.Metrics
	// contractVersion is the registered version of the demo's contract.
	contractVersion int
}

func run(ctx context.Context) error {
	d := &demo{}
	defer d.close()
	if err := d.setup(ctx); err != nil {
		return err
	}
	runCtx, stopConnector := context.WithCancel(ctx)
	defer stopConnector()
	done, err := d.startConnector(runCtx)
	if err != nil {
		return err
	}
	for _, step := range []func(context.Context) error{d.fiveEvents, d.contractsStep, d.burst, d.steady} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	if err := adoptionKit(ctx, d.pg, d.kafka.Brokers(), d.dsn); err != nil {
		return fmt.Errorf("adoption kit: %w", err)
	}
	stopConnector()
	if err := <-done; err != nil {
		return err
	}
	say("\nconnector stopped cleanly; confirmed LSN is the last acknowledged transaction.")
	return nil
}

func (d *demo) close() {
	if d.conn != nil {
		d.conn.Close(context.Background())
	}
	if d.kafka != nil {
		d.kafka.Close()
	}
	if d.registry != nil {
		d.registry.Close()
	}
	if d.pg != nil {
		d.pg.Close()
	}
}

// setup starts the servers, creates the outbox and the topics, and
// registers the demo's contract.
func (d *demo) setup(ctx context.Context) error {
	var err error
	say("starting PostgreSQL (wal_level=logical), Apache Kafka (KRaft) and Apicurio Registry ...")
	// The registry (a JVM) starts meanwhile.
	regDone := make(chan error, 1)
	go func() {
		var err error
		d.registry, err = testenv.StartRegistry(ctx)
		regDone <- err
	}()
	if d.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{}); err != nil {
		<-regDone
		return err
	}
	if d.kafka, err = testenv.StartKafka(ctx, testenv.KafkaOptions{}); err != nil {
		<-regDone
		return err
	}
	if err := <-regDone; err != nil {
		return err
	}
	if d.dsn, err = d.pg.CreateDatabase(ctx, "shop"); err != nil {
		return err
	}
	say("PostgreSQL %s at %s, Kafka %s at %s, Apicurio Registry %s at %s", d.pg.Version(), strings.Split(strings.Split(d.dsn, "@")[1], "/")[0],
		d.kafka.Version(), d.kafka.Brokers()[0], d.registry.Version(), d.registry.URL())

	sql, err := os.ReadFile("sql/outbox.sql")
	if err != nil {
		return fmt.Errorf("read sql/outbox.sql (run from the repository root): %w", err)
	}
	if d.conn, err = pgx.Connect(ctx, d.dsn); err != nil {
		return err
	}
	if _, err := d.conn.Exec(ctx, string(sql)); err != nil {
		return fmt.Errorf("create outbox: %w", err)
	}

	// Create the topics up front: auto-creation on first use adds a few
	// hundred milliseconds to the first records, which would hide the
	// steady-state latency this demo prints.
	adm, err := kgo.NewClient(kgo.SeedBrokers(d.kafka.Brokers()...))
	if err != nil {
		return err
	}
	err = createTopics(ctx, kadm.NewClient(adm))
	adm.Close()
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	d.contractVersion, err = registerContracts(ctx, d.registry.URL())
	return err
}

// createTopics creates the event topics, and the dead-letter topic as the
// connector creates its own (kafka.dlq_topic): nothing deletes a dead
// letter before its redrive, so retention.ms and retention.bytes are -1.
func createTopics(ctx context.Context, adm *kadm.Client) error {
	resps, err := adm.CreateTopics(ctx, 3, 1, nil,
		"outbox.event.order", "outbox.event.customer", "outbox.event.payment", "outbox.event.burst", "outbox.event.steady")
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		return err
	}
	kept := "-1"
	resps, err = adm.CreateTopics(ctx, 3, 1, map[string]*string{"retention.ms": &kept, "retention.bytes": &kept}, "outbox.dlq")
	if err == nil {
		err = resps.Error()
	}
	return err
}

// startConnector runs the connector until ctx ends; done gets Run's result.
func (d *demo) startConnector(ctx context.Context) (done chan error, err error) {
	cfg := config.Default()
	cfg.Postgres.DSN = config.DSN(d.dsn)
	cfg.Kafka.Brokers = d.kafka.Brokers()
	// Event contracts: every event is checked against the schema of its
	// subject; a violation is dead-lettered and its aggregate parked
	// (on_violation quarantine); types without a contract are published
	// (unknown_type pass: PaymentCaptured and the Tick events have one).
	cfg.Contracts.Registry.URL = d.registry.URL()
	cfg.Contracts.Mode = "validate"
	cfg.Contracts.OnViolation = config.ContractsQuarantine
	cfg.Contracts.UnknownType = config.ContractsPass
	pc, err := cli.PipelineConfig(&cfg)
	if err != nil {
		return nil, err
	}
	d.m = metrics.New()
	p, err := pipeline.New(pc, d.m, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return nil, err
	}
	done = make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-done:
		return nil, err
	}
	say("connector running: slot %s, publication %s, topic template %s; contracts: %s mode, on_violation %s, unknown_type %s",
		cfg.Postgres.Slot, cfg.Postgres.Publication, cfg.Kafka.Topic, cfg.Contracts.Mode, cfg.Contracts.OnViolation, cfg.Contracts.UnknownType)

	return done, nil
}

// fiveEvents inserts five events and prints them as consumed.
func (d *demo) fiveEvents(ctx context.Context) error {
	say("\ninserting 5 events, each in its own business transaction ...")
	events := [][3]string{
		{"order", "order-1001", "OrderCreated"}, {"order", "order-1001", "OrderPaid"},
		{"customer", "cust-7", "CustomerRegistered"}, {"order", "order-1002", "OrderCreated"}, {"order", "order-1001", "OrderShipped"},
	}
	for i, e := range events {
		payload := fmt.Sprintf(`{"n": %d, "note": "event %d of the demo"}`, i+1, i+1)
		if _, err := d.conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4)`,
			e[0], e[1], e[2], payload); err != nil {
			return err
		}
	}
	recs, err := consume(ctx, d.kafka.Brokers(), []string{"outbox.event.order", "outbox.event.customer"}, len(events), 30*time.Second)
	if err != nil {
		return err
	}
	say("consumed from Kafka:")
	for _, r := range recs {
		et := ""
		for _, h := range r.Headers {
			if h.Key == wire.HeaderEventType {
				et = string(h.Value)
			}
		}
		say("  %-22s p%d@%-3d key=%-10s %-19s %s", r.Topic, r.Partition, r.Offset, r.Key, et, r.Value)
	}

	return nil
}

// burst commits many one-row transactions from several writers and prints
// the throughput and the connector's commit-to-ack quantiles.
func (d *demo) burst(ctx context.Context) error {
	const writers, perWriter = 8, 2500
	say("\nburst: %d writers x %d one-row transactions ...", writers, perWriter)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Go(func() {
			c, err := pgx.Connect(ctx, d.dsn)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(context.Background())
			for i := 0; i < perWriter; i++ {
				if _, err := c.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('burst', $1, 'Tick', jsonb_build_object('i', $2::int))`, fmt.Sprintf("agg-%d", i%100), i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	wrote := time.Since(start)
	burst, err := consume(ctx, d.kafka.Brokers(), []string{"outbox.event.burst"}, writers*perWriter, 2*time.Minute)
	if err != nil {
		return err
	}
	total := time.Since(start)
	if len(burst) < writers*perWriter {
		return fmt.Errorf("burst: %d records, want %d", len(burst), writers*perWriter)
	}
	say("  %d events committed in %v (%.0f/s), all in Kafka after %v (%.0f events/s end to end)",
		writers*perWriter, wrote.Round(time.Millisecond), float64(writers*perWriter)/wrote.Seconds(),
		total.Round(time.Millisecond), float64(writers*perWriter)/total.Seconds())
	p50, p99, n := quantiles(d.m)
	say("  commit-to-ack (connector histogram, %d events): p50 <= %s, p99 <= %s", n, p50, p99)

	return nil
}

// steady writes one event every 5 ms and prints the commit-to-consume
// latency a live consumer sees.
func (d *demo) steady(ctx context.Context) error {
	const steady = 400
	say("\nsteady: %d events at 200/s, commit-to-consume measured by a live consumer ...", steady)
	lc, err := kgo.NewClient(kgo.SeedBrokers(d.kafka.Brokers()...), kgo.ConsumeTopics("outbox.event.steady"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation(), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return err
	}
	defer lc.Close()
	lats := make(chan []time.Duration, 1)
	go func() {
		var ls []time.Duration
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for len(ls) < steady && cctx.Err() == nil {
			fs := lc.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) { ls = append(ls, now.Sub(r.Timestamp)) })
		}
		lats <- ls
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	for i := 0; i < steady; i++ {
		<-tick.C
		if _, err := d.conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('steady', $1, 'Tick', '{}')`, fmt.Sprintf("s-%d", i%10)); err != nil {
			return err
		}
	}
	tick.Stop()
	ls := <-lats
	if len(ls) < steady {
		return fmt.Errorf("steady: consumed %d of %d", len(ls), steady)
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	say("  commit-to-consume p50 %v, p99 %v, max %v (record timestamps are ms, so +-1ms)",
		ls[len(ls)/2].Round(100*time.Microsecond), ls[len(ls)*99/100].Round(100*time.Microsecond), ls[len(ls)-1].Round(100*time.Microsecond))

	return nil
}

func consume(ctx context.Context, brokers, topics []string, n int, timeout time.Duration) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return recs, fmt.Errorf("consumed %d of %d records: %w", len(recs), n, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs, nil
}

// quantiles reads p50 and p99 upper bounds from the commit_to_ack histogram.
func quantiles(m *metrics.Metrics) (p50, p99 string, count uint64) {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return "?", "?", 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "outbox_cdc_commit_to_ack_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		count = h.GetSampleCount()
		bs := h.GetBucket()
		sort.Slice(bs, func(i, j int) bool { return bs[i].GetUpperBound() < bs[j].GetUpperBound() })
		find := func(q float64) string {
			for _, b := range bs {
				if float64(b.GetCumulativeCount()) >= q*float64(count) {
					return (time.Duration(b.GetUpperBound() * float64(time.Second))).String()
				}
			}
			return "+Inf"
		}
		return find(0.5), find(0.99), count
	}
	return "?", "?", 0
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }
