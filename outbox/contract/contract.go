// Package contract is the one definition of an outbox row as cdc-outbox
// streams it: the default table and column names, the headers the streamer
// sets on every record itself, and the largest header it publishes.
//
// sql/publication.sql creates the default table with these names, the
// streamer's flags default to them, its mapping reads a row by them, and
// package outbox writes a row by them and refuses what the streamer could
// not publish. The topic template and Kafka's topic rules are the other half
// of the contract, in package topic.
//
// An outbox message (pg_logical_emit_message) carries the same event in an
// envelope (message.go): package outbox writes it, the streamer reads it.
//
// The package is pure: constants, checks and the envelope's encoding,
// nothing outside the standard library, so the streamer and the libraries
// services import share it.
package contract

// DefaultTable is the outbox table, as schema.table, that
// sql/publication.sql creates and the streamer streams by default.
const DefaultTable = "public.outbox"

// The default outbox columns: what sql/publication.sql creates, what the
// streamer reads and package outbox writes unless told other names.
const (
	ColumnID            = "id"             // the event id: the "id" header
	ColumnAggregateType = "aggregate_type" // picks the topic; the "aggregate_type" header
	ColumnAggregateID   = "aggregate_id"   // the record key
	ColumnEventType     = "event_type"     // the "event_type" header
	ColumnPayload       = "payload"        // the record value
	ColumnHeaders       = "headers"        // optional: a JSON object of extra headers
	ColumnCreatedAt     = "created_at"     // optional: the record timestamp
)

// The headers the streamer sets on every record, ahead of the row's own.
const (
	HeaderID            = "id"             // the event id: consumers dedupe by it
	HeaderEventType     = "event_type"     // the event type
	HeaderAggregateType = "aggregate_type" // the aggregate type
	HeaderSource        = "source"         // which outbox the event comes from (the streamer's source setting)
)

// reservedHeaders are the headers the streamer sets itself. Add every
// header the streamer comes to set here.
var reservedHeaders = [...]string{HeaderID, HeaderEventType, HeaderAggregateType, HeaderSource}

// ReservedHeaders returns the header keys the streamer sets itself. A row
// whose headers column has one of them as a key is a bad event to the
// streamer, and package outbox refuses it: the record would carry the
// header twice, and a consumer reading one "id" header by name could take
// the row's value for the event id.
func ReservedHeaders() []string { return append([]string(nil), reservedHeaders[:]...) }

// Reserved reports whether key is one of ReservedHeaders. It allocates
// nothing.
func Reserved[T ~string | ~[]byte](key T) bool {
	for _, h := range reservedHeaders {
		if string(key) == h {
			return true
		}
	}
	return false
}

// MaxHeaderBytes is the largest header key or value the streamer publishes:
// a longer one makes the row a bad event, so package outbox refuses it. The
// aggregate type and event type become headers, so it bounds them too.
const MaxHeaderBytes = 64 << 10
