package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
	"github.com/cdc-outbox/cdc-outbox/outbox/topic"
)

// MaxHeaderBytes is the largest header key or value the streamer publishes
// (contract.MaxHeaderBytes); a longer one would make the row a bad event, so
// Write rejects it. It applies to the extra headers and to AggregateType and
// EventType, which become the "aggregate_type" and "event_type" headers.
const MaxHeaderBytes = contract.MaxHeaderBytes

// Event is one outbox row.
type Event struct {
	// AggregateType picks the topic (outbox.event.<aggregate_type> under the
	// default template), so it must make a topic name Kafka accepts: ASCII
	// letters, digits, '.', '_' and '-'. Required.
	AggregateType string
	AggregateID   string // the Kafka record key: one aggregate's events stay in order; required
	EventType     string // the "event_type" header; required
	// Payload is the Kafka record value. It must be valid JSON: it is
	// checked before the insert, and stored in the payload column as text
	// (so the column may be jsonb, json or text).
	Payload json.RawMessage
	// Headers become extra Kafka headers, one per key, stored as a jsonb
	// object (NULL when empty). The keys "id", "event_type",
	// "aggregate_type" and "source" are the streamer's own and are
	// rejected. See WithTraceparent to add the current trace.
	Headers map[string]string
}

// Config names the outbox table and its columns, and the topic template.
// The zero value of a field means its default, from DefaultConfig.
type Config struct {
	// Table is "table" or "schema.table", read as PostgreSQL reads a
	// qualified name and exactly as the streamer reads its --table flag
	// (package pgname): an unquoted part is folded to lower case, a
	// double-quoted part is kept as it is ("Billing"."Outbox Events"), and
	// a name without a schema is in schema public whatever the
	// search_path, so the service and the streamer name the same table.
	Table string
	// Column names, as the streamer's --column-* flags.
	IDColumn, AggregateTypeColumn, AggregateIDColumn, EventTypeColumn, PayloadColumn, HeadersColumn string
	// Topic is the streamer's --topic template (default
	// "outbox.event.{aggregate_type}"). Write renders it for each event and
	// rejects an event whose topic Kafka would refuse, which the streamer
	// would otherwise have to treat as a bad event. Its placeholders may
	// name the aggregate type, aggregate id and event type columns: the
	// values Write knows. Placeholders name columns, so with another
	// AggregateTypeColumn the default template names a column the table
	// lacks, for the streamer as for New: give both the same template over
	// your column, e.g. "outbox.event.{aggregatetype}".
	Topic string
	// DeleteAfterInsert deletes the row again, in the same transaction,
	// right after inserting it, so the table stays empty: no cleanup job,
	// no bloat. The event is still published, because logical decoding
	// streams the INSERT from the WAL, and the publication is insert-only
	// (publish = 'insert'), so the DELETE is neither decoded into an event
	// nor sent. Only use it with such a publication: one that also
	// publishes deletes would make the streamer skip or reject them, and a
	// consumer of the table itself would never see the row.
	DeleteAfterInsert bool
	// MessagePrefix is the streamer's --message-prefix (default
	// contract.DefaultMessagePrefix, "cdc_outbox"): the prefix of the
	// messages Emit writes.
	MessagePrefix string
}

// DefaultConfig returns the names sql/publication.sql creates and the
// streamer reads by default (package contract).
func DefaultConfig() Config {
	return Config{
		Table:               contract.DefaultTable,
		IDColumn:            contract.ColumnID,
		AggregateTypeColumn: contract.ColumnAggregateType,
		AggregateIDColumn:   contract.ColumnAggregateID,
		EventTypeColumn:     contract.ColumnEventType,
		PayloadColumn:       contract.ColumnPayload,
		HeadersColumn:       contract.ColumnHeaders,
		Topic:               topic.DefaultTemplate,
		MessagePrefix:       contract.DefaultMessagePrefix,
	}
}

// Tx is what Write needs of the caller's transaction: a pgx.Tx (from
// pgx.Conn, pgxpool.Pool or idempotency.Tx) or a wrapper of one. Write
// never calls Commit; it is part of Tx because only a transaction has it,
// so a pool or a connection, where every statement commits on its own,
// cannot be passed by mistake.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Commit(ctx context.Context) error
}

// SQLTx is Tx for database/sql: a *sql.Tx or a wrapper of one. As with Tx,
// Commit, which WriteSQL never calls, keeps a *sql.DB out.
type SQLTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	Commit() error
}

// Writer inserts events into one outbox table. It holds only prepared SQL
// text and the parsed topic template, so it is safe for concurrent use;
// build it once with New.
type Writer struct {
	table       string // quoted, for error messages
	insert      string
	delete      string // "" unless DeleteAfterInsert
	deleteAfter bool
	topic       *topic.Template
	columns     map[string]func(Event) string // the Event field behind each column a topic placeholder may name
	prefix      string                        // of the messages Emit writes
}

