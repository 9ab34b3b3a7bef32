package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// errPoison marks an error no retry will change (Poison).
var errPoison = errors.New("poison record")

// Poison wraps a handler's err to say that the record can never succeed
// (malformed, refers to something that will never exist …): the attempt is
// rolled back, and the record is parked in the dead-letter table at once with
// err as its error_message, instead of being retried. errors.Is(err, ...)
// still finds err.
func Poison(err error) error {
	if err == nil {
		err = errors.New("rejected by the handler")
	}
	return fmt.Errorf("%w: %w", errPoison, err)
}

// IsPoison reports whether err was made by Poison.
func IsPoison(err error) bool { return errors.Is(err, errPoison) }

// DeadLetterTable returns the name of the dead-letter table of the inbox
// table table: "<table>_dead" in the same schema.
func DeadLetterTable(table string) string { return table + "_dead" }

func deadInsertSQL(qt string) string {
	return "INSERT INTO " + qt + ` (event_id, consumer_name, event_type, topic, kafka_partition, kafka_offset,
		record_key, record_value, headers, attempts, error_message)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (event_id, consumer_name) DO UPDATE SET attempts = EXCLUDED.attempts,
			error_message = EXCLUDED.error_message, failed_at = now()`
}

// park records rec in the dead-letter table and its event in the inbox, in
// one transaction of its own: the event then counts as done for this
// consumer (a redelivery is a duplicate) and an operator finds it, with the
// record and the error, in the dead-letter table.
func (c *Consumer) park(ctx context.Context, rec *kgo.Record, ev Event, id string, attempts int, cause error) error {
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var eventType any
	if ev.Type != "" {
		eventType = ev.Type
	}
	if _, err := tx.Exec(ctx, c.insert, id, c.cfg.Consumer, eventType, rec.Topic, rec.Partition, rec.Offset, legacyKey(rec, ev)); err != nil {
		return fmt.Errorf("insert into inbox: %w", err)
	}
	headers := make(map[string]string, len(rec.Headers))
	for _, h := range rec.Headers {
		if _, ok := headers[h.Key]; !ok {
			headers[h.Key] = string(h.Value)
		}
	}
	msg := cause.Error()
	if len(msg) > 8192 { // a panic's stack: the head says what happened
		msg = msg[:8192]
	}
	if _, err := tx.Exec(ctx, c.dead, id, c.cfg.Consumer, eventType, rec.Topic, rec.Partition, rec.Offset,
		rec.Key, rec.Value, headers, attempts, msg); err != nil {
		return fmt.Errorf("insert into %s (inbox.CreateTable creates it): %w", DeadLetterTable(c.cfg.Table), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// deadTableDDL is the dead-letter table's DDL (qt quoted).
func deadTableDDL(qt string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  event_id        text        NOT NULL,
  consumer_name   text        NOT NULL,
  event_type      text,
  topic           text        NOT NULL,
  kafka_partition integer     NOT NULL,
  kafka_offset    bigint      NOT NULL,
  record_key      bytea,
  record_value    bytea,
  headers         jsonb       NOT NULL,
  attempts        integer     NOT NULL,
  error_message   text        NOT NULL,
  failed_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (event_id, consumer_name)
);
`, qt)
}
