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
// A Handler error (or panic, or a handler outliving Config.HandlerTimeout)
// rolls the transaction back and the same record is retried with
// exponential backoff until it succeeds or the context ends. Its partition is
// paused meanwhile: no later record of that partition is processed before
// it, while the member's other partitions go on. A record that can never
// succeed (a poison message) is parked in the dead-letter table (Schema,
// "<table>_dead", with its error_message) when the handler returns
// Poison(err), when it returns nil after a statement of its transaction
// failed, or after Config.MaxAttempts failed attempts; parking writes the
// inbox row too, so the event counts as done and its offset is committed.
//
// The event id is the record's "id" header, which outbox-cdc always sets, or
// its CloudEvents id when the connector publishes CloudEvents (kafka.format;
// EventOf reads every format); another producer's CloudEvent is keyed by its
// source and id (EventID). Config.IDHeader names a header to read when
// neither is there. A record without one (or with an empty one, or an
// unreadable structured CloudEvent without an "id" header) gets the id
// "<topic>/<partition>/<offset>": such records are deduplicated only against
// redelivery of the same offset, not against a copy produced again.
//
// A panic in the handler is recovered, not re-raised: the attempt fails
// (ErrHandlerPanic, logged with the event id and the stack) and is retried,
// so the member keeps serving its other partitions and the group.
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
// DB must be a *pgxpool.Pool (see DB). Inbox rows must be kept longer than
// any event can be delivered again (Consumer.Cleanup; docs/guide.md gives the
// rule: the sum of the topic's retention, the longest retry wait and the time
// to intervene).
package inbox

import (
	"cmp"
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

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Defaults for Config.
const (
	DefaultTable           = "inbox"
	DefaultMaxPollRecords  = 100
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultMaxRetryBackoff = 10 * time.Second
	commitTimeout          = 10 * time.Second
)

// DB begins the transactions a Consumer runs in: a *pgxpool.Pool. It must
// replace a connection the server closed (a restart, a failover, an idle
// timeout), which a pool does and a *pgx.Conn cannot: once closed it fails
// every Begin, so New refuses one. A Consumer uses DB from one goroutine at
// a time; a pool of a few connections is plenty.
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
	// IDHeader names a header holding the event id, read when a record has
	// neither the "id" header nor a CloudEvents id: for a connector whose
	// outbox.standard_headers leaves id out and places the id column in
	// another header (outbox.fields). Default: none.
	IDHeader string
	// Table is the inbox table, "table" or "schema.table" (see Schema).
	// Default "inbox".
	Table string
	// DB begins the transactions: a *pgxpool.Pool (see DB). Required.
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
	// MaxAttempts, when positive, parks a record in the dead-letter table
	// after that many failed attempts in a row (the seeds' retry_count ->
	// DEAD). Default 0: retry until it succeeds. Parking lets the later
	// events of the same aggregate be handled before the parked one, which
	// a handler relying on their order (a version or state-machine guard)
	// may get wrong silently, while a stalled partition is visible
	// (outbox_inbox_failed_total) and stalls nothing else: so it is opt-in.
	// Attempts are counted by this member; a restart or rebalance starts
	// the count again.
	MaxAttempts int
	// HandlerTimeout bounds one attempt (the inbox insert and the handler;
	// the handler's ctx carries the deadline). A hung handler would hold the
	// group's rebalance until the member is kicked out, and its open
	// transaction would block the next owner's insert of the same event.
	// Default: half the group's rebalance timeout (kgo.RebalanceTimeout in
	// KafkaOptions, 60s by default, so 30s). Negative: no deadline.
	HandlerTimeout time.Duration
	// Logger receives handler failures (warn), parked records and panics
	// (error) and duplicates (debug).
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
	dead      string // INSERT of a parked record
	version   string // upsert of ApplyVersion
	m         consumerMetrics
	log       *slog.Logger
	rebalance chan struct{}
	trace     tracing
	// retries holds the partitions whose record failed and waits for its
	// next attempt; only Run's goroutine uses it.
	retries map[partition]*retry
}

