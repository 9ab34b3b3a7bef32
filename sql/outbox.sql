-- The outbox table outbox-cdc reads (docs/contract: "What flows").
-- Insert one row per event in the same transaction as the business change.
CREATE TABLE IF NOT EXISTS outbox (
  id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb,
  created_at     timestamptz NOT NULL DEFAULT now()
);
-- outbox-cdc verify --since, the guide's cleanup (DELETE … WHERE created_at < …)
-- and the snapshot's order select by created_at.
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON outbox (created_at);
-- The seeds' (aggregate_type, aggregate_id, created_at) index serves a polling
-- relay's per-aggregate ordering; outbox-cdc reads the WAL in commit order and
-- needs none. Add it only to look up an aggregate's events in SQL:
-- CREATE INDEX IF NOT EXISTS outbox_aggregate_idx ON outbox (aggregate_type, aggregate_id, created_at);
