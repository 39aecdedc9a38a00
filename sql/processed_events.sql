-- The dedupe table of the consume package (github.com/cdc-outbox/cdc-outbox/consume),
-- in the consumer's own database. Safe to run twice; it also upgrades a
-- table created by an earlier version (see the end).
--
-- cdc-outbox delivers at least once: after a crash a few events reach Kafka
-- again, and a consumer group can be handed a record it already processed
-- (rebalance, restart before its offset commit, offset reset). The consumer
-- inserts the event's source and id here in the same transaction as its
-- business write; the insert conflicts for an event the group already
-- processed, and the consumer skips it, so a repeat is harmless.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

CREATE TABLE IF NOT EXISTS processed_events (
    -- The Kafka consumer group. Each group processes every event once, so
    -- two services (billing, shipping) sharing a database do not see each
    -- other's events as duplicates.
    consumer_group text        NOT NULL,
    -- The Kafka header "source": which outbox the event comes from
    -- (cdc-outbox --source). Event ids are only unique within one outbox
    -- (each table has its own bigserial), so a group reading several
    -- services' topics needs both. '' for records of a streamer that sets
    -- no source.
    source         text        NOT NULL DEFAULT '',
    -- The Kafka header "id": the outbox row's id, as text so that any id
    -- type (bigserial, uuid, ...) fits.
    event_id       text        NOT NULL,
    -- When the event was processed (the database clock); Cleanup deletes by it.
    processed_at   timestamptz NOT NULL DEFAULT now(),
    -- The dedupe key. consumer_group first: one group's rows are one range
    -- of the index, and the ON CONFLICT check is a single index probe.
    PRIMARY KEY (consumer_group, source, event_id)
);

-- Cleanup (consume.Cleanup) deletes rows older than the retention in small
-- batches, oldest first; without this index each batch would scan the whole
-- table. Keep the retention longer than any redelivery can be late (at the
-- very least the Kafka topics' retention.ms if group offsets may ever be
-- reset), or a late duplicate is processed a second time.
CREATE INDEX IF NOT EXISTS processed_events_processed_at ON processed_events (processed_at);

-- Upgrade of a table from before sources, keyed on (consumer_group,
-- event_id): its rows get source '', which is what the records they were
-- made from carry (they have no source header), so a replay of those
-- records is still skipped. Then the key takes the source in.
--
-- Rebuilding the key locks the table while it builds; on a large table,
-- build the index first without blocking and swap it in:
--   CREATE UNIQUE INDEX CONCURRENTLY processed_events_key ON processed_events (consumer_group, source, event_id);
--   ALTER TABLE processed_events DROP CONSTRAINT processed_events_pkey,
--     ADD CONSTRAINT processed_events_pkey PRIMARY KEY USING INDEX processed_events_key;
-- Apply this file, then restart the consumers with the consume version
-- that reads sources: one still running keeps working meanwhile, one
-- started on the old version refuses the upgraded table. Stop cdc-outbox
-- with SIGTERM (not kill -9) when upgrading it to the version that sets
-- sources, so that no event is delivered once without a source and again
-- with one, which the consumer could not tell apart.
ALTER TABLE processed_events ADD COLUMN IF NOT EXISTS source text NOT NULL DEFAULT '';
DO $$
DECLARE
    pk name;
BEGIN
    SELECT conname INTO pk FROM pg_constraint
    WHERE conrelid = 'processed_events'::regclass AND contype = 'p';
    IF pk IS NULL THEN
        ALTER TABLE processed_events ADD PRIMARY KEY (consumer_group, source, event_id);
    ELSIF (SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'processed_events'::regclass AND conname = pk)
          <> 'PRIMARY KEY (consumer_group, source, event_id)' THEN
        EXECUTE format('ALTER TABLE processed_events DROP CONSTRAINT %I, ADD PRIMARY KEY (consumer_group, source, event_id)', pk);
    END IF;
END
$$;
