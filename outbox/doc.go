// Package outbox writes events into the outbox table that cdc-outbox streams
// to Kafka.
//
// A service calls Write (pgx) or WriteSQL (database/sql) with the
// transaction that holds its business write. The event row commits or rolls
// back with that write, so an event exists if and only if the change it
// describes exists: no dual write, no event for a rolled-back change, no
// change without its event. The returned id is the event id consumers dedupe
// by (the Kafka header "id"), as text, whatever the id column's type.
//
// It writes the outbox row that package contract defines: which columns
// get which Event field (Config, whose defaults are the contract's, those of
// sql/publication.sql and of the streamer), and the checks that keep a row
// publishable. An event the
// streamer would have to treat as a bad event is rejected here, before the
// insert, with an error wrapping ErrInvalidEvent, rather than stopping the
// stream later: an empty aggregate type, aggregate id or event type; an
// aggregate type that makes a topic Kafka refuses ("payments/eu", "payment
// refund", non-ASCII, too long; the rules are package topic's, which the
// streamer applies too); a payload that is not JSON; a header that
// collides with the streamer's own "id", "event_type", "aggregate_type" or
// "source" headers or is larger than its 64 KiB header limit. Validate
// runs the same checks without a database.
//
// Emit (pgx) and EmitSQL (database/sql) write the same event without a
// table: as a transactional logical decoding message
// (pg_logical_emit_message) that PostgreSQL writes to the WAL alone and the
// streamer publishes as the record the row would have become, with the same
// checks, and an event id Emit makes (a UUID). It is cheaper than a row
// (no heap tuple, no index entry, nothing to delete or vacuum) and leaves
// nothing to query or republish from.
//
// It also carries a W3C traceparent (and tracestate) from a request into
// the event headers (ContextWithTraceparent, ContextWithTraceContext,
// WithTraceparent) without depending on OpenTelemetry: whatever middleware
// knows the current trace puts its traceparent into the context, and the
// event carries it to the consumer, through cdc-outbox's own span when it
// traces. A service that uses OpenTelemetry can let its propagator fill
// the same headers instead, since Event.Headers is the map[string]string
// that propagation.MapCarrier is:
//
//	headers := map[string]string{}
//	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(headers))
//	outbox.Write(ctx, tx, outbox.Event{..., Headers: headers})
//
// It must never begin, commit or roll back a transaction: the caller's
// transaction is the whole point, and the package only adds statements to
// it. It must never talk to Kafka or to the replication stream either; the
// streamer does that from the WAL.
//
// The package is a module of its own, github.com/cdc-outbox/cdc-outbox/outbox,
// which depends on pgx and nothing else: a service that writes events does
// not get the streamer's or the consumer's dependencies.
package outbox
