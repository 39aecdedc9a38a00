-- The payments example's own table. Apply it after sql/publication.sql (the
-- outbox table and its publication) and sql/idempotency.sql (the
-- middleware's keys), in the same database: the payment, its outbox event
-- and the completed idempotency key commit in one transaction, which only
-- works within one database.
--
--   psql "$PAYMENTS_DB" -f sql/publication.sql -f sql/idempotency.sql -f examples/payments/schema.sql
--
-- Safe to run twice.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

CREATE TABLE IF NOT EXISTS payments (
    -- "pay_" and a UUID derived from the request's Idempotency-Key, so a
    -- retried request inserts the same id (see examples/payments/payments).
    id         text        PRIMARY KEY,
    account    text        NOT NULL,
    amount     bigint      NOT NULL CHECK (amount > 0),  -- minor units (cents)
    currency   text        NOT NULL,
    -- The provider's charge. Set in the same transaction as the insert,
    -- after the charge succeeded: a committed payment always has one.
    charge_id  text,
    created_at timestamptz NOT NULL DEFAULT now()
);
