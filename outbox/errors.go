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
	// its topic is one Kafka refuses, or a header is unusable. The message
	// names the field.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrInvalidPayload means Event.Payload is not valid JSON: marshal it
	// with encoding/json, or pass json.RawMessage(`null`) for an event
	// without data. It wraps ErrInvalidEvent.
	ErrInvalidPayload = fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
	// ErrInvalidTraceparent means a string is not a W3C traceparent
	// (version-traceid-parentid-flags in lower-case hex, ids not all zero).
	ErrInvalidTraceparent = errors.New("outbox: invalid traceparent")
	// ErrNoTx means Write or WriteSQL was given a nil transaction. Pass the
	// transaction of the business write: an outbox row written outside it
	// would defeat the pattern, so there is no variant that takes a pool or
	// a connection.
	ErrNoTx = errors.New("outbox: nil transaction")
)

// ConfigError is one problem with a Config. New returns every problem at
// once, joined with errors.Join; errors.As finds the first.
type ConfigError struct {
	Field   string // the Config field at fault, e.g. "Table"
	Problem string // what is wrong with it
}

func (e *ConfigError) Error() string {
	return "outbox: Config." + e.Field + ": " + e.Problem
}
