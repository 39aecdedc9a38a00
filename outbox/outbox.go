package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxHeaderBytes is the largest header key or value the streamer publishes
// (its MaxHeaderBytes); a longer one would make the row a bad event, so
// Write rejects it. It applies to the extra headers and to AggregateType and
// EventType, which become the "aggregate_type" and "event_type" headers.
const MaxHeaderBytes = 64 << 10

// reserved are the headers the streamer sets itself from the row's columns.
// A second "id" header in particular would let a consumer dedupe by the
// wrong value, so Event.Headers may not use these keys.
var reserved = map[string]bool{"id": true, "event_type": true, "aggregate_type": true}

// Event is one outbox row.
type Event struct {
	AggregateType string // picks the topic (outbox.event.<aggregate_type> by default); required
	AggregateID   string // the Kafka record key: one aggregate's events stay in order; required
	EventType     string // the "event_type" header; required

	// Payload is the Kafka record value. It must be valid JSON: it is
	// checked before the insert, and stored in the payload column as text
	// (so the column may be jsonb, json or text).
	Payload json.RawMessage

	// Headers become extra Kafka headers, one per key, stored as a jsonb
	// object (NULL when empty). The keys "id", "event_type" and
	// "aggregate_type" are the streamer's own and are rejected. See
	// WithTraceparent to add the current trace.
	Headers map[string]string
}

// Config names the outbox table and its columns. The zero value of a field
// means its default, from DefaultConfig.
type Config struct {
	// Table is "schema.table" or "table" (then resolved by search_path), as
	// the streamer's --table flag. Each part is quoted as an identifier, so
	// any name works except one containing a dot.
	Table string

	// Column names, as the streamer's --column-* flags.
	IDColumn, AggregateTypeColumn, AggregateIDColumn, EventTypeColumn, PayloadColumn, HeadersColumn string

	// DeleteAfterInsert deletes the row again, in the same transaction,
	// right after inserting it, so the table stays empty: no cleanup job,
	// no bloat. The event is still published, because logical decoding
	// streams the INSERT from the WAL, and the publication is insert-only
	// (publish = 'insert'), so the DELETE is neither decoded into an event
	// nor sent. Only use it with such a publication: one that also
	// publishes deletes would make the streamer skip or reject them, and a
	// consumer of the table itself would never see the row.
	DeleteAfterInsert bool
}

// DefaultConfig returns the names sql/publication.sql creates and the
// streamer reads by default.
func DefaultConfig() Config {
	return Config{
		Table:               "public.outbox",
		IDColumn:            "id",
		AggregateTypeColumn: "aggregate_type",
		AggregateIDColumn:   "aggregate_id",
		EventTypeColumn:     "event_type",
		PayloadColumn:       "payload",
		HeadersColumn:       "headers",
	}
}

// Writer inserts events into one outbox table. It holds only prepared SQL
// text, so it is safe for concurrent use; build it once with New.
type Writer struct {
	table       string // quoted, for error messages
	insert      string
	delete      string // "" unless DeleteAfterInsert
	deleteAfter bool
}

// New checks cfg and builds a Writer. Empty fields take their defaults.
func New(cfg Config) (*Writer, error) {
	def := DefaultConfig()
	or := func(s, d string) string {
		if s == "" {
			return d
		}
		return s
	}
	cfg.Table = or(cfg.Table, def.Table)
	cols := []*string{&cfg.IDColumn, &cfg.AggregateTypeColumn, &cfg.AggregateIDColumn, &cfg.EventTypeColumn, &cfg.PayloadColumn, &cfg.HeadersColumn}
	defs := []string{def.IDColumn, def.AggregateTypeColumn, def.AggregateIDColumn, def.EventTypeColumn, def.PayloadColumn, def.HeadersColumn}
	seen := map[string]bool{}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		*c = or(*c, defs[i])
		if seen[*c] {
			return nil, fmt.Errorf("outbox: column %q is configured twice; each field needs its own column", *c)
		}
		seen[*c] = true
		if err := checkIdent(*c); err != nil {
			return nil, fmt.Errorf("outbox: column %q: %w", *c, err)
		}
		quoted[i] = pgx.Identifier{*c}.Sanitize()
	}
	parts := strings.Split(cfg.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("outbox: table %q: give schema.table or table", cfg.Table)
	}
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return nil, fmt.Errorf("outbox: table %q: %w", cfg.Table, err)
		}
	}
	table := pgx.Identifier(parts).Sanitize()
	w := &Writer{
		table: table,
		insert: fmt.Sprintf("INSERT INTO %s (%s, %s, %s, %s, %s) VALUES ($1, $2, $3, $4, $5) RETURNING %s",
			table, quoted[1], quoted[2], quoted[3], quoted[4], quoted[5], quoted[0]),
		deleteAfter: cfg.DeleteAfterInsert,
	}
	if cfg.DeleteAfterInsert {
		w.delete = fmt.Sprintf("DELETE FROM %s WHERE %s = $1", table, quoted[0])
	}
	return w, nil
}

func checkIdent(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty name")
	case strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s):
		return fmt.Errorf("name is not valid UTF-8 text")
	}
	return nil
}

// defaultWriter backs the package-level Write and WriteSQL.
var defaultWriter, _ = New(Config{})

