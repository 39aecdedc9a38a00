package consume

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrMissingEventID is the cause in a *RecordError for a record without a
// usable "id" header (none, an empty one, or several that disagree), or
// with several "source" headers that disagree. Such a record cannot be
// deduplicated, so it is never processed.
var ErrMissingEventID = errors.New(`consume: no usable "id" or "source" header`)

// ErrUnavailable marks a handler error as the outage of something the
// handler needs (a schema registry, another service), not a fault of the
// record: return fmt.Errorf("%w: %w", consume.ErrUnavailable, err). The
// record is retried like any other, but after the last attempt it stops
// Run with a *RecordError whatever OnFailure says, as a database outage
// does, so that an outage does not dead-letter healthy events.
var ErrUnavailable = errors.New("consume: a dependency of the handler is unavailable")

// ErrRunTwice is returned by a second call to Run. The client's fetch
// positions have moved past records the first Run polled but did not
// finish, so only a new Consumer (which resumes from the committed offsets)
// may go on: Close this one and create another.
var ErrRunTwice = errors.New("consume: Run called twice")

// ConfigError is one problem with a Config. New returns every problem at
// once, joined with errors.Join; errors.As finds the first.
type ConfigError struct {
	Field   string // the Config field at fault, e.g. "Group"
	Problem string // what is wrong with it
}

func (e *ConfigError) Error() string {
	return "consume: Config." + e.Field + ": " + e.Problem
}

// Stage says where a record's processing failed.
type Stage string

const (
	// StageEventID: the record has no usable "id" or "source" header
	// (ErrMissingEventID).
	StageEventID Stage = "event id"
	// StageDatabase: beginning the transaction, the processed_events insert
	// or the commit failed. After the last attempt a database error always
	// stops Run, whatever the policy: an outage must not dead-letter
	// healthy events.
	StageDatabase Stage = "database"
	// StageHandler: the Handler returned an error. One wrapping
	// ErrUnavailable stops Run after the last attempt under either policy.
	StageHandler Stage = "handler"
	// StageDeadLetter: publishing to the dead-letter topic, or recording the
	// dead-lettered event as processed, failed.
	StageDeadLetter Stage = "dead letter"
)

// RecordError is a record that could not be processed. Run returns it when
// it stops because of a record; that record's offset (and everything after
// it in its partition) is not committed, so a new Consumer retries it once
// the cause is fixed (or, for a handler error or a missing id, once
// OnFailure is DeadLetter).
type RecordError struct {
	Group     string
	Source    string // the "source" header, "" when the record has none
	EventID   string // "" when the record has none
	Topic     string
	Partition int32
	Offset    int64
	Stage     Stage
	Attempts  int // attempts made; 0 when the record was never tried
	Err       error
}

// Error reads like `consume: group billing: event 42 from payments (topic
// outbox.event.payment, partition 0, offset 17): handler failed after 3
// attempts: boom`.
func (e *RecordError) Error() string {
	var b strings.Builder
	b.WriteString("consume: group ")
	b.WriteString(printable(e.Group))
	b.WriteString(": ")
	if e.EventID == "" {
		b.WriteString("event without id")
	} else {
		b.WriteString("event ")
		b.WriteString(printable(e.EventID))
	}
	if e.Source != "" {
		b.WriteString(" from ")
		b.WriteString(printable(e.Source))
	}
	fmt.Fprintf(&b, " (topic %s, partition %d, offset %d): %s failed", e.Topic, e.Partition, e.Offset, e.Stage)
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " after %d attempts", e.Attempts)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *RecordError) Unwrap() error { return e.Err }

// printable returns s as is when it reads well in a log line, and quoted
// (escaped, so control bytes and bad UTF-8 cannot garble the log)
// otherwise; long values are cut.
func printable(s string) string {
	const max = 128
	cut := ""
	if len(s) > max {
		s, cut = s[:max], "..."
	}
	if s == "" || !utf8.ValidString(s) {
		return strconv.Quote(s) + cut
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == ' ' {
			return strconv.Quote(s) + cut
		}
	}
	return s + cut
}
