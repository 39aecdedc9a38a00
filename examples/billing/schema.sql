-- The billing example's own table. Apply it after sql/processed_events.sql
-- (the consume package's dedupe table), in billing's database: the invoice
-- and the processed_events row commit in one transaction.
--
--   psql "$BILLING_DB" -f sql/processed_events.sql -f examples/billing/schema.sql
--
-- Safe to run twice.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

CREATE TABLE IF NOT EXISTS invoices (
    id         bigserial   PRIMARY KEY,
    -- UNIQUE, and the insert has no ON CONFLICT on purpose: processed_events
    -- already makes a redelivered event a no-op, so a second invoice for a
    -- payment can only come from a bug, and it should fail loudly (the
    -- consumer stops with the event and offset) rather than be hidden.
    payment_id text        NOT NULL UNIQUE,
    event_id   text        NOT NULL,  -- the Kafka header "id" it was made from
    account    text        NOT NULL,
    amount     bigint      NOT NULL,
    currency   text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