// Write inserts e into public.outbox (DefaultConfig) inside tx and returns
// its event id. See Writer.Write.
func Write(ctx context.Context, tx pgx.Tx, e Event) (int64, error) {
	return defaultWriter.Write(ctx, tx, e)
}

// WriteSQL is Write for database/sql. See Writer.WriteSQL.
func WriteSQL(ctx context.Context, tx *sql.Tx, e Event) (int64, error) {
	return defaultWriter.WriteSQL(ctx, tx, e)
}

// Write inserts e inside tx, the transaction of the business write, and
// returns the event id (the Kafka header "id"). The event is published once
// tx commits and never if it rolls back. A pgxpool.Tx works too: it is a
// pgx.Tx.
//
// An invalid event returns an error wrapping ErrInvalidEvent and sends
// nothing to the database. A database error is returned wrapped; as with
// any failed statement, tx is then aborted and must be rolled back.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, e Event) (int64, error) {
	if tx == nil {
		return 0, ErrNoTx
	}
	return w.write(e,
		func(args []any, id *int64) error { return tx.QueryRow(ctx, w.insert, args...).Scan(id) },
		func(id int64) error { _, err := tx.Exec(ctx, w.delete, id); return err })
}

// WriteSQL is Write for database/sql, e.g. with the pgx driver
// (github.com/jackc/pgx/v5/stdlib) or lib/pq: the same row, the same checks,
// the same event id.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, e Event) (int64, error) {
	if tx == nil {
		return 0, ErrNoTx
	}
	return w.write(e,
		func(args []any, id *int64) error { return tx.QueryRowContext(ctx, w.insert, args...).Scan(id) },
		func(id int64) error { _, err := tx.ExecContext(ctx, w.delete, id); return err })
}

// write is Write and WriteSQL after the driver: insert runs the insert and
// scans the id, del deletes the row again (DeleteAfterInsert).
func (w *Writer) write(e Event, insert func(args []any, id *int64) error, del func(id int64) error) (int64, error) {
	args, err := eventArgs(e)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := insert(args, &id); err != nil {
		return 0, fmt.Errorf("outbox: insert into %s: %w", w.table, err)
	}
	if w.deleteAfter {
		if err := del(id); err != nil {
			return 0, fmt.Errorf("outbox: delete event %d after insert from %s: %w", id, w.table, err)
		}
	}
	return id, nil
}

// eventArgs validates e and returns the insert's arguments. Payload and
// headers go as strings, not []byte: a string is sent as text for jsonb,
// json and text columns alike, in every pgx query mode (in the simple
// protocol, used behind PgBouncer, a []byte would be sent as a bytea
// literal and fail on a jsonb column).
func eventArgs(e Event) ([]any, error) {
	for _, f := range []struct{ name, v string }{
		{"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"EventType", e.EventType},
	} {
		if err := checkText(f.name, f.v); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ name, v string }{{"AggregateType", e.AggregateType}, {"EventType", e.EventType}} {
		if len(f.v) > MaxHeaderBytes {
			return nil, fmt.Errorf("%w: %s is %d bytes, over the %d-byte header limit (it becomes a Kafka header)", ErrInvalidEvent, f.name, len(f.v), MaxHeaderBytes)
		}
	}
	if !json.Valid(e.Payload) {
		return nil, fmt.Errorf("%w (%s): marshal it with encoding/json, or pass json.RawMessage(`null`) for an event without data", ErrInvalidPayload, excerpt(e.Payload))
	}
	var headers any // untyped nil: SQL NULL
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			switch {
			case k == "":
				return nil, fmt.Errorf("%w: header with an empty key", ErrInvalidEvent)
			case reserved[k]:
				return nil, fmt.Errorf("%w: header %q is set by the streamer from its column; do not set it in Headers", ErrInvalidEvent, k)
			case !utf8.ValidString(k) || !utf8.ValidString(v):
				return nil, fmt.Errorf("%w: header %q is not valid UTF-8", ErrInvalidEvent, k)
			case strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0:
				return nil, fmt.Errorf("%w: header %q contains a NUL byte, which jsonb cannot store", ErrInvalidEvent, k)
			case len(k) > MaxHeaderBytes || len(v) > MaxHeaderBytes:
				return nil, fmt.Errorf("%w: header %q is over the streamer's %d-byte header limit", ErrInvalidEvent, excerpt([]byte(k)), MaxHeaderBytes)
			}
		}
		b, err := json.Marshal(e.Headers) // a map[string]string of valid UTF-8 cannot fail
		if err != nil {
			return nil, fmt.Errorf("%w: headers: %v", ErrInvalidEvent, err)
		}
		headers = string(b)
	}
	return []any{e.AggregateType, e.AggregateID, e.EventType, string(e.Payload), headers}, nil
}

// checkText rejects what a PostgreSQL text column cannot hold, with a
// message naming the field, instead of the server's encoding error.
func checkText(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: %s is empty; every event needs one", ErrInvalidEvent, name)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte, which PostgreSQL text cannot store", ErrInvalidEvent, name)
	}
	return nil
}

// excerpt quotes at most 64 bytes of b for an error message.
func excerpt(b []byte) string {
	const limit = 64
	if len(b) <= limit {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q...", b[:limit])
}
