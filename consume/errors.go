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
// usable "id" header (none, an empty one, or several that disagree). Such a
// record cannot be deduplicated, so it is never processed.
var ErrMissingEventID = errors.New(`record has no usable "id" header (none, empty, or several that disagree); it cannot be deduplicated, so it is not processed`)

// ErrRunTwice is returned by a second call to Run. The client's fetch
// positions have moved past records the first Run polled but did not
// finish, so only a new Consumer (which resumes from the committed offsets)
// may go on.
var ErrRunTwice = errors.New("consume: Run was already called on this Consumer; Close it and create a new one, which resumes from the committed offsets")

// ConfigError is one problem with a Config. New returns every problem at
// once, joined with errors.Join; errors.As finds the first.
type ConfigError struct {
	Field   string // the Config field at fault, e.g. "Group"
	Problem string // what is wrong and what to do
}

func (e *ConfigError) Error() string {
	return "consume: Config." + e.Field + ": " + e.Problem
}

// Stage says where a record's processing failed.
type Stage string

const (
	// StageEventID: the record has no usable "id" header (ErrMissingEventID).
	StageEventID Stage = "event id"
	// StageDatabase: beginning the transaction, the processed_events insert
	// or the commit failed. After the last attempt a database error always
	// stops Run, whatever the policy: an outage must not dead-letter
	// healthy events.
	StageDatabase Stage = "database"
	// StageHandler: the Handler returned an error.
	StageHandler Stage = "handler"
	// StageDeadLetter: publishing to the dead-letter topic, or recording the
	// dead-lettered event as processed, failed.
	StageDeadLetter Stage = "dead letter"
)

// RecordError is a record that could not be processed. Run returns it when
// it stops because of a record; that record's offset (and everything after
// it in its partition) is not committed, so a new Consumer retries it.
type RecordError struct {
	Group     string
	EventID   string // "" when the record has none
	Topic     string
	Partition int32
	Offset    int64
	Stage     Stage
	Attempts  int // attempts made; 0 when the record was never tried
	Err       error
}

// Error reads like `consume: group billing: event 42 (topic
// outbox.event.payment, partition 0, offset 17): handler failed after 3
// attempts: boom; offset 17 is not committed: fix the cause and start the
// consumer again to retry it`.
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
	fmt.Fprintf(&b, " (topic %s, partition %d, offset %d): %s failed", e.Topic, e.Partition, e.Offset, e.Stage)
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " after %d attempts", e.Attempts)
	}
	fmt.Fprintf(&b, ": %v; offset %d is not committed: fix the cause and start the consumer again to retry it", e.Err, e.Offset)
	if e.Stage == StageHandler || e.Stage == StageEventID {
		b.WriteString(", or set OnFailure to DeadLetter to set such records aside")
	}
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
