// Package outbox writes events into the outbox table that cdc-outbox streams
// to Kafka.
//
// A service calls Write (pgx) or WriteSQL (database/sql) with the
// transaction that holds its business write. The event row commits or rolls
// back with that write, so an event exists if and only if the change it
// describes exists: no dual write, no event for a rolled-back change, no
// change without its event. The returned id is the event id consumers dedupe
// by (the Kafka header "id").
//
// It owns the shape of an outbox row: which columns get which Event field
// (Config, whose defaults match sql/publication.sql and the streamer's flag
// defaults), and the checks that keep a row publishable. An event the
// streamer would have to treat as a bad event (an empty aggregate type,
// aggregate id or event type, a payload that is not JSON, a header that
// collides with the streamer's own "id", "event_type" or "aggregate_type"
// headers or is larger than the streamer's 64 KiB header limit) is rejected
// here, before the insert, with an error wrapping ErrInvalidEvent, rather
// than stopping the stream later.
//
// It also carries a W3C traceparent from a request into the event headers
// (ContextWithTraceparent, WithTraceparent) without depending on
// OpenTelemetry: whatever middleware knows the current trace puts its
// traceparent into the context, and the event carries it to the consumer.
//
// It must never begin, commit or roll back a transaction: the caller's
// transaction is the whole point, and the package only adds statements to
// it. It must never talk to Kafka or to the replication stream either; the
// streamer does that from the WAL.
package outbox
