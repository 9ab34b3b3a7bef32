// Package inbox consumes outbox-cdc's Kafka records exactly once per event
// and consumer, on top of Kafka's at-least-once delivery: the Inbox pattern.
//
// For each record a Consumer opens a PostgreSQL transaction and runs
//
//	INSERT INTO inbox (event_id, consumer_name, …) VALUES (…) ON CONFLICT DO NOTHING
//
// If a row was inserted, this is the event's first delivery to this consumer:
// the Handler runs in the same transaction and the transaction commits, so the
// inbox row and the handler's changes exist together or not at all. If no row
// was inserted the event was processed before (a redelivery after a crash or
// a rebalance, a connector replay, a producer retry): the record is skipped
// and counted as a duplicate. Only after the database commit is the record's
// Kafka offset committed, so a crash in between redelivers the record, which
// the inbox row then turns into a duplicate.
//
// A Handler error rolls the transaction back and the same record is retried
// with exponential backoff until it succeeds or the context ends: records are
// never skipped, and no later record (of any partition in the same poll) is
// processed before it. A record that can never succeed (a poison message)
// must therefore be recognised by the handler, which records it somewhere and
// returns nil.
//
// The event id is the record's "id" header, which outbox-cdc always sets, or
// its CloudEvents id when the connector publishes CloudEvents (kafka.format;
// EventOf reads every format). A record without one (or with an empty one,
// or an unreadable structured CloudEvent without an "id" header) gets the id
// "<topic>/<partition>/<offset>": such records are deduplicated only against
// redelivery of the same offset, not against a copy produced again.
//
// Two deliveries of one event processed at the same moment (by two members
// during a rebalance) are serialised by the primary key: the second INSERT
// waits for the first transaction and then inserts nothing.
//
// The Consumer reads with isolation level read_committed: records of a Kafka
// transaction appear once it commits, and never if it aborts. With the
// connector's kafka.delivery exactly_once that is what makes a PostgreSQL
// transaction's events appear together, and what hides the copies an
// aborted attempt left in the log; with at_least_once it changes nothing.
//
// Inbox rows must be kept longer than any event can be delivered again
// (Cleanup; docs/guide.md gives the rule).
package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Defaults for Config.
const (
	DefaultTable           = "inbox"
	DefaultMaxPollRecords  = 100
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultMaxRetryBackoff = 10 * time.Second
	commitTimeout          = 10 * time.Second
)

// DB begins the transactions a Consumer runs in. *pgxpool.Pool and *pgx.Conn
// satisfy it (a Consumer uses it from one goroutine at a time).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Execer runs one statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Handler processes the first delivery of an event inside tx, the
// transaction that also records the event in the inbox. It must do all its
// database work through tx and must not commit or roll it back. An error
// rolls everything back and the record is retried.
//
// The handler may still run more than once for one event when it has side
// effects outside tx (an HTTP call, an e-mail): only the database work is
// exactly once. Make such effects idempotent.
//
// EventOf(rec) gives the event id, type, aggregate and payload whatever the
// connector's record format.
type Handler func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Config configures a Consumer.
type Config struct {
	// Brokers are the Kafka seed brokers (host:port). Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics to consume. Required.
	Topics []string
	// Consumer is the consumer_name stored with each event id, so services
	// sharing an inbox table keep separate records. Default: Group.
	Consumer string
	// Table is the inbox table, "table" or "schema.table" (see Schema).
	// Default "inbox".
	Table string
	// DB begins the transactions. Required.
	DB DB
	// Handler processes each event once. Required.
	Handler Handler
	// Registerer receives the metrics (outbox_inbox_processed_total,
	// outbox_inbox_duplicates_total, outbox_inbox_failed_total,
	// outbox_inbox_handler_seconds, each labelled consumer). Consumers may
	// share one registry. nil: metrics are kept but not registered.
	Registerer prometheus.Registerer
	// KafkaOptions are extra client options (TLS, SASL, fetch tuning,
	// ConsumeResetOffset …). The Consumer adds, and overrides, the options it
	// relies on: ConsumerGroup, ConsumeTopics, DisableAutoCommit,
	// BlockRebalanceOnPoll and OnPartitionsCallbackBlocked.
	KafkaOptions []kgo.Opt
	// MaxPollRecords bounds the records handled between two offset commits
	// (and between two chances for the group to rebalance). Default 100.
	MaxPollRecords int
	// RetryBackoff is the first wait after a failed attempt; it doubles up to
	// MaxRetryBackoff. Defaults 100ms and 10s.
	RetryBackoff, MaxRetryBackoff time.Duration
	// Logger receives handler failures (warn) and duplicates (debug).
	// Default slog.Default().
	Logger *slog.Logger
	// TracerProvider starts one consumer span per delivery attempt, child
	// of the trace context in the record's traceparent and tracestate
	// headers; the Handler's ctx is inside it. Default: the global
	// provider (otel.GetTracerProvider(), a no-op until the application
	// sets one).
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the headers. Default: W3C
	// trace context, what outbox-cdc sends.
	Propagator propagation.TextMapPropagator
}

