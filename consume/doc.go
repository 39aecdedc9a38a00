// Package consume is the consumer half of cdc-outbox: it reads the records
// cdc-outbox publishes (franz-go, a consumer group) and runs a handler for
// each one effectively once, by deduplicating on the event's source and id
// in the consumer's own PostgreSQL database (pgx).
//
// # What it owns
//
// For each record, in order per partition, one database transaction:
//
//	INSERT INTO processed_events (consumer_group, source, event_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING
//	-- a new row:     run the Handler with the same transaction, then COMMIT
//	-- a conflict:    the group already processed this event: skip it (counted)
//
// and only after the COMMIT, the Kafka offset. A crash between the two
// redelivers records whose work is committed; their insert then conflicts
// and they are skipped. The handler's writes and the dedupe row commit or
// roll back together, so a handler error leaves nothing behind.
//
// The event id is the record's "id" header (cdc-outbox sets it from the
// outbox row's id), and the source its "source" header (cdc-outbox's
// --source: which outbox the event comes from). Ids are unique only within
// one outbox, since each table has its own sequence, so a group that reads
// the topics of several services must tell their event 1s apart: the
// dedupe key is (group, source, id). A record from a streamer that sets no
// source header has source "". The table is sql/processed_events.sql (which
// also upgrades a table from before sources); Cleanup trims it. A
// CloudEvents record (cdc-outbox --record-format cloudevents-binary or
// cloudevents-structured) is identified by its CloudEvents id and source
// attributes instead: the ce_id and ce_source headers in binary mode, the
// event's id and source members in structured mode.
//
// A failing record is retried (Config.MaxAttempts, exponential backoff from
// Config.Backoff); after the last attempt Config.OnFailure decides, and
// nothing else: Stop (the default) makes Run return a *RecordError naming
// the event id, topic, partition and offset, with that offset uncommitted so
// a restart retries it; DeadLetter publishes the record to
// Config.DeadLetterTopic with headers saying where it came from and why it
// failed, records the event as processed, and moves on. A record without an
// id header (or with "id" or "source" headers that disagree) is never
// processed: it goes straight to OnFailure, untried.
//
// # Dead letters
//
// A dead-letter record has the original key, value and headers (the "id"
// header included) plus original_topic, original_partition,
// original_offset, original_timestamp, consumer_group, error and attempts.
// Once the broker has acknowledged it, the event is recorded in
// processed_events (its own statement, before the offset commit), so a
// redelivery of the event is skipped as a duplicate instead of being tried
// and dead-lettered again. A crash between the acknowledgement and that
// insert can dead-letter it twice: dead-letter readers dedupe by "id" too.
// To replay a dead-lettered event after fixing the cause, delete its row
// (DELETE FROM processed_events WHERE consumer_group = $1 AND source = $2
// AND event_id = $3)
// and produce the record to its original topic again. A record without a
// usable id (or source) cannot be recorded; each redelivery of it is
// dead-lettered again.
//
// A failure outside the handler (begin, the processed_events insert, the
// commit) is never dead-lettered: after the last attempt it stops Run under
// either policy, since a database outage says nothing about the event. A
// handler error that wraps ErrUnavailable (a dependency of the handler is
// down, such as the schema registry of consumeschema) is treated the same
// way.
//
// # What it must never do
//
//   - Commit a Kafka offset before the database transaction of every record
//     up to it has committed (or the record was dead-lettered): that is the
//     one way to lose an event.
//   - Skip an event silently: a record is processed, counted as a duplicate
//     of one that was, dead-lettered by explicit policy, or it stops Run
//     with an error. A record without an id header is never processed
//     without dedupe.
//   - Process a partition's records out of order, or move past a record
//     that is not finished.
//
// # Static membership
//
// A consumer that dies without leaving its group (kill -9, OOM, a lost
// node) keeps its partitions until the group's session timeout (45s by
// default) drops it; its replacement waits that long. Config.InstanceID
// makes the consumer a static member: a replacement joining with the same
// id takes over at once. Use a stable, unique id per instance, such as a
// StatefulSet pod name.
//
// # Observing it
//
// Config.Hooks sees every outcome (processed, duplicate, failed attempt,
// dead letter, failed offset commit) with the group, the record, its
// source and id. The module github.com/cdc-outbox/cdc-outbox/consume/consumeprom
// counts them in Prometheus; consume itself does not depend on
// client_golang. Logs go to Config.Logger (log/slog), errors under the key
// "error".
//
// # The module
//
// The package is a module of its own, github.com/cdc-outbox/cdc-outbox/consume,
// which depends on pgx and franz-go. It takes the database as a small
// interface (DB), which a *pgxpool.Pool satisfies.
package consume
