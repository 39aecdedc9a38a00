-- The table behind package idempotency (github.com/cdc-outbox/cdc-outbox/idempotency):
-- one row per (client, Idempotency-Key). Safe to run twice.

SET client_min_messages = warning;  -- quiet "already exists, skipping" on a second run

CREATE TABLE IF NOT EXISTS idempotency_keys (
    -- Keys are scoped by client: two clients that pick the same key are two
    -- requests, and one can never be served the other's stored response.
    client_id        text        NOT NULL,
    key              text        NOT NULL,
    -- sha256 of method, path with query, and body. A retry must be the same
    -- request; the same key with another hash is refused (422), never
    -- answered with the first request's response.
    request_hash     bytea       NOT NULL,
    -- 'running': claimed, the handler's transaction has not committed.
    -- 'completed': the handler's work committed together with the response
    -- below, which retries are served verbatim.
    status           text        NOT NULL CHECK (status IN ('running', 'completed')),
    -- Random token of the current claim. Whoever takes over an abandoned
    -- claim writes a new one, so a late first owner can no longer complete
    -- the key (it finds its token gone and rolls back).
    claim_token      uuid        NOT NULL,
    -- The claim's lease: until then a duplicate gets 409 Retry-After; after
    -- it, a claim whose owner crashed (its transaction rolled back with it)
    -- may be taken over, so no key is stuck for good. NULL once completed.
    locked_until     timestamptz,
    response_code    int,
    response_headers jsonb,      -- only the headers the middleware is told to keep: {"Content-Type": ["..."]}
    response_body    bytea,
    -- Keys expire this long after their claim; see the index below.
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, key),
    CHECK (status = 'running' AND locked_until IS NOT NULL
        OR status = 'completed' AND response_code IS NOT NULL)
);

-- Cleanup deletes expired keys oldest first, a batch at a time
-- (WHERE created_at < now() - ttl ORDER BY created_at LIMIT n): without this
-- index every batch would scan the whole table.
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);
