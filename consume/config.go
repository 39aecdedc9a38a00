package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Handler does the work for one record, inside the transaction that also
// records the event as processed. It must write only through tx (writes
// through other connections are not rolled back with it, nor deduplicated)
// and must not commit or roll tx back. An error rolls everything back and
// the record is retried; it is called again only for a record whose
// previous attempt rolled back.
//
// The record and its slices must not be kept after the handler returns.
type Handler func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error

// FailurePolicy says what happens to a record whose last attempt failed.
type FailurePolicy int

const (
	// Stop (the default) makes Run return a *RecordError; the record's
	// offset is not committed, so the next Consumer of the group retries it.
	Stop FailurePolicy = iota
	// DeadLetter publishes the record to Config.DeadLetterTopic, records the
	// event as processed, and goes on with the next record.
	DeadLetter
)

func (p FailurePolicy) String() string {
	switch p {
	case Stop:
		return "stop"
	case DeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// Defaults for the zero values of Config.
const (
	DefaultMaxAttempts    = 3
	DefaultBackoff        = 500 * time.Millisecond
	DefaultMaxPollRecords = 500
	// MaxBackoff caps the doubling wait between attempts.
	MaxBackoff = 30 * time.Second
)

// Config configures a Consumer. Brokers, Group, Topics, Pool and Handler
// are required.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port).
	Brokers []string
	// Group is the Kafka consumer group. It is also the dedupe scope: the
	// consumer_group column of processed_events. Keep it stable: a new name
	// is a new consumer that processes everything again.
	Group string
	// Topics to consume, e.g. "outbox.event.payment". To treat them as
	// regular expressions, add kgo.ConsumeRegex() to ExtraOpts.
	Topics []string
	// Pool is the consumer's database, holding processed_events
	// (sql/processed_events.sql) and the handler's tables.
	Pool *pgxpool.Pool
	// Handler does the work for each new event.
	Handler Handler

	// MaxAttempts is how often a record is tried before OnFailure applies;
	// 0 means DefaultMaxAttempts, 1 means no retry.
	MaxAttempts int
	// Backoff is the wait after the first failed attempt; it doubles after
	// each further one, up to MaxBackoff. 0 means DefaultBackoff. While a
	// record is retried the group cannot rebalance (see Run): keep the sum
	// of the waits well below the group's rebalance timeout (kgo default
	// 60s; New logs a warning when it is not).
	Backoff time.Duration
	// OnFailure applies after the last failed attempt: Stop (default) or
	// DeadLetter.
	OnFailure FailurePolicy
	// DeadLetterTopic receives failed records under DeadLetter; it must be
	// empty under Stop, so that a set topic is never mistaken for an active
	// policy.
	DeadLetterTopic string

	// MaxPollRecords bounds the records processed between two offset
	// commits and between two chances for the group to rebalance; 0 means
	// DefaultMaxPollRecords.
	MaxPollRecords int

	// Registerer receives the metrics (see the package documentation); nil
	// registers none.
	Registerer prometheus.Registerer
	// Logger receives the consumer's and the Kafka client's logs; nil means
	// slog.Default().
	Logger *slog.Logger
	// ExtraOpts are further franz-go options: TLS, SASL, kgo.ConsumeRegex(),
	// kgo.RebalanceTimeout, kgo.ConsumeResetOffset (default: the start of
	// the topic, so a new group processes everything), ... The options the
	// guarantees rest on (kgo.ConsumerGroup, kgo.ConsumeTopics,
	// kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll) are applied after
	// them and win.
	ExtraOpts []kgo.Opt
}

// validate is the one place Config is checked. It fills in defaults and
// returns every problem at once.
func (cfg *Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}

	if len(cfg.Brokers) == 0 {
		bad("Brokers", "is empty; give at least one Kafka bootstrap address (host:port)")
	}
	for i, b := range cfg.Brokers {
		if b == "" {
			bad(fmt.Sprintf("Brokers[%d]", i), "is empty; give a Kafka bootstrap address (host:port)")
		}
	}
	if cfg.Group == "" {
		bad("Group", "is empty; the consumer group is where offsets are committed and the dedupe scope in processed_events")
	}
	if len(cfg.Topics) == 0 {
		bad("Topics", "is empty; give the topics to consume, e.g. outbox.event.payment")
	}
	for i, t := range cfg.Topics {
		if t == "" {
			bad(fmt.Sprintf("Topics[%d]", i), "is empty")
		}
	}
	if cfg.Pool == nil {
		bad("Pool", "is nil; give the pgxpool of the database that holds processed_events (sql/processed_events.sql)")
	}
	if cfg.Handler == nil {
		bad("Handler", "is nil; give the function that processes one record")
	}
	if cfg.MaxAttempts < 0 {
		bad("MaxAttempts", "is %d; use 0 for the default (%d) or a positive number (1 means no retry)", cfg.MaxAttempts, DefaultMaxAttempts)
	}
	if cfg.Backoff < 0 {
		bad("Backoff", "is %v; use 0 for the default (%v) or a positive duration", cfg.Backoff, DefaultBackoff)
	}
	if cfg.MaxPollRecords < 0 {
		bad("MaxPollRecords", "is %d; use 0 for the default (%d) or a positive number", cfg.MaxPollRecords, DefaultMaxPollRecords)
	}
	switch cfg.OnFailure {
	case Stop:
		if cfg.DeadLetterTopic != "" {
			bad("DeadLetterTopic", "is %q but OnFailure is Stop, so it would never be used; set OnFailure to DeadLetter, or leave it empty", cfg.DeadLetterTopic)
		}
	case DeadLetter:
		if cfg.DeadLetterTopic == "" {
			bad("DeadLetterTopic", "is empty but OnFailure is DeadLetter; name the topic that receives failed records")
		} else if slices.Contains(cfg.Topics, cfg.DeadLetterTopic) {
			bad("DeadLetterTopic", "%q is also one of Topics: dead-lettered records would be consumed again", cfg.DeadLetterTopic)
		}
	default:
		bad("OnFailure", "is %v; use Stop or DeadLetter", cfg.OnFailure)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = DefaultMaxPollRecords
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// backoff is the wait after failed attempt n (1-based): Backoff doubled
// n-1 times, at most MaxBackoff.
func backoff(base time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

// retryBudget is the total wait of one record that fails every attempt.
func retryBudget(base time.Duration, attempts int) time.Duration {
	var total time.Duration
	for n := 1; n < attempts; n++ {
		total += backoff(base, n)
	}
	return total
}
