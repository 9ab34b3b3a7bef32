package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// SchemaSQL is schema.sql: the inbox table with the default name. Schema
// returns the same statements for any table name.
//
//go:embed schema.sql
var SchemaSQL string

// cleanupBatch bounds the rows one DELETE removes, keeping each statement
// (and its locks and WAL burst) short.
const cleanupBatch = 5000

// Schema returns the DDL of an inbox table named table ("table" or
// "schema.table"; exact, case-sensitive names): the columns event_id,
// consumer_name, event_type, topic, kafka_partition, kafka_offset and
// processed_at, the primary key (event_id, consumer_name) and an index on
// processed_at for Cleanup; and the dead-letter table DeadLetterTable(table)
// where parked records go (Config.MaxAttempts, Poison); and VersionTable(table),
// where ApplyVersion keeps each aggregate's last version. Every statement uses
// IF NOT EXISTS, so running it again adds the dead-letter table to an
// existing inbox.
func Schema(table string) (string, error) {
	qt, err := quoteTable(table)
	if err != nil {
		return "", err
	}
	dt, err := quoteTable(DeadLetterTable(table))
	if err != nil {
		return "", err
	}
	vt, err := quoteTable(VersionTable(table))
	if err != nil {
		return "", err
	}
	name := table[strings.LastIndexByte(table, '.')+1:]
	idx := pgx.Identifier{name + "_processed_at_idx"}.Sanitize()
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  event_id        text        NOT NULL,
  consumer_name   text        NOT NULL,
  event_type      text,
  topic           text        NOT NULL,
  kafka_partition integer     NOT NULL,
  kafka_offset    bigint      NOT NULL,
  processed_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (event_id, consumer_name)
);
CREATE INDEX IF NOT EXISTS %s ON %s (processed_at);
`, qt, idx, qt) + deadTableDDL(dt) + versionTableDDL(vt), nil
}

// CreateTable creates the inbox table (Schema) if it does not exist.
func CreateTable(ctx context.Context, db Execer, table string) error {
	ddl, err := Schema(table)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("inbox: create table %s: %w", table, err)
	}
	return nil
}

// Cleanup deletes consumer's rows of the default inbox table ("inbox")
// processed more than olderThan ago, and returns how many it deleted. See
// CleanupTable.
func Cleanup(ctx context.Context, db Execer, consumer string, olderThan time.Duration) (int64, error) {
	return CleanupTable(ctx, db, DefaultTable, consumer, olderThan)
}

// Cleanup deletes the consumer's rows (its Table and Consumer) processed more
// than olderThan ago. See CleanupTable.
func (c *Consumer) Cleanup(ctx context.Context, db Execer, olderThan time.Duration) (int64, error) {
	return CleanupTable(ctx, db, c.cfg.Table, c.cfg.Consumer, olderThan)
}

// CleanupTable deletes the rows of table whose consumer_name is consumer
// and that were processed more than olderThan ago (by the database clock),
// in batches of a few thousand rows, each its own statement. Run it
// periodically. Only consumer's rows go: services sharing an inbox table
// each keep their own retention.
//
// olderThan is the inbox retention and must exceed the longest time after
// which an event can still be delivered again: the sum of the topic's
// retention (a new or reset consumer group reads that far back, and a copy
// redelivered late can itself be re-read for a full retention), the longest
// consumer lag, retry wait or outage you tolerate, and any replay window
// (outbox-cdc replay, a reset of the group's offsets), plus a margin for
// investigating and repairing incidents. A row deleted earlier turns a late
// redelivery into a second processing. Kafka's default topic retention is 7
// days; 14 days or more is usual.
func CleanupTable(ctx context.Context, db Execer, table, consumer string, olderThan time.Duration) (int64, error) {
	if olderThan <= 0 {
		return 0, errors.New("inbox: cleanup: retention must be positive")
	}
	if consumer == "" {
		return 0, errors.New("inbox: cleanup: consumer name required")
	}
	qt, err := quoteTable(table)
	if err != nil {
		return 0, err
	}
	sql := fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM %[1]s WHERE consumer_name = $3 AND processed_at < now() - make_interval(secs => $1) LIMIT $2))`, qt)
	var total int64
	for {
		tag, err := db.Exec(ctx, sql, olderThan.Seconds(), cleanupBatch, consumer)
		if err != nil {
			return total, fmt.Errorf("inbox: cleanup %s: %w", table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < cleanupBatch {
			return total, nil
		}
	}
}

// quoteTable quotes "table" or "schema.table" as an SQL identifier.
func quoteTable(table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 || slices.Contains(parts, "") {
		return "", fmt.Errorf("inbox: table %q: want table or schema.table", table)
	}
	return pgx.Identifier(parts).Sanitize(), nil
}
