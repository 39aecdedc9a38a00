package outbox

import (
	"errors"
	"fmt"
)

// Errors callers branch on with errors.Is. Every validation error wraps
// ErrInvalidEvent, so one check tells "this event is wrong, retrying will not
// help" from a database error; the more specific ones wrap it too.
var (
	// ErrInvalidEvent means the event was rejected before anything was sent
	// to the database: a required field is empty, the payload is not JSON,
	// or a header is unusable. The message names the field and what to fix.
	ErrInvalidEvent = errors.New("outbox: invalid event")

	// ErrInvalidPayload means Event.Payload is not valid JSON. It wraps
	// ErrInvalidEvent.
	ErrInvalidPayload = fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)

	// ErrInvalidTraceparent means a string is not a W3C traceparent
	// (version-traceid-parentid-flags in lower-case hex, ids not all zero).
	ErrInvalidTraceparent = errors.New("outbox: invalid traceparent")

	// ErrNoTx means Write or WriteSQL was given a nil transaction. An outbox
	// row written outside the business transaction would defeat the
	// pattern, so there is no variant that takes a pool or a connection.
	ErrNoTx = errors.New("outbox: no transaction: pass the transaction of the business write")
)
