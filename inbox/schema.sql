-- Inbox table for github.com/outbox-cdc/outbox-cdc/inbox: one row per event a
-- consumer has processed, written in the same transaction as the consumer's
-- own changes. The primary key makes a redelivered event a no-op.
-- inbox.CreateTable creates the same table under any name; rows older than the
-- retention are removed with inbox.Cleanup (docs/guide.md says how long to keep them).
-- inbox_dead holds the records the consumer parked (inbox.Poison, Config.MaxAttempts).
-- inbox_versions holds the last aggregate version each consumer applied and the events applied at it
-- (Consumer.ApplyVersion); the ALTER adds event_ids to a table created by an older release.
CREATE TABLE IF NOT EXISTS inbox (
  event_id        text        NOT NULL,
  consumer_name   text        NOT NULL,
  event_type      text,
  topic           text        NOT NULL,
  kafka_partition integer     NOT NULL,
  kafka_offset    bigint      NOT NULL,
  processed_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (event_id, consumer_name)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at_idx ON inbox (processed_at);
CREATE TABLE IF NOT EXISTS inbox_dead (
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
CREATE TABLE IF NOT EXISTS inbox_versions (
  consumer_name  text   NOT NULL,
  aggregate_type text   NOT NULL,
  aggregate_id   text   NOT NULL,
  version        bigint NOT NULL,
  event_ids      text[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
);
ALTER TABLE inbox_versions ADD COLUMN IF NOT EXISTS event_ids text[] NOT NULL DEFAULT '{}';
