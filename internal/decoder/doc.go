// Package decoder turns pgoutput messages (protocol version 1), as they arrive
// in XLogData, into events: Begin, Insert of an outbox row, Commit, and Skip for
// changes the streamer does not publish (updates, deletes and truncates of the
// outbox table, changes of other tables).
//
// It owns the relation cache: Relation messages are kept by relation id and
// replaced when they change, and each Insert's column values are found by
// column name through that cache, so column order and extra columns do not
// matter.
//
// It is pure: bytes in, events out. It must never open a connection, read a
// clock, log, or allocate per column on the hot path; the values it returns
// alias the message buffer and are valid only until the next Decode.
//
// Every message is validated in full, including the tuples of skipped
// updates and deletes and the absence of trailing bytes, because a message
// that does not parse exactly means the stream and the relation cache are out
// of step, and guessing could publish the wrong data. Errors are
// *MessageError values wrapping the sentinels in errors.go; a message type
// outside protocol version 1 is an error, not an ignored message.
package decoder
