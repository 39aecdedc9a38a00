package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every statement names the table unqualified: it is found by search_path,
// like the CREATE TABLE in sql/idempotency.sql. Durations travel as
// microseconds (n * interval '1 microsecond') so the SQL works in every pgx
// query mode.
const (
	// A new key: claimed if the insert happened. DO NOTHING never waits on a
	// committed row, locked or not, so a duplicate is never held up here.
	sqlInsertClaim = `INSERT INTO idempotency_keys (client_id, key, request_hash, status, claim_token, locked_until)
VALUES ($1, $2, $3, 'running', $4, now() + $5 * interval '1 microsecond')
ON CONFLICT (client_id, key) DO NOTHING`

	// The existing row, read without locking, to decide what to answer.
	sqlReadKey = `SELECT request_hash, status, claim_token,
       created_at < now() - $3 * interval '1 microsecond',
       coalesce(locked_until > now(), false),
       coalesce(greatest(1, ceil(extract(epoch FROM locked_until - now())))::int, 1),
       response_code, response_headers, response_body
FROM idempotency_keys WHERE client_id = $1 AND key = $2`

	// Take over an expired key, or a running key whose lease ended, with a
	// new claim. The subquery locks the row only if nobody holds it (SKIP
	// LOCKED: a live owner's handler transaction does, for as long as it
	// runs) and re-checks the conditions on the row as it is now, so a key
	// completed since it was read is not taken.
	sqlTakeover = `UPDATE idempotency_keys
SET request_hash = $3, status = 'running', claim_token = $4,
    locked_until = now() + $5 * interval '1 microsecond', created_at = now(),
    response_code = NULL, response_headers = NULL, response_body = NULL
WHERE (client_id, key) = (
    SELECT client_id, key FROM idempotency_keys
    WHERE client_id = $1 AND key = $2 AND claim_token = $6
      AND (created_at < now() - $7 * interval '1 microsecond'
           OR status = 'running' AND locked_until <= now() AND request_hash = $3)
    FOR UPDATE SKIP LOCKED)`

	// First statement of the handler's transaction: hold the row for as
	// long as the handler runs. NOWAIT: if someone holds it, we lost it.
	sqlLockClaim = `SELECT 1 FROM idempotency_keys
WHERE client_id = $1 AND key = $2 AND claim_token = $3 AND status = 'running'
FOR UPDATE NOWAIT`

	sqlComplete = `UPDATE idempotency_keys
SET status = 'completed', locked_until = NULL, response_code = $4, response_headers = $5, response_body = $6
WHERE client_id = $1 AND key = $2 AND claim_token = $3 AND status = 'running'`

	// Only our own unfinished claim: if our commit did happen after all,
	// the row is 'completed' and stays.
	sqlRelease = `DELETE FROM idempotency_keys
WHERE client_id = $1 AND key = $2 AND claim_token = $3 AND status = 'running'`

	sqlCleanup = `DELETE FROM idempotency_keys WHERE (client_id, key) IN (
    SELECT client_id, key FROM idempotency_keys
    WHERE created_at < $1
    ORDER BY created_at LIMIT $2
    FOR UPDATE SKIP LOCKED)`
)

type outcome int

const (
	claimed    outcome = iota // run the handler
	replay                    // serve the stored response
	inProgress                // 409
	mismatch                  // 422
)

// claim is one request's hold on a key.
type claim struct {
	client, key string
	hash        []byte
	token       string // a UUID, as text: works in every pgx query mode
}

// stored is a completed key's response.
type stored struct {
	code    int
	headers http.Header
	body    []byte
}

type claimResult struct {
	outcome    outcome
	retryAfter int // seconds, for inProgress
	resp       stored
}

type store struct {
	db         DB
	lease, ttl time.Duration
}

