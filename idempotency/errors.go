package idempotency

import "errors"

// ErrTxManaged is returned by Commit and Rollback on the transaction Tx
// gives a handler: the middleware ends it, and the handler decides how with
// its status (see Tx). Nested transactions (tx.Begin, a savepoint) work as
// usual.
var ErrTxManaged = errors.New("idempotency: transaction managed by the middleware")

// ConfigError is one problem with a Config. New returns every problem at
// once, joined with errors.Join; errors.As finds the first.
type ConfigError struct {
	Field   string // the Config field at fault, e.g. "ClientID"
	Problem string // what is wrong with it
}

func (e *ConfigError) Error() string {
	return "idempotency: Config." + e.Field + ": " + e.Problem
}

// Messages of the responses the middleware writes itself: they speak to
// the client, so they say what to do.
const (
	msgMissingKey   = "this request needs an Idempotency-Key header (a unique value, e.g. a UUID, reused only when retrying the same request)"
	msgBadKey       = "the Idempotency-Key header must be one value of 1 to 255 visible ASCII characters"
	msgMismatch     = "this Idempotency-Key was already used for a different request (method, path, query or body differ); use a new key for a new request"
	msgInProgress   = "a request with this Idempotency-Key is still being processed; retry later"
	msgBodyTooLarge = "request body too large"
	msgInternal     = "internal server error"
)
