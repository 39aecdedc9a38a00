-- The dedupe table of the consume package (github.com/cdc-outbox/cdc-outbox/consume),
-- in the consumer's own database. Safe to run twice.
--
-- cdc-outbox delivers at least once: after a crash a few events reach Kafka
-- again, and a consumer group can be handed a record it already processed
-- (rebalance, restart before its offset commit, offset reset). The consumer
-- inserts the event id here in the same transaction as its business write;
-- the insert conflicts for an event the group already processed, and the
-- consumer skips it, so a repeat is harmless.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

CREATE TABLE IF NOT EXISTS processed_events (
    -- The Kafka header "id": the outbox row's id, as text so that any id
    -- type (bigserial, uuid, ...) fits.
    event_id       text        NOT NULL,
    -- The Kafka consumer group. Each group processes every event once, so
    -- two services (billing, shipping) sharing a database do not see each
    -- other's events as duplicates.
    consumer_group text        NOT NULL,
    -- When the event was processed (the database clock); Cleanup deletes by it.
    processed_at   timestamptz NOT NULL DEFAULT now(),
    -- The dedupe key. consumer_group first: one group's rows are one range
    -- of the index, and the ON CONFLICT check is a single index probe.
    PRIMARY KEY (consumer_group, event_id)
);

-- Cleanup (consume.Cleanup) deletes rows older than the retention in small
-- batches, oldest first; without this index each batch would scan the whole
-- table. Keep the retention longer than any redelivery can be late (at the
-- very least the Kafka topics' retention.ms if group offsets may ever be
-- reset), or a late duplicate is processed a second time.
CREATE INDEX IF NOT EXISTS processed_events_processed_at ON processed_events (processed_at);
