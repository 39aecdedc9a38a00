package consume

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Outcome is what happened to a record, or to an offset commit.
type Outcome int

const (
	// Processed: the handler ran and its transaction committed.
	Processed Outcome = iota + 1
	// Duplicate: the record was skipped because the group had already
	// processed its event (same source and id). A rising count after a
	// restart or a rebalance is expected; a steadily rising one means
	// offsets are not being committed.
	Duplicate
	// Failed: one attempt failed (handler or database error, Stage says
	// which); the record is retried until MaxAttempts.
	Failed
	// DeadLettered: the record was published to the dead-letter topic.
	DeadLettered
	// CommitFailed: a Kafka offset commit failed; its records are
	// redelivered and skipped as duplicates.
	CommitFailed
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Failed:
		return "failed"
	case DeadLettered:
		return "dead-lettered"
	case CommitFailed:
		return "commit failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Observation is one outcome, as Hooks see it.
type Observation struct {
	Outcome Outcome
	Group   string
	// Record is the record concerned; nil for CommitFailed. It must not be
	// kept after Observe returns.
	Record *kgo.Record
	// Source and EventID identify the event: its "source" header ("" from
	// a streamer that sets none) and its "id" header ("" when it has none).
	Source, EventID string
	// Stage is where a Failed attempt failed.
	Stage Stage
	// Attempt is the attempt a Failed observation is about (from 1), and
	// the attempts made for a DeadLettered one.
	Attempt int
	// Err is the error of a Failed attempt or a CommitFailed commit, and
	// the cause a record was DeadLettered for.
	Err error
}

// Hooks observe a Consumer: metrics, tracing, tests. Observe is called on
// Run's goroutine, in the order things happen; it must return quickly and
// must not block, or it holds up processing.
type Hooks interface {
	Observe(Observation)
}

// HooksFunc makes a function Hooks.
type HooksFunc func(Observation)

// Observe calls f(o).
func (f HooksFunc) Observe(o Observation) { f(o) }

// noHooks observes nothing.
type noHooks struct{}

func (noHooks) Observe(Observation) {}
