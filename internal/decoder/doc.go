// Package decoder turns pgoutput messages (protocol version 1), as they arrive
// in XLogData, into events: Begin, Insert of an outbox row, Commit, Skip for
// changes the streamer does not publish (updates, deletes and truncates,
// inserts into other tables, logical decoding messages of other prefixes),
// Unmapped for an insert into a relation nobody has said is the outbox or
// not, and Message for a logical decoding message of the outbox prefix.
//
// It owns the relation cache: Relation messages are kept by relation id and
// replaced when they change, and each Insert's column values are found by
// column name through that cache, so column order and extra columns do not
// matter.
//
// The outbox is a relation, not a name: PostgreSQL sends an insert into a
// partition under the partition's relation id (unless the publication
// publishes via the partition root), and a renamed or moved table keeps its
// id. So the decoder matches inserts by relation id against the roles its
// caller assigns (Assign), never by the names in Relation messages, and an
// insert into a relation without a role is Unmapped, never skipped: the
// caller must look the relation up in the catalog, which is I/O and so not
// the decoder's.
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
