package pipeline

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// The errors the pipeline stops the stream with state the facts: the event
// id, its LSN, the topic, the broker's error. What to do about them is the
// command's to say (Config.Explain renders them where the pipeline speaks
// itself: a dead-letter record's error header and the log).

// BadEventError is an event that cannot be published. Under the fail policy
// the stream stops with it and the checkpoint stays before it; under
// dead-letter it is set aside, its cause in the dead-letter record.
type BadEventError struct {
	EventID string        // the row's event id text; "" when it has none
	LSN     pglogrepl.LSN // where the row is in the WAL
	// Message: the event came as an outbox message, which, unlike a row,
	// nobody can correct: only the configuration or the policy gets the
	// stream past it.
	Message bool
	// Table is the outbox table the row is of, or the relation it was
	// written to when no outbox can be told; "" when unknown and for a
	// message.
	Table string
	// Err is why: a *mapping.BadEventError (the row breaks the mapping), a
	// *TooLargeError, an *UnmappedError, a *RefusedError (the broker
	// refused the record on its own), or a *NonTransactionalError.
	Err error
}

func (e *BadEventError) Error() string {
	id := e.EventID
	if id == "" {
		id = "(no id)"
	}
	if e.Table != "" {
		return fmt.Sprintf("bad event %s at LSN %s in table %s: %s", id, e.LSN, e.Table, cause(e.Err))
	}
	return fmt.Sprintf("bad event %s at LSN %s: %s", id, e.LSN, cause(e.Err))
}

func (e *BadEventError) Unwrap() error { return e.Err }

// cause is err without the event id, which a *mapping.BadEventError names
// and the caller's message already does.
func cause(err error) string {
	var be *mapping.BadEventError
	switch {
	case !errors.As(err, &be):
		return err.Error()
	case be.Column == "":
		return be.Reason
	}
	return "column " + strconv.Quote(be.Column) + ": " + be.Reason
}

// TooLargeError is a record larger than the largest the broker accepts
// (Config.MaxRecordBytes), caught before it is sent.
type TooLargeError struct {
	Size  int64 // the record's estimated size
	Limit int   // Config.MaxRecordBytes
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the record is about %d bytes, more than the %d bytes a record may have", e.Size, e.Limit)
}

// UnmappedError is an insert the publication sent from a relation the
// catalog cannot tie to the outbox table.
type UnmappedError struct {
	Relation string // schema.name when the row was written
	OID      uint32
	Why      string // the catalog's reason, with the statement that fixes it
}

func (e *UnmappedError) Error() string {
	return fmt.Sprintf("the publication sent it from relation %s (OID %d), which cannot be mapped to the outbox table: %s", e.Relation, e.OID, e.Why)
}

// NonTransactionalError is an outbox message emitted with
// pg_logical_emit_message(false, ...): PostgreSQL sends it even when its
// transaction rolls back, so it cannot be an outbox event.
type NonTransactionalError struct {
	Prefix string
}

func (e *NonTransactionalError) Error() string {
	return fmt.Sprintf("a non-transactional logical decoding message of prefix %q: PostgreSQL sends such a message even when its transaction rolls back, "+
		"so it is never published as an event; emit outbox messages with pg_logical_emit_message(true, ...)", e.Prefix)
}

// recordRefused reports whether err is the broker's refusal of a record
// for something about the record itself: too large for the topic, a
// timestamp out of the topic's range, a record or batch it finds invalid or
// corrupt, a topic name it does not accept. Sent again the record would be
// refused again, while other records go through: it is a bad event
// (refused.go). The broker refuses whole batches, so the records batched
// with it fail with the same error. Refusals that concern the cluster
// (authorization, a missing topic, a broker out of reach) are not among
// these: every record would fail alike.
func recordRefused(err error) bool {
	for _, e := range recordRefusals {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

var recordRefusals = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTimestamp,
	kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException,
}

// RefusedError is the broker's refusal of a record for good.
type RefusedError struct {
	Topic string
	// DeadLetter: the record refused is the dead-letter record of a bad
	// event.
	DeadLetter bool
	Err        error // the broker's, through franz-go: a kerr error, maybe wrapped
}

func (e *RefusedError) Error() string {
	what := "the record"
	if e.DeadLetter {
		what = "its dead-letter record"
	}
	return fmt.Sprintf("Kafka refused %s for topic %q: %v", what, e.Topic, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// ProduceError is a record the cluster refused for something that is not
// about the record (authorization, a topic that does not exist): every
// record would fail alike. The stream stops; the record's transaction
// never completes, so the confirmed position stays before it.
type ProduceError struct {
	EventID string
	LSN     pglogrepl.LSN
	Err     *RefusedError
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("event %s at LSN %s: %v", e.EventID, e.LSN, e.Err)
}

func (e *ProduceError) Unwrap() error { return e.Err }

// DeadLetterError is a bad event that could not be set aside: the broker
// refused its dead-letter record. Nowhere is left to put it; the stream
// stops.
type DeadLetterError struct {
	EventID string
	LSN     pglogrepl.LSN
	Err     *RefusedError
}

func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("bad event %s at LSN %s could not be set aside: %v", e.EventID, e.LSN, e.Err)
}

func (e *DeadLetterError) Unwrap() error { return e.Err }
