package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

// DB is what a Consumer needs of the database: a *pgxpool.Pool, or a
// wrapper of one. Each record is one transaction of it (BeginTx); a
// dead-lettered event is recorded, and the table checked, outside any.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Consumer. Brokers, Group, Topics, DB and Handler are
// required; the zero value of every other field means its default.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port).
	Brokers []string
	// Group is the Kafka consumer group. It is also the dedupe scope: the
	// consumer_group column of processed_events. Keep it stable: a new name
	// is a new consumer that processes everything again.
	Group string
	// Topics to consume, e.g. "outbox.event.payment", from any number of
	// outboxes: events are deduplicated by their source and id, so two
	// services' event 1 are two events. To treat the names as regular
	// expressions, add kgo.ConsumeRegex() to ExtraOpts.
	Topics []string
	// DB is the consumer's database, holding processed_events
	// (sql/processed_events.sql) and the handler's tables.
	DB DB
	// Handler does the work for each new event.
	Handler Handler

	// InstanceID makes this consumer a static member of the group (Kafka's
	// group.instance.id): a replacement that joins with the same id takes
	// over the member's partitions at once, with no rebalance, instead of
	// waiting until the group's session timeout (45s by default) drops a
	// member that died without leaving (kill -9, OOM, a lost node). Give
	// each instance an id that is unique in the group and stable across
	// its restarts, such as a StatefulSet pod name; two live consumers with
	// one id fence each other off. A static member does not leave the
	// group when it is closed either, so its partitions wait for it (up to
	// the session timeout) during a restart or a deploy: leave it empty for
	// consumers that come and go (autoscaling), whose partitions should
	// move at once. ASCII letters, digits, '.', '_' and '-', at most 249.
	InstanceID string

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
	// DeadLetterTopic receives failed records under DeadLetter, and must
	// not be one of Topics. It must be empty under Stop, so that a set
	// topic is never mistaken for an active policy.
	DeadLetterTopic string

	// MaxPollRecords bounds the records processed between two offset
	// commits and between two chances for the group to rebalance; 0 means
	// DefaultMaxPollRecords.
	MaxPollRecords int

	// Hooks observes every outcome (processed, duplicate, failed attempt,
	// dead letter, failed offset commit): metrics, tracing. nil observes
	// nothing. Module github.com/cdc-outbox/cdc-outbox/consume/consumeprom
	// counts them in Prometheus.
	Hooks Hooks
	// Logger receives the consumer's and the Kafka client's logs (errors
	// under the key "error"); nil means slog.Default().
	Logger *slog.Logger
	// ExtraOpts are further franz-go options: TLS, SASL, kgo.ConsumeRegex(),
	// kgo.SessionTimeout, kgo.RebalanceTimeout, kgo.ConsumeResetOffset
	// (default: the start of the topic, so a new group processes
	// everything), ... The options the guarantees rest on (kgo.ConsumerGroup,
	// kgo.ConsumeTopics, kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll,
	// and kgo.InstanceID when InstanceID is set) are applied after them and
	// win.
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
		bad("Brokers", "is empty")
	}
	for i, b := range cfg.Brokers {
		if b == "" {
			bad(fmt.Sprintf("Brokers[%d]", i), "is empty")
		}
	}
	if cfg.Group == "" {
		bad("Group", "is empty")
	}
	if len(cfg.Topics) == 0 {
		bad("Topics", "is empty")
	}
	for i, t := range cfg.Topics {
		if t == "" {
			bad(fmt.Sprintf("Topics[%d]", i), "is empty")
		}
	}
	if p, ok := cfg.DB.(*pgxpool.Pool); cfg.DB == nil || ok && p == nil {
		bad("DB", "is nil")
	}
	if cfg.Handler == nil {
		bad("Handler", "is nil")
	}
	if cfg.InstanceID != "" && !validInstanceID(cfg.InstanceID) {
		bad("InstanceID", "%q is not 1 to 249 ASCII letters, digits, '.', '_' or '-'", cfg.InstanceID)
	}
	if cfg.MaxAttempts < 0 {
		bad("MaxAttempts", "is negative (%d)", cfg.MaxAttempts)
	}
	if cfg.Backoff < 0 {
		bad("Backoff", "is negative (%v)", cfg.Backoff)
	}
	if cfg.MaxPollRecords < 0 {
		bad("MaxPollRecords", "is negative (%d)", cfg.MaxPollRecords)
	}
	switch cfg.OnFailure {
	case Stop:
		if cfg.DeadLetterTopic != "" {
			bad("DeadLetterTopic", "is set (%q) but OnFailure is Stop", cfg.DeadLetterTopic)
		}
	case DeadLetter:
		if cfg.DeadLetterTopic == "" {
			bad("DeadLetterTopic", "is empty but OnFailure is DeadLetter")
		} else if slices.Contains(cfg.Topics, cfg.DeadLetterTopic) {
			bad("DeadLetterTopic", "%q is also one of Topics", cfg.DeadLetterTopic)
		}
	default:
		bad("OnFailure", "is %v", cfg.OnFailure)
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

// validInstanceID is Kafka's rule for a group.instance.id, the same as for
// a topic name: the broker refuses any other.
func validInstanceID(id string) bool {
	if len(id) > 249 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