// New checks cfg and builds a Writer. Empty fields take their defaults.
// Every problem is a *ConfigError; they are returned joined.
func New(cfg Config) (*Writer, error) {
	def := DefaultConfig()
	or := func(s, d string) string {
		if s == "" {
			return d
		}
		return s
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}

	cols := []struct {
		field string
		name  *string
		def   string
	}{
		{"IDColumn", &cfg.IDColumn, def.IDColumn},
		{"AggregateTypeColumn", &cfg.AggregateTypeColumn, def.AggregateTypeColumn},
		{"AggregateIDColumn", &cfg.AggregateIDColumn, def.AggregateIDColumn},
		{"EventTypeColumn", &cfg.EventTypeColumn, def.EventTypeColumn},
		{"PayloadColumn", &cfg.PayloadColumn, def.PayloadColumn},
		{"HeadersColumn", &cfg.HeadersColumn, def.HeadersColumn},
	}
	seen := map[string]string{}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		*c.name = or(*c.name, c.def)
		if other, dup := seen[*c.name]; dup {
			bad(c.field, "column %q is also %s; each field needs its own column", *c.name, other)
		}
		seen[*c.name] = c.field
		if err := checkIdent(*c.name); err != "" {
			bad(c.field, "column %q: %s", *c.name, err)
		}
		quoted[i] = pgx.Identifier{*c.name}.Sanitize()
	}

	cfg.Table = or(cfg.Table, def.Table)
	name, err := pgname.Parse(cfg.Table)
	if err != nil {
		bad("Table", "%q: %v", cfg.Table, err)
	} else if e := checkIdent(name.Schema); e != "" {
		bad("Table", "%q: schema: %s", cfg.Table, e)
	} else if e := checkIdent(name.Relation); e != "" {
		bad("Table", "%q: table: %s", cfg.Table, e)
	}

	fields := map[string]func(Event) string{
		cfg.AggregateTypeColumn: func(e Event) string { return e.AggregateType },
		cfg.AggregateIDColumn:   func(e Event) string { return e.AggregateID },
		cfg.EventTypeColumn:     func(e Event) string { return e.EventType },
	}
	tmpl, err := topic.ParseTemplate(or(cfg.Topic, def.Topic))
	if err != nil {
		bad("Topic", "%v", err)
	} else {
		for _, c := range tmpl.Columns() {
			if fields[c] == nil {
				bad("Topic", "placeholder {%s} is none of the columns Write sets (%s, %s, %s)",
					c, cfg.AggregateTypeColumn, cfg.AggregateIDColumn, cfg.EventTypeColumn)
			}
		}
	}
	cfg.MessagePrefix = or(cfg.MessagePrefix, def.MessagePrefix)
	if e := checkIdent(cfg.MessagePrefix); e != "" {
		bad("MessagePrefix", "%q: %s", cfg.MessagePrefix, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	table := name.Quoted()
	w := &Writer{
		table: table,
		// The id comes back as text: the "id" header carries the same text
		// (PostgreSQL's output of the column), and it works for any id type,
		// bigserial or uuid.
		insert: fmt.Sprintf("INSERT INTO %s (%s, %s, %s, %s, %s) VALUES ($1, $2, $3, $4, $5) RETURNING %s::text",
			table, quoted[1], quoted[2], quoted[3], quoted[4], quoted[5], quoted[0]),
		deleteAfter: cfg.DeleteAfterInsert,
		topic:       tmpl,
		columns:     fields,
		prefix:      cfg.MessagePrefix,
	}
	if cfg.DeleteAfterInsert {
		// $1 is the id's text: sent as text, PostgreSQL reads it with the
		// column type's input function, so any id type compares natively
		// and the primary key index finds the row.
		w.delete = fmt.Sprintf("DELETE FROM %s WHERE %s = $1", table, quoted[0])
	}
	return w, nil
}

func checkIdent(s string) string {
	switch {
	case s == "":
		return "empty name"
	case strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s):
		return "name is not valid UTF-8 text"
	}
	return ""
}

// defaultWriter backs the package-level Write, WriteSQL and Validate.
var defaultWriter, _ = New(Config{})

// Write inserts e into public.outbox (DefaultConfig) inside tx and returns
// its event id. See Writer.Write.
func Write(ctx context.Context, tx Tx, e Event) (string, error) {
	return defaultWriter.Write(ctx, tx, e)
}

// WriteSQL is Write for database/sql. See Writer.WriteSQL.
func WriteSQL(ctx context.Context, tx SQLTx, e Event) (string, error) {
	return defaultWriter.WriteSQL(ctx, tx, e)
}

// Validate reports whether Write would accept e under DefaultConfig. See
// Writer.Validate.
func Validate(e Event) error {
	return defaultWriter.Validate(e)
}