// New validates cfg and creates the Kafka client (it connects lazily).
func New(cfg Config) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table, err := quoteTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	deadTable, err := quoteTable(DeadLetterTable(cfg.Table))
	if err != nil {
		return nil, err
	}
	versionTable, err := quoteTable(VersionTable(cfg.Table))
	if err != nil {
		return nil, err
	}
	vecs, err := registerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		cfg: cfg,
		// $7, when not NULL, is the event's legacy key (legacyKey): a row
		// under it also makes this delivery a duplicate.
		insert: "INSERT INTO " + table + ` (event_id, consumer_name, event_type, topic, kafka_partition, kafka_offset)
			SELECT $1, $2, $3, $4, $5, $6 WHERE $7::text IS NULL
				OR NOT EXISTS (SELECT 1 FROM ` + table + ` WHERE event_id = $7 AND consumer_name = $2)
			ON CONFLICT DO NOTHING`,
		dead:      deadInsertSQL(deadTable),
		version:   versionSQL(versionTable),
		m:         vecs.with(cfg.Consumer),
		log:       cfg.Logger.With("consumer", cfg.Consumer),
		rebalance: make(chan struct{}, 1),
		trace:     newTracing(cfg),
		retries:   map[partition]*retry{},
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
	if c.cfg.HandlerTimeout == 0 {
		// Half the rebalance timeout leaves the member time to commit and
		// rejoin after an attempt that ran into the deadline.
		rt, _ := c.cl.OptValue(kgo.RebalanceTimeout).(time.Duration)
		c.cfg.HandlerTimeout = cmp.Or(rt, 60*time.Second) / 2
	}
	return c, nil
}

// withDefaults checks the required fields and fills in the defaults.
func (cfg Config) withDefaults() (Config, error) {
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
	if _, ok := cfg.DB.(*pgx.Conn); ok {
		return cfg, errors.New("inbox: config: DB is a *pgx.Conn, which never reconnects once the server closed it (a restart stalls the consumer for good): pass a *pgxpool.Pool")
	}
	if cfg.Handler == nil {
		missing = append(missing, "Handler")
	}
	if len(missing) > 0 {
		return cfg, fmt.Errorf("inbox: config: missing %s", strings.Join(missing, ", "))
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
	return cfg, nil
}

// Client returns the Kafka client, for inspection (do not poll it).
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group and closes the Kafka client. Call it after Run has
// returned.
func (c *Consumer) Close() { c.cl.CloseAllowingRebalance() }

// Run consumes until ctx is done, then commits the offsets of the records
// already processed and returns nil (or the error of that last commit). It
// returns kgo.ErrClientClosed if the client is closed under it. Run must not
// be called twice at once; it may be called again after it returned, and
// goes on with the first record not processed.
func (c *Consumer) Run(ctx context.Context) error {
	// Whatever way Run returns, a rebalance waiting on this member may go
	// ahead (records not processed have been rewound).
	defer c.cl.AllowRebalance()
	idle := time.Duration(0)
	for {
		c.resumeDue(time.Now())
		pctx, cancel := c.pollContext(ctx)
		fetches := c.cl.PollRecords(pctx, c.cfg.MaxPollRecords)
		cancel()
		if fetches.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		if ctx.Err() != nil {
			c.rewind(fetches.Records()) // polled, not processed: the next Run fetches them again
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

// EventID returns the id the inbox stores for rec (its dedupe key): the
// event id (EventOf: the CloudEvents id, else the "id" header). A
// CloudEvent that does not carry that id as its "id" header too (outbox-cdc
// sets the header on every record in every format, so its events keep the
// outbox row's id) is keyed "<source> <id>", the pair the specification
// makes unique: two producers may use the same ids. Such an event is still
// recognised when recorded under its id alone (by outbox-cdc's copy of it,
// or by an earlier inbox). A record without an id gets
// "<topic>/<partition>/<offset>", which protects only against a redelivery
// of that same offset (and collides once a topic is deleted and created
// again).
func EventID(rec *kgo.Record) string {
	ev, _ := EventOf(rec)
	return dedupeKey(rec, ev, "")
}

// EventID is the package's EventID with the consumer's Config.IDHeader.
func (c *Consumer) EventID(rec *kgo.Record) string {
	ev, _ := EventOf(rec)
	return dedupeKey(rec, ev, c.cfg.IDHeader)
}

func dedupeKey(rec *kgo.Record, ev Event, idHeader string) string {
	if legacyKey(rec, ev) != nil {
		return ev.Source + " " + ev.ID // a source is a URI reference: no space in it
	}
	if ev.ID != "" {
		return ev.ID
	}
	if idHeader != "" {
		if id, _ := Header(rec, idHeader); id != "" {
			return id
		}
	}
	return fmt.Sprintf("%s/%d/%d", rec.Topic, rec.Partition, rec.Offset)
}

// legacyKey is, for an event keyed by source and id, its id alone, under
// which the insert also looks for it; nil for other records.
func legacyKey(rec *kgo.Record, ev Event) any {
	if plain, _ := Header(rec, wire.HeaderID); ev.ID == "" || ev.Source == "" || plain == ev.ID {
		return nil
	}
	return ev.ID
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
