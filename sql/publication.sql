-- The default outbox table and the publication cdc-outbox streams from.
-- Safe to run twice. cdc-outbox's defaults (--table public.outbox,
-- --publication cdc_outbox, column names) match this file.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

-- One row per event. A service inserts it in the same transaction as its
-- business write, so the event exists if and only if the write committed.
CREATE TABLE IF NOT EXISTS outbox (
    id             bigserial   PRIMARY KEY,          -- event id: Kafka header "id"; consumers dedupe by it
    aggregate_type text        NOT NULL,             -- picks the topic: outbox.event.<aggregate_type>
    aggregate_id   text        NOT NULL,             -- Kafka key: one aggregate's events stay in order
    event_type     text        NOT NULL,             -- Kafka header "event_type"
    payload        jsonb       NOT NULL,             -- Kafka value, as stored
    headers        jsonb,                            -- extra Kafka headers, e.g. {"traceparent": "..."}
    created_at     timestamptz NOT NULL DEFAULT now() -- Kafka record timestamp
);

-- Insert-only: cdc-outbox publishes inserts, so updates and deletes need not
-- be decoded or sent at all. That also makes the insert-then-delete pattern
-- cheap: a service may INSERT the event and DELETE it again in the same
-- transaction, the table stays empty (no cleanup job, no bloat), and the
-- insert still reaches the WAL and is streamed.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'cdc_outbox') THEN
        CREATE PUBLICATION cdc_outbox FOR TABLE outbox WITH (publish = 'insert');
    END IF;
END
$$;
