// Package idempotency makes mutating HTTP requests safe to retry: net/http
// middleware that runs each request carrying an Idempotency-Key header at
// most once to completion, and answers retries with the stored response.
// State lives in PostgreSQL, in the idempotency_keys table of
// sql/idempotency.sql.
//
// # How a request is handled
//
// GET, HEAD, OPTIONS and TRACE pass straight through. Any other method needs
// an Idempotency-Key header (400 without, unless Config.AllowMissingKey);
// keys are scoped by Config.ClientID, so clients cannot collide. The
// request is hashed (sha256 of method, path with query, and body) and the
// key claimed:
//
//   - new key: a short transaction of its own inserts the row as 'running'
//     with a lease (locked_until). Then the handler's transaction begins,
//     locks the row, and the handler runs with it (Tx). The middleware
//     buffers the response, and its status decides:
//   - 2xx or 3xx: the status, the configured headers and the body are
//     stored on the key row as 'completed' in that same transaction, which
//     commits, and only then is the response written.
//   - 4xx: the transaction rolls back, so a refused request leaves none of
//     the handler's writes behind, and the response is stored on the key
//     on its own: a retry gets the same refusal. CommitClientError makes a
//     4xx commit like a 2xx; 408, 425 and 429 (come back later) are treated
//     like a 5xx.
//   - 5xx or panic: the transaction rolls back and the claim is deleted, so
//     a retry runs the handler again, which is safe because nothing of the
//     first attempt committed. A panic becomes a 500.
//   - completed key, same hash: the stored response, verbatim, plus
//     Idempotent-Replayed: true; the handler does not run.
//   - any existing key, other hash: 422; the stored response is never
//     served for a different request.
//   - running key: 409 with Retry-After (seconds left on the lease).
//
// # Why the completion shares the handler's transaction
//
// The business rows, any outbox event (package outbox, written with Tx) and
// the 'completed' key commit atomically. There is no moment when the work is
// committed but the key still says 'running' (a retry would run it again),
// nor one when the key says 'completed' but the work is lost. A crash
// anywhere before the commit rolls back everything but the claim, and the
// claim only holds the key until its lease ends.
//
// # The claim, the lease and the race
//
// The claim commits on its own so that a duplicate arriving while the first
// request runs sees it at once and gets 409 instead of queueing behind the
// first transaction, holding a connection. The lease bounds how long a
// claim whose owner died (process crash, lost connection: its transaction
// rolled back) keeps the key: after locked_until, a retry takes the key
// over.
//
// A lease alone would let a slow owner that outlives it run concurrently
// with the retry that took over. So the handler's transaction also holds a
// row lock on the key (SELECT ... FOR UPDATE NOWAIT, right after BEGIN) until
// it commits or rolls back, and a takeover only touches a row it can lock
// at once (FOR UPDATE SKIP LOCKED) whose lease has ended. A live owner, even
// past its lease, therefore keeps its key; only a dead owner's key, whose
// lock died with its transaction, can be taken over. Each claim carries a
// random claim_token, and the owner locks and completes only the row with
// its own token, so an owner whose claim was taken over (it stalled before
// locking) backs off with 409 and runs nothing.
//
// Keys expire Config.TTL after their claim: an expired key is treated as
// absent, and Cleanup deletes expired rows in batches.
//
// DeriveKey and RequestKey derive stable keys for the calls a handler makes
// to other services (a payment provider, say), so that a retry of our
// request is also a safe retry of theirs. A request without a key gets a
// random RequestKey of its own, so its calls never pass for retries of
// another request's.
//
// # What it must never do
//
// It must never run a handler for a key whose first request may still be
// running or has completed, never serve a stored response to a request
// with another hash or another client, never commit the handler's work
// without completing the key, never store a success whose work did not
// commit, and never write a response to the client before the transaction
// that makes it true has committed.
// The handler must not commit or roll back the transaction it gets from Tx
// (those calls return ErrTxManaged); the middleware owns it.
//
// # The module
//
// The package is a module of its own,
// github.com/cdc-outbox/cdc-outbox/idempotency, which depends on pgx and
// nothing else. It takes the database as a small interface (DB), which a
// *pgxpool.Pool satisfies, and logs through log/slog with the error under
// the key "error".
package idempotency