// claim tries to take c.key for this request. Each attempt is one
// autocommitted statement, so the claim is visible to duplicates at once.
// A few attempts cover a row deleted (released) between the insert and the
// read; a takeover that loses a race answers 409, never runs twice.
func (s *store) claim(ctx context.Context, c *claim) (claimResult, error) {
	c.token = newToken()
	lease, ttl := s.lease.Microseconds(), s.ttl.Microseconds()
	for attempt := 0; attempt < 3; attempt++ {
		tag, err := s.db.Exec(ctx, sqlInsertClaim, c.client, c.key, c.hash, c.token, lease)
		if err != nil {
			return claimResult{}, fmt.Errorf("idempotency: claim key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claimResult{outcome: claimed}, nil
		}

		var (
			hash            []byte
			status          string
			token           string
			expired, leased bool
			retryAfter      int
			code            *int32
			headers         []byte
			body            []byte
		)
		err = s.db.QueryRow(ctx, sqlReadKey, c.client, c.key, ttl).Scan(
			&hash, &status, &token, &expired, &leased, &retryAfter, &code, &headers, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released since the insert: try again
		}
		if err != nil {
			return claimResult{}, fmt.Errorf("idempotency: read key: %w", err)
		}

		switch {
		case expired:
			// An expired key is a new key, whatever it was used for.
		case !bytes.Equal(hash, c.hash):
			return claimResult{outcome: mismatch}, nil
		case status == "completed":
			resp := stored{code: int(*code), body: body}
			if err := json.Unmarshal(headers, &resp.headers); err != nil && headers != nil {
				return claimResult{}, fmt.Errorf("idempotency: key %q: stored headers: %w", c.key, err)
			}
			return claimResult{outcome: replay, resp: resp}, nil
		case leased:
			return claimResult{outcome: inProgress, retryAfter: retryAfter}, nil
		}
		tag, err = s.db.Exec(ctx, sqlTakeover, c.client, c.key, c.hash, c.token, lease, token, ttl)
		if err != nil {
			return claimResult{}, fmt.Errorf("idempotency: take over key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claimResult{outcome: claimed}, nil
		}
		// Locked by a live owner past its lease, or changed meanwhile:
		// someone else has the key.
		return claimResult{outcome: inProgress, retryAfter: 1}, nil
	}
	return claimResult{outcome: inProgress, retryAfter: 1}, nil
}

// lock makes tx, the handler's transaction, hold c's row until it ends.
// It reports false when the claim is no longer ours (taken over) or is
// locked by someone else.
func lock(ctx context.Context, tx pgx.Tx, c *claim) (bool, error) {
	var one int
	err := tx.QueryRow(ctx, sqlLockClaim, c.client, c.key, c.token).Scan(&one)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return false, nil
	case err != nil:
		return false, fmt.Errorf("idempotency: lock key: %w", err)
	}
	return true, nil
}

// execer is what complete runs on: the handler's transaction, or the DB
// itself once that transaction rolled back.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// complete stores the response on c's row: in the handler's transaction,
// which holds the row lock, or on its own after that transaction rolled
// back (a 4xx). It reports false when the claim is no longer ours.
func complete(ctx context.Context, db execer, c *claim, resp stored) (bool, error) {
	headers, err := json.Marshal(resp.headers) // a string, not a map: every query mode encodes it
	if err != nil {
		return false, fmt.Errorf("idempotency: store response headers: %w", err)
	}
	tag, err := db.Exec(ctx, sqlComplete, c.client, c.key, c.token, resp.code, string(headers), resp.body)
	if err != nil {
		return false, fmt.Errorf("idempotency: store response: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// release deletes c's unfinished claim so a retry can run at once rather
// than wait for the lease.
func (s *store) release(ctx context.Context, c *claim) error {
	if _, err := s.db.Exec(ctx, sqlRelease, c.client, c.key, c.token); err != nil {
		return fmt.Errorf("idempotency: release key: %w", err)
	}
	return nil
}

// DefaultCleanupBatchSize is Cleanup's batch size when it is given 0.
const DefaultCleanupBatchSize = 1000

// Cleanup deletes the keys claimed more than olderThan ago (pass
// Config.TTL; by the database clock, from one cutoff taken when it starts)
// from idempotency_keys, at most batchSize rows per statement (0 means
// DefaultCleanupBatchSize) so that no statement holds many locks or runs
// long, and returns how many it deleted. Run it periodically, e.g. hourly;
// it uses the created_at index of sql/idempotency.sql. Rows locked by a
// request still running are skipped. The middleware already treats expired
// keys as absent, so Cleanup only reclaims space.
func Cleanup(ctx context.Context, db DB, olderThan time.Duration, batchSize int) (int64, error) {
	switch {
	case db == nil:
		return 0, errors.New("idempotency: Cleanup: nil DB")
	case olderThan <= 0:
		return 0, fmt.Errorf("idempotency: Cleanup: olderThan %v is not positive", olderThan)
	case batchSize < 0:
		return 0, fmt.Errorf("idempotency: Cleanup: batchSize %d is negative", batchSize)
	case batchSize == 0:
		batchSize = DefaultCleanupBatchSize
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("idempotency: Cleanup: %w", err)
	}
	var total int64
	for {
		tag, err := db.Exec(ctx, sqlCleanup, cutoff, batchSize)
		if err != nil {
			return total, fmt.Errorf("idempotency: Cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

// newToken returns a random version 4 UUID.
func newToken() string {
	var t [16]byte
	_, _ = rand.Read(t[:]) // never fails (crypto/rand since Go 1.24)
	t[6] = t[6]&0x0f | 0x40
	t[8] = t[8]&0x3f | 0x80
	return formatUUID(t)
}