// Consumer runs a Handler once per event id. Create it with New, run it with
// Run, and Close it when Run has returned.
type Consumer struct {
	cfg       Config
	cl        *kgo.Client
	insert    string
	m         consumerMetrics
	log       *slog.Logger
	rebalance chan struct{}
	trace     tracing
}

// New validates cfg and creates the Kafka client (it connects lazily).
func New(cfg Config) (*Consumer, error) {
	var missing []string
	if len(cfg.Brokers) == 0 {
		missing = append(missing, "Brokers")
	}
	if cfg.Group == "" {
		missing = append(missing, "Group")
	}
	if len(cfg.Topics) == 0 {
		missing = append(missing, "Topics")
	}
	if cfg.DB == nil {
		missing = append(missing, "DB")
	}
	if cfg.Handler == nil {
		missing = append(missing, "Handler")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("inbox: config: missing %s", strings.Join(missing, ", "))
	}
	if cfg.Consumer == "" {
		cfg.Consumer = cfg.Group
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = DefaultMaxPollRecords
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	if cfg.MaxRetryBackoff < cfg.RetryBackoff {
		cfg.MaxRetryBackoff = max(DefaultMaxRetryBackoff, cfg.RetryBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	table, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	vecs, err := registerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg: cfg,
		insert: "INSERT INTO " + table + ` (event_id, consumer_name, event_type, topic, kafka_partition, kafka_offset)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		m:         vecs.with(cfg.Consumer),
		log:       cfg.Logger.With("consumer", cfg.Consumer),
		rebalance: make(chan struct{}, 1),
		trace:     newTracing(cfg),
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOptions...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		// Records of aborted Kafka transactions (the connector's
		// kafka.delivery exactly_once) are never handed over; without
		// transactions this changes nothing.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Offsets are committed before a rebalance may run, so a commit never
		// lands on a partition this member no longer owns.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) {
			select {
			case c.rebalance <- struct{}{}:
			default:
			}
		}),
	)
	c.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("inbox: kafka client: %w", err)
	}
	return c, nil
}

// Client returns the Kafka client, for inspection (do not poll it).
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group and closes the Kafka client. Call it after Run has
// returned.
func (c *Consumer) Close() { c.cl.CloseAllowingRebalance() }

// Run consumes until ctx is done, then commits the offsets of the records
// already processed and returns nil (or the error of that last commit). It
// returns kgo.ErrClientClosed if the client is closed under it. Run must not
// be called twice at once.
func (c *Consumer) Run(ctx context.Context) error {
	idle := time.Duration(0)
	for {
		fetches := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		if ctx.Err() != nil {
			c.cl.AllowRebalance()
			return nil
		}
		fetchErrs := 0
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			fetchErrs++
			c.log.Warn("inbox: fetch error", "topic", topic, "partition", partition, "err", err)
		})
		recs := fetches.Records()
		done := c.processBatch(ctx, recs)
		cerr := c.commit(ctx, done)
		c.cl.AllowRebalance()
		select { // a rebalance that was waiting has now been allowed
		case <-c.rebalance:
		default:
		}
		if ctx.Err() != nil {
			return cerr
		}
		// Errors without records would make PollRecords return at once:
		// do not spin on them.
		if len(recs) == 0 && fetchErrs > 0 {
			idle = min(max(2*idle, c.cfg.RetryBackoff), c.cfg.MaxRetryBackoff)
			if !sleep(ctx, idle, nil) {
				return nil
			}
		} else {
			idle = 0
		}
	}
}

// processBatch handles recs in order and returns the ones that are done. It
// stops early when ctx ends or a rebalance is waiting; the unprocessed
// records are then fetched again (SetOffsets, while rebalancing is blocked).
func (c *Consumer) processBatch(ctx context.Context, recs []*kgo.Record) []*kgo.Record {
	done := make([]*kgo.Record, 0, len(recs))
	flushed := 0
	flush := func() { // commit progress before waiting out a failure
		if len(done) > flushed {
			_ = c.commit(ctx, done[flushed:])
			flushed = len(done)
		}
	}
	for i, r := range recs {
		if i > 0 && c.rebalanceWaiting() {
			c.rewind(recs[i:])
			break
		}
		if err := c.process(ctx, r, flush); err != nil {
			if errors.Is(err, errRebalance) {
				c.rewind(recs[i:])
			}
			break
		}
		done = append(done, r)
	}
	return done[flushed:]
}

var errRebalance = errors.New("rebalance waiting")

func (c *Consumer) rebalanceWaiting() bool {
	select {
	case <-c.rebalance:
		return true
	default:
		return false
	}
}

// rewind makes the client fetch recs again: each partition restarts at its
// first record in recs.
func (c *Consumer) rewind(recs []*kgo.Record) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for _, r := range recs {
		ps := offsets[r.Topic]
		if ps == nil {
			ps = map[int32]kgo.EpochOffset{}
			offsets[r.Topic] = ps
		}
		if _, ok := ps[r.Partition]; !ok {
			ps[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	if len(offsets) > 0 {
		c.cl.SetOffsets(offsets)
	}
}

// process handles rec until it is done (nil), ctx ends (ctx.Err()) or, after
// a failure, a rebalance is waiting (errRebalance). beforeWait is called
// before the first wait.
func (c *Consumer) process(ctx context.Context, rec *kgo.Record, beforeWait func()) error {
	backoff := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		id, dup, err := c.attempt(ctx, rec)
		if err == nil {
			if dup {
				c.m.duplicates.Inc()
				c.log.Debug("inbox: duplicate skipped", "event_id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
			} else {
				c.m.processed.Inc()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.m.failed.Inc()
		c.log.Warn("inbox: event failed, will retry", "event_id", id, "topic", rec.Topic, "partition", rec.Partition,
			"offset", rec.Offset, "attempt", attempt, "retry_in", backoff, "err", err)
		if attempt == 1 {
			beforeWait()
		}
		if !sleep(ctx, backoff, c.rebalance) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errRebalance
		}
		backoff = min(2*backoff, c.cfg.MaxRetryBackoff)
	}
}

// sleep waits d; false if ctx ended or wake fired first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-wake:
		return false
	}
}

// attempt runs one delivery attempt of rec in its own transaction.
func (c *Consumer) attempt(ctx context.Context, rec *kgo.Record) (id string, dup bool, err error) {
	ev, _ := EventOf(rec) // unreadable: the handler's EventOf says so
	id = eventID(rec, ev.ID)
	ctx, span := c.trace.start(ctx, rec, id)
	defer func() { end(span, dup, err) }()
	var eventType any
	if ev.Type != "" {
		eventType = ev.Type
	}
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return id, false, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after Commit
	}()
	tag, err := tx.Exec(ctx, c.insert, id, c.cfg.Consumer, eventType, rec.Topic, rec.Partition, rec.Offset)
	if err != nil {
		return id, false, fmt.Errorf("insert into inbox: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return id, true, nil
	}
	start := time.Now()
	err = c.cfg.Handler(ctx, tx, rec)
	c.m.handler.Observe(time.Since(start).Seconds())
	if err != nil {
		return id, false, fmt.Errorf("handler: %w", err)
	}
	// The handler succeeded: its transaction is committed even when a stop
	// began meanwhile, so the work is kept and its offset committed instead
	// of being redelivered after the rebalance. If Commit fails after the
	// server committed, the retry finds the inbox row and counts a
	// duplicate: nothing runs twice.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return id, false, fmt.Errorf("commit: %w", err)
	}
	return id, false, nil
}

// commit commits the offsets after recs (the highest per partition). It
// uses a short context of its own when ctx has ended, so the work done before
// a shutdown is not redelivered.
func (c *Consumer) commit(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := c.cl.CommitRecords(cctx, recs...); err != nil {
		// The events are in the inbox: a redelivery is a duplicate, not a loss.
		c.log.Warn("inbox: offset commit failed; the records will be redelivered and skipped", "records", len(recs), "err", err)
		return fmt.Errorf("inbox: commit offsets: %w", err)
	}
	return nil
}

// EventID returns the id the inbox stores for rec: its event id (EventOf;
// the "id" header of a structured CloudEvent that cannot be read), or
// "<topic>/<partition>/<offset>" when it has none.
func EventID(rec *kgo.Record) string {
	ev, _ := EventOf(rec)
	return eventID(rec, ev.ID)
}

func eventID(rec *kgo.Record, id string) string {
	if id != "" {
		return id
	}
	return fmt.Sprintf("%s/%d/%d", rec.Topic, rec.Partition, rec.Offset)
}

// Header returns the value of rec's first header named key.
func Header(rec *kgo.Record, key string) (string, bool) {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}
