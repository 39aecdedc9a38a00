// Package mapping owns the row→record contract: it turns one inserted outbox
// row, as its column values arrive from pgoutput in PostgreSQL's text output
// format, into one *kgo.Record.
//
//   - Topic: the topic template (default "outbox.event.{aggregate_type}")
//     rendered over column values, and checked against Kafka's topic rules.
//   - Key: the aggregate_id text, byte for byte.
//   - Value: the payload exactly as stored: json/jsonb text as PostgreSQL
//     prints it, text/varchar holding valid JSON, or bytea decoded from hex.
//   - Headers: id, event_type, aggregate_type, source (Config.Source, the
//     same for every record), then the top-level members of the headers
//     json object in document order (strings unescaped, other values as
//     their JSON text).
//   - Timestamp: created_at, or zero (the producer stamps it) when the
//     column is absent or NULL.
//
// That is the native record format. Config.Format may lay the same event
// out as a CloudEvent instead (format.go), in the binary or the structured
// mode of the CloudEvents Kafka protocol binding.
//
// A row that cannot honour this contract is a *BadEventError saying what to
// fix; the caller decides whether to stop or dead-letter it.
//
// The package is pure: it must never do I/O, read the clock or log, and it
// must never silently drop or alter a value — a row is published as stored
// or rejected. The record never aliases the caller's column buffers.
package mapping
