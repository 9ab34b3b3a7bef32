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