// Write inserts e inside tx, the transaction of the business write, and
// returns the event id: the text of the id column, exactly what the
// streamer sends in the "id" header ("17" for a bigserial id, the UUID's
// text for a uuid id). The event is published once tx commits and never if
// it rolls back.
//
// An invalid event (see Validate) returns an error wrapping
// ErrInvalidEvent and sends nothing to the database, so tx stays usable. A
// database error is returned wrapped; as with any failed statement, tx is
// then aborted and must be rolled back.
func (w *Writer) Write(ctx context.Context, tx Tx, e Event) (string, error) {
	if tx == nil {
		return "", ErrNoTx
	}
	return w.write(e,
		func(args []any, id *string) error { return tx.QueryRow(ctx, w.insert, args...).Scan(id) },
		func(id string) error { _, err := tx.Exec(ctx, w.delete, id); return err })
}

// WriteSQL is Write for database/sql, e.g. with the pgx driver
// (github.com/jackc/pgx/v5/stdlib) or lib/pq: the same row, the same checks,
// the same event id.
func (w *Writer) WriteSQL(ctx context.Context, tx SQLTx, e Event) (string, error) {
	if t, ok := tx.(*sql.Tx); tx == nil || ok && t == nil {
		return "", ErrNoTx
	}
	return w.write(e,
		func(args []any, id *string) error { return tx.QueryRowContext(ctx, w.insert, args...).Scan(id) },
		func(id string) error { _, err := tx.ExecContext(ctx, w.delete, id); return err })
}

// Validate reports whether Write would accept e, without a database: every
// required field is set and valid UTF-8 without NUL bytes, the topic the
// streamer renders from the template is a name Kafka accepts, the payload
// is JSON, and no header is reserved, empty or over MaxHeaderBytes. The
// error wraps ErrInvalidEvent (and ErrInvalidPayload for the payload, a
// *topic.Error for the topic) and names the field or the topic.
func (w *Writer) Validate(e Event) error {
	_, err := w.eventArgs(e)
	return err
}

// Topic returns the topic the streamer publishes e to: the Writer's
// Topic template rendered with e's values. A topic Kafka would refuse is
// an error wrapping ErrInvalidEvent, as from Validate. A check that needs
// the topic, such as the subject of e's schema in a registry, asks here
// rather than render the template itself.
func (w *Writer) Topic(e Event) (string, error) {
	t, err := w.topic.Render(func(column string) string { return w.columns[column](e) })
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return t, nil
}

// write is Write and WriteSQL after the driver: insert runs the insert and
// scans the id, del deletes the row again (DeleteAfterInsert).
func (w *Writer) write(e Event, insert func(args []any, id *string) error, del func(id string) error) (string, error) {
	args, err := w.eventArgs(e)
	if err != nil {
		return "", err
	}
	var id string
	if err := insert(args, &id); err != nil {
		return "", fmt.Errorf("outbox: insert into %s: %w", w.table, err)
	}
	if w.deleteAfter {
		if err := del(id); err != nil {
			return "", fmt.Errorf("outbox: delete event %s from %s: %w", id, w.table, err)
		}
	}
	return id, nil
}

// eventArgs validates e and returns the insert's arguments. Payload and
// headers go as strings, not []byte: a string is sent as text for jsonb,
// json and text columns alike, in every pgx query mode (in the simple
// protocol, used behind PgBouncer, a []byte would be sent as a bytea
// literal and fail on a jsonb column).
func (w *Writer) eventArgs(e Event) ([]any, error) {
	for _, f := range []struct{ name, v string }{
		{"AggregateType", e.AggregateType}, {"AggregateID", e.AggregateID}, {"EventType", e.EventType},
	} {
		if err := checkText(f.name, f.v); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ name, v string }{{"AggregateType", e.AggregateType}, {"EventType", e.EventType}} {
		if len(f.v) > MaxHeaderBytes {
			return nil, fmt.Errorf("%w: %s is %d bytes, over the %d-byte header limit", ErrInvalidEvent, f.name, len(f.v), MaxHeaderBytes)
		}
	}
	if _, err := w.Topic(e); err != nil {
		return nil, err
	}
	if !json.Valid(e.Payload) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidPayload, excerpt(e.Payload))
	}
	var headers any // untyped nil: SQL NULL
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			switch {
			case k == "":
				return nil, fmt.Errorf("%w: header with an empty key", ErrInvalidEvent)
			case contract.Reserved(k):
				// The streamer sets these itself (contract.ReservedHeaders):
				// a second "id" or "source" header in particular would let a
				// consumer dedupe by the wrong value.
				return nil, fmt.Errorf("%w: header %q is reserved for the streamer", ErrInvalidEvent, k)
			case !utf8.ValidString(k) || !utf8.ValidString(v):
				return nil, fmt.Errorf("%w: header %q is not valid UTF-8", ErrInvalidEvent, k)
			case strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0:
				return nil, fmt.Errorf("%w: header %q contains a NUL byte", ErrInvalidEvent, k)
			case len(k) > MaxHeaderBytes || len(v) > MaxHeaderBytes:
				return nil, fmt.Errorf("%w: header %s is over the %d-byte header limit", ErrInvalidEvent, excerpt([]byte(k)), MaxHeaderBytes)
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
		return fmt.Errorf("%w: %s is empty", ErrInvalidEvent, name)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidEvent, name)
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
