package idempotency

import "errors"

var (
	// ErrTxManaged is returned by Commit and Rollback on the transaction Tx
	// gives a handler: the middleware commits it together with the stored
	// response, or rolls it back when the handler responds 5xx or panics.
	// Nested transactions (tx.Begin, a savepoint) work as usual.
	ErrTxManaged = errors.New("idempotency: the middleware commits or rolls back this transaction; respond with a status instead (5xx rolls back)")

	// ErrOptions means New was given unusable Options; the message says
	// which field and why.
	ErrOptions = errors.New("idempotency: invalid options")
)

// Messages of the responses the middleware writes itself.
const (
	msgMissingKey   = "this request needs an Idempotency-Key header (a unique value, e.g. a UUID, reused only when retrying the same request)"
	msgBadKey       = "the Idempotency-Key header must be one value of 1 to 255 visible ASCII characters"
	msgMismatch     = "this Idempotency-Key was already used for a different request (method, path, query or body differ); use a new key for a new request"
	msgInProgress   = "a request with this Idempotency-Key is still being processed; retry later"
	msgBodyTooLarge = "request body too large"
	msgInternal     = "internal server error"
)
