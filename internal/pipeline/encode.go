package pipeline

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
)

// Encoder writes an outbox's record values in another format than the
// payload as the service wrote it: a schema registry's wire format (the
// command fills it with package schema's encoder). It replaces the value
// the mapping made, the payload, by its encoding, and may set headers that
// name the schema. The pipeline knows nothing of registries: it calls
// Encode on the replication goroutine after the mapping and before the
// record's checks, and acts on the Fault of the error.
type Encoder interface {
	// Columns names the row's columns Encode reads besides the record (one
	// naming the schema's version, id or record name); nil for none.
	Columns() []string
	// Encode replaces rec.Value with its encoding. An error is an
	// *EncodeError; any other stops the stream.
	Encode(rec *kgo.Record, ev EncodeEvent) error
}

// EncodeEvent is what of the event, besides its record, an Encoder reads.
type EncodeEvent struct {
	EventType []byte
	// Columns holds the row's values of the Encoder's Columns, nil for a
	// NULL or missing one, and for every one of a message (which has no
	// such columns). It aliases the replication buffer.
	Columns [][]byte
}

// Fault says whose an encoding failure is, and so what the stream does.
type Fault int

const (
	// FaultEvent: the event does not fit its schema (or names none); the
	// same event fails the same way every time: a bad event, by the
	// policy (stop or dead-letter).
	FaultEvent Fault = iota + 1
	// FaultUnavailable: the schema could not be had now (the registry is
	// down, slow, refuses the credentials, throttles); not the event's
	// fault: the stream reads again from the confirmed position after a
	// backoff, and nothing past the event is confirmed meanwhile.
	FaultUnavailable
	// FaultSchema: the schema is gone (a subject deleted under the stream)
	// or cannot be used; waiting does not help, nor does setting the event
	// aside, as every event of the subject would follow it: the stream
	// stops before the event.
	FaultSchema
)

// EncodeError is an Encoder's failure on one event.
type EncodeError struct {
	Fault Fault
	Err   error // the encoder's facts: subject, schema id, version, path; the registry's URL and status
}

func (e *EncodeError) Error() string { return e.Err.Error() }

func (e *EncodeError) Unwrap() error { return e.Err }

// UnavailableError is an event whose schema could not be had now. The
// stream gives its connection up and reads again from the confirmed
// position (Resend), with the replication's backoff between attempts.
type UnavailableError struct {
	EventID string
	LSN     pglogrepl.LSN
	Err     error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("event %s at LSN %s waits for its schema: %v", e.EventID, e.LSN, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Resend tells the replication stream to read again from its confirmed
// position: the event is not at fault.
func (e *UnavailableError) Resend() bool { return true }

// SchemaStopError is an event whose schema is gone or unusable: the stream
// stops before it.
type SchemaStopError struct {
	EventID string
	LSN     pglogrepl.LSN
	Table   string // "" for a message
	Err     error
}

func (e *SchemaStopError) Error() string {
	at := ""
	if e.Table != "" {
		at = " in table " + e.Table
	}
	return fmt.Sprintf("event %s at LSN %s%s cannot be encoded: %v", e.EventID, e.LSN, at, e.Err)
}

func (e *SchemaStopError) Unwrap() error { return e.Err }

// encode runs enc on pd's record, which the mapping made of ev; vals are
// the row's values of enc's columns. It returns done when the event went
// elsewhere (a bad event: err is the policy's answer) or cannot go on (err).
func (p *Pipeline) encode(lsn pglogrepl.LSN, ev *decoder.Event, pd *pending, enc Encoder, in EncodeEvent) (done bool, err error) {
	err = enc.Encode(&pd.rec, in)
	if err == nil {
		return false, nil
	}
	id := eventID(&pd.rec)
	var ee *EncodeError
	if !errors.As(err, &ee) {
		return true, fmt.Errorf("encode event %s at LSN %s: %w", id, lsn, err)
	}
	switch ee.Fault {
	case FaultEvent:
		return true, p.bad(ev, &BadEventError{EventID: id, LSN: lsn, Err: ee})
	case FaultUnavailable:
		p.log.Warn("the schema registry cannot give an event's schema now: the stream waits and reads again from the confirmed position; nothing past the event is confirmed",
			"event_id", id, "lsn", lsn, "error", p.explain(ee))
		return true, &UnavailableError{EventID: id, LSN: lsn, Err: ee}
	}
	table := ""
	if ev.Relation != nil {
		table = ev.Relation.Namespace + "." + ev.Relation.Name
		if pd.outbox != nil {
			table = pd.outbox.Table()
		}
	}
	p.obs.Bad("failed", pd.kind())
	pd.countFailed()
	return true, &SchemaStopError{EventID: id, LSN: lsn, Table: table, Err: ee}
}
