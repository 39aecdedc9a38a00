// Package outboxschema checks an outbox event against its schema in a
// schema registry inside the service's transaction, before the row is
// inserted: a payload the streamer could not encode is refused while the
// service can still answer its caller, instead of becoming a bad event
// (stop or dead letter) after COMMIT.
//
// It is a module of its own,
// github.com/cdc-outbox/cdc-outbox/outbox/outboxschema, so that package
// outbox keeps costing its importers pgx and nothing else; this one adds
// the schema module (franz-go's registry client and the Avro, Protobuf
// and JSON Schema libraries).
//
//	reg, _ := schema.NewRegistry(schema.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7"})
//	w, _ := outboxschema.New(outboxWriter, reg, outboxschema.Config{
//		Schema: schema.Config{Format: schema.Avro, Refresh: time.Minute}, // as the streamer's outbox
//	})
//	id, err := w.Write(ctx, tx, event) // checked, then outbox.Writer.Write
//
// The check is the streamer's own encoding (schema.Encoder), by the same
// subject, version and message: give Config.Schema the values of the
// streamer's flags for this outbox. Schemas are kept as the streamer keeps
// them (by id for good, the latest version for Refresh), so a warm
// service asks the registry nothing per event.
package outboxschema

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cdc-outbox/cdc-outbox/outbox"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// ErrRegistryUnavailable means the registry could not be asked (no
// answer, too slow, refused the credentials, failed on its side) about a
// schema the Writer did not have yet: the event is neither good nor bad,
// and nothing was sent to the database. It is retryable: fail the request
// (the caller retries) or set Config.AllowWhenUnreachable. The error also
// wraps the *schema.RegistryError with the URL and the HTTP status.
var ErrRegistryUnavailable = errors.New("outboxschema: schema registry unavailable")

// Config is how events find their schema, and what an unreachable
// registry means.
type Config struct {
	// Schema is the streamer's configuration of this outbox's value
	// format: format, subject naming strategy, namespace, a fixed
	// version or id, Refresh of the latest version.
	Schema schema.Config
	// AllowWhenUnreachable writes an event unchecked when the registry
	// cannot be asked about its schema (ErrRegistryUnavailable), with a
	// warning in Logger. The streamer still encodes it, and a bad payload
	// is then a bad event there. The default refuses the write: a service
	// that must never publish an unchecked event fails the request
	// instead, so a registry outage stops only writes of schemas not yet
	// cached.
	AllowWhenUnreachable bool
	// Logger receives the warning of an event written unchecked; nil
	// means slog.Default().
	Logger *slog.Logger
}

// Writer is an outbox.Writer whose events are checked against their
// schema first. It is safe for concurrent use; build it once.
type Writer struct {
	w     *outbox.Writer
	enc   *schema.Encoder
	allow bool
	log   *slog.Logger
}

// New checks cfg. w names the outbox table and the topic template, so
// the subject is the one the streamer derives from the same topic.
func New(w *outbox.Writer, registry *schema.Registry, cfg Config) (*Writer, error) {
	if w == nil || registry == nil {
		return nil, errors.New("outboxschema: New needs an outbox.Writer and a schema.Registry")
	}
	enc, err := schema.NewEncoder(registry, cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("outboxschema: Config.Schema: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Writer{w: w, enc: enc, allow: cfg.AllowWhenUnreachable, log: log.With("component", "outboxschema")}, nil
}

// Check reports whether e would be written: outbox's own checks
// (Writer.Validate), then its payload against its schema. It asks the
// registry only for a schema not cached yet.
//
// A payload that does not fit is an error wrapping outbox.ErrInvalidEvent
// and the *schema.MismatchError that names the subject, the schema's id
// and version, and the JSON path of the first mismatch; so is an event
// whose subject needs a record name it lacks (*schema.SubjectError). A
// registry that cannot be asked is ErrRegistryUnavailable (nil under
// AllowWhenUnreachable). A subject, version or id the registry does not
// have (*schema.NotFoundError) or a schema that cannot be used
// (*schema.SchemaError) is returned as it is: the streamer could not
// encode the event either, and a registration, not a retry, fixes it.
func (w *Writer) Check(ctx context.Context, e outbox.Event) error {
	if err := w.w.Validate(e); err != nil {
		return err
	}
	topic, err := w.w.Topic(e)
	if err != nil {
		return err
	}
	_, s, err := w.enc.Encode(ctx, schema.Event{Topic: topic, EventType: e.EventType, Payload: e.Payload})
	var me *schema.MismatchError
	var se *schema.SubjectError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &me), errors.As(err, &se):
		return fmt.Errorf("%w: event %s of %s %s: %w", outbox.ErrInvalidEvent, e.EventType, e.AggregateType, e.AggregateID, err)
	case schema.Retryable(err):
		if w.allow {
			w.log.WarnContext(ctx, "schema registry unavailable: event written without its schema check; the streamer still encodes it",
				"topic", topic, "subject", s.Subject, "event_type", e.EventType, "aggregate_id", e.AggregateID, "error", err)
			return nil
		}
		return fmt.Errorf("%w: %w", ErrRegistryUnavailable, err)
	}
	return fmt.Errorf("outboxschema: event %s of %s %s: %w", e.EventType, e.AggregateType, e.AggregateID, err)
}

// Write checks e (Check), then writes it with outbox.Writer.Write in tx.
// A refused event sends nothing to the database, so tx stays usable.
func (w *Writer) Write(ctx context.Context, tx outbox.Tx, e outbox.Event) (string, error) {
	if err := w.Check(ctx, e); err != nil {
		return "", err
	}
	return w.w.Write(ctx, tx, e)
}

// WriteSQL is Write for database/sql (outbox.Writer.WriteSQL).
func (w *Writer) WriteSQL(ctx context.Context, tx outbox.SQLTx, e outbox.Event) (string, error) {
	if err := w.Check(ctx, e); err != nil {
		return "", err
	}
	return w.w.WriteSQL(ctx, tx, e)
}

// Emit checks e, then writes it as a logical decoding message
// (outbox.Writer.Emit).
func (w *Writer) Emit(ctx context.Context, tx outbox.Tx, e outbox.Event) (string, error) {
	if err := w.Check(ctx, e); err != nil {
		return "", err
	}
	return w.w.Emit(ctx, tx, e)
}

// EmitSQL is Emit for database/sql (outbox.Writer.EmitSQL).
func (w *Writer) EmitSQL(ctx context.Context, tx outbox.SQLTx, e outbox.Event) (string, error) {
	if err := w.Check(ctx, e); err != nil {
		return "", err
	}
	return w.w.EmitSQL(ctx, tx, e)
}
