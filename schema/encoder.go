package schema

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Config is how one outbox's events find their schema.
type Config struct {
	// Format is the schema format the outbox's values are written in; a
	// schema of another type in the registry is a *SchemaError.
	Format Format
	// Strategy names the subject of an event's schema.
	Strategy Strategy
	// Namespace qualifies a record name that has no dot (an event type
	// such as "PaymentCreated" becomes "<Namespace>.PaymentCreated"),
	// for the record name strategies and the choice of a Protobuf message.
	Namespace string
	// ID: every event is written by the schema with this global id,
	// whatever its subject; 0 for none.
	ID int
	// Version: every event is written by this version of its subject; 0
	// for the latest.
	Version int
	// Refresh is how long a subject's latest version is used before the
	// registry is asked again; needed unless ID or Version is set.
	Refresh time.Duration
	// MessageByRecordName (Protobuf): the message is the one the event's
	// record name names, rather than the schema's first message. It is so
	// anyway under the record name strategies (the subject is the
	// message's name) and for an event that names its record.
	MessageByRecordName bool
}

// Event is what of an outbox event chooses and fills its schema.
type Event struct {
	Topic     string
	EventType string
	// Payload is the JSON the service wrote.
	Payload []byte
	// RecordName, Version and ID are what columns of the row may name: a
	// record name instead of the event type, a version of the subject, a
	// schema's global id. Zero values name nothing, and Config decides.
	RecordName string
	Version    int
	ID         int
}

// Encoder writes events' payloads as record values in the Confluent wire
// format by the schemas of a Registry.
type Encoder struct {
	cfg      Config
	registry *Registry
}

// NewEncoder checks cfg.
func NewEncoder(registry *Registry, cfg Config) (*Encoder, error) {
	switch {
	case cfg.Format < Avro || cfg.Format > JSONSchema:
		return nil, fmt.Errorf("unknown schema format %d", int(cfg.Format))
	case cfg.Strategy < TopicName || cfg.Strategy > TopicRecordName:
		return nil, fmt.Errorf("unknown subject naming strategy %d", int(cfg.Strategy))
	case cfg.ID < 0, cfg.Version < 0:
		return nil, fmt.Errorf("schema id %d and version %d: neither may be negative", cfg.ID, cfg.Version)
	case cfg.ID == 0 && cfg.Version == 0 && cfg.Refresh <= 0:
		return nil, errors.New("the latest version is used, and how long it stands (Refresh) is not set")
	}
	return &Encoder{cfg: cfg, registry: registry}, nil
}

// Encode writes the event's payload as a record value in the Confluent
// wire format and says by which schema. Its errors: *MismatchError (the
// payload does not fit), *SubjectError (the event gives no name its
// subject needs), *NotFoundError, *SchemaError, *RegistryError.
func (e *Encoder) Encode(ctx context.Context, ev Event) ([]byte, Schema, error) {
	return e.AppendEncode(ctx, nil, ev)
}

// AppendEncode is Encode appending to dst.
func (e *Encoder) AppendEncode(ctx context.Context, dst []byte, ev Event) ([]byte, Schema, error) {
	record := RecordFullName(e.cfg.Namespace, ev.RecordName, ev.EventType)
	subject, err := Subject(e.cfg.Strategy, ev.Topic, record)
	if err != nil {
		return nil, Schema{}, &SubjectError{Topic: ev.Topic, Strategy: e.cfg.Strategy, Err: err}
	}
	s := Schema{Subject: subject, Format: e.cfg.Format}
	switch {
	case ev.ID != 0 || e.cfg.ID != 0:
		s.ID, s.Subject = ev.ID, ""
		if s.ID == 0 {
			s.ID = e.cfg.ID
		}
	case ev.Version != 0 || e.cfg.Version != 0:
		s.Version = ev.Version
		if s.Version == 0 {
			s.Version = e.cfg.Version
		}
		s.ID, err = e.registry.versionID(ctx, subject, s.Version)
	default:
		s.ID, s.Version, err = e.registry.latestID(ctx, subject, e.cfg.Refresh)
	}
	if err != nil {
		return nil, s, err
	}
	c, err := e.registry.schemaByID(ctx, s.ID)
	if err != nil {
		return nil, s, err
	}
	if c.err != nil {
		se := *c.err.(*SchemaError)
		se.Subject = s.Subject
		return nil, s, &se
	}
	if c.format != e.cfg.Format {
		return nil, s, &SchemaError{Subject: s.Subject, ID: s.ID, Format: e.cfg.Format, Err: fmt.Errorf("the registry has it as a %s schema", c.format)}
	}
	mismatched := func(m *mismatch) error {
		return &MismatchError{Subject: s.Subject, SchemaID: s.ID, Version: s.Version, Format: e.cfg.Format, Path: m.path, Reason: m.reason}
	}
	switch e.cfg.Format {
	case Avro:
		body, m := c.avro.encode(ev.Payload)
		if m != nil {
			return nil, s, mismatched(m)
		}
		dst, err = appendWire(dst, s.ID, nil, body)
	case Protobuf:
		name := ""
		if e.cfg.MessageByRecordName || ev.RecordName != "" || e.cfg.Strategy.UsesRecordName() {
			name = record
		}
		md, merr := c.proto.message(name)
		if merr != nil {
			return nil, s, mismatched(&mismatch{"$", merr.Error()})
		}
		body, index, m := c.proto.encode(ev.Payload, md)
		if m != nil {
			return nil, s, mismatched(m)
		}
		dst, err = appendWire(dst, s.ID, index, body)
	case JSONSchema:
		if m := c.json.validate(ev.Payload); m != nil {
			return nil, s, mismatched(m)
		}
		dst, err = appendWire(dst, s.ID, nil, ev.Payload)
	}
	return dst, s, err
}
