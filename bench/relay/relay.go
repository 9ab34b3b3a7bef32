// Package relay is the polling outbox relay the benchmark compares outbox-cdc
// against. It is built the way the usual pattern articles describe it: the
// outbox table has a status column (PENDING, SENT); every poll claims a batch
// with SELECT ... FOR UPDATE SKIP LOCKED LIMIT n, produces the batch, waits
// for the broker's acknowledgements, marks the rows SENT and commits.
//
// One deliberate deviation from the literal "one batch per scheduled tick"
// (Spring's @Scheduled(fixedDelay) around a LIMIT 100 claim): a poll keeps
// claiming batches until one comes back short, then sleeps the poll interval.
// The literal form caps throughput at BatchSize per interval (100/s at 1 s),
// which would fall behind at every offered load the benchmark uses and turn a
// latency comparison into a backlog measurement.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Schema is the polling relay's outbox table: the contract's columns plus the
// status bookkeeping the relay needs, and the claim index the articles
// recommend. %[1]s is the table name, %[2]s an index name prefix.
const Schema = `CREATE TABLE IF NOT EXISTS %[1]s (
  id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb,
  created_at     timestamptz NOT NULL DEFAULT now(),
  status         text        NOT NULL DEFAULT 'PENDING',
  sent_at        timestamptz
);
CREATE INDEX IF NOT EXISTS %[2]s_claim ON %[1]s (status, created_at);`

// Config configures a Relay.
type Config struct {
	DSN     string
	Table   string // SQL identifier, already quoted if it needs to be
	Brokers []string
	// Topic receives every event (the relay under test has one route).
	Topic        string
	PollInterval time.Duration
	BatchSize    int
	// MaxBufferedRecords matches the connector's producer bound.
	MaxBufferedRecords int
}

func (c Config) validate() error {
	switch {
	case c.DSN == "":
		return errors.New("relay: DSN is empty")
	case c.Table == "":
		return errors.New("relay: Table is empty")
	case len(c.Brokers) == 0:
		return errors.New("relay: no brokers")
	case c.Topic == "":
		return errors.New("relay: Topic is empty")
	case c.PollInterval <= 0:
		return fmt.Errorf("relay: PollInterval %v must be positive", c.PollInterval)
	case c.BatchSize <= 0:
		return fmt.Errorf("relay: BatchSize %d must be positive", c.BatchSize)
	}
	return nil
}

// Stats counts what a Relay did.
type Stats struct {
	Polls   int64 // sleeps ended (scheduled polls)
	Batches int64 // claim transactions that found rows
	Events  int64 // rows produced, acknowledged and marked SENT
}

// Relay is one polling relay: one PostgreSQL connection and one idempotent
// producer. Run it once.
type Relay struct {
	cfg  Config
	log  *slog.Logger
	conn *pgx.Conn
	cl   *kgo.Client
	pid  uint32

	claimSQL, markSQL string

	polls, batches, events atomic.Int64
}

// New connects to PostgreSQL and creates the producer with the connector's
// settings: idempotent, acks=all, murmur2 key partitioning, no linger.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("relay: connect postgres: %w", err)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("outbox-polling-relay"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(0),
	}
	if cfg.MaxBufferedRecords > 0 {
		opts = append(opts, kgo.MaxBufferedRecords(cfg.MaxBufferedRecords))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("relay: kafka client: %w", err)
	}
	r := &Relay{
		cfg: cfg, log: log, conn: conn, cl: cl, pid: conn.PgConn().PID(),
		claimSQL: `SELECT id::text, aggregate_type, aggregate_id, event_type, payload::text, created_at
			FROM ` + cfg.Table + ` WHERE status = 'PENDING' ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED`,
		markSQL: `UPDATE ` + cfg.Table + ` SET status = 'SENT', sent_at = now() WHERE id = ANY($1::uuid[])`,
	}
	return r, nil
}

// BackendPID is the PostgreSQL server process serving the relay's connection,
// for CPU accounting.
func (r *Relay) BackendPID() int { return int(r.pid) }

// Stats returns the counters so far.
func (r *Relay) Stats() Stats {
	return Stats{Polls: r.polls.Load(), Batches: r.batches.Load(), Events: r.events.Load()}
}

// Close releases the connection and the producer.
func (r *Relay) Close() {
	r.cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.conn.Close(ctx)
}

// Run polls until ctx ends (then it returns nil) or a batch fails. A failed
// batch is rolled back, so its rows stay PENDING: at-least-once, like the
// articles' relay.
func (r *Relay) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		r.polls.Add(1)
		for {
			n, err := r.batch(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		timer.Reset(r.cfg.PollInterval)
	}
}

// batch claims, produces and marks one batch in one transaction and returns
// how many rows it claimed.
func (r *Relay) batch(ctx context.Context) (n int, err error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("relay: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	rows, err := tx.Query(ctx, r.claimSQL, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	var (
		recs = make([]*kgo.Record, 0, r.cfg.BatchSize)
		ids  = make([]string, 0, r.cfg.BatchSize)
	)
	for rows.Next() {
		var (
			id, aggType, aggID, evType string
			payload                    *string
			created                    time.Time
		)
		if err := rows.Scan(&id, &aggType, &aggID, &evType, &payload, &created); err != nil {
			rows.Close()
			return 0, fmt.Errorf("relay: scan: %w", err)
		}
		rec := &kgo.Record{
			Topic:     r.cfg.Topic,
			Key:       []byte(aggID),
			Timestamp: created,
			Headers: []kgo.RecordHeader{
				{Key: wire.HeaderID, Value: []byte(id)},
				{Key: wire.HeaderEventType, Value: []byte(evType)},
				{Key: wire.HeaderAggregateType, Value: []byte(aggType)},
			},
		}
		if payload != nil {
			rec.Value = []byte(*payload)
		}
		recs = append(recs, rec)
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	if len(recs) == 0 {
		return 0, tx.Rollback(ctx)
	}
	if err := r.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("relay: produce: %w", err)
	}
	if _, err := tx.Exec(ctx, r.markSQL, ids); err != nil {
		return 0, fmt.Errorf("relay: mark sent: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("relay: commit: %w", err)
	}
	r.batches.Add(1)
	r.events.Add(int64(len(recs)))
	return len(recs), nil
}
