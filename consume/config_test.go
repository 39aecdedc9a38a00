package consume

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

// These tests need no server.

func validConfig() Config {
	return Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "billing",
		Topics:  []string{"outbox.event.payment"},
		Pool:    &pgxpool.Pool{}, // never used by validate
		Handler: func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // every problem, each as "Config.Field: words"
	}{
		{"empty", func(c *Config) { *c = Config{} }, []string{
			"Config.Brokers: is empty", "Config.Group: is empty", "Config.Topics: is empty",
			"Config.Pool: is nil", "Config.Handler: is nil",
		}},
		{"blank broker and topic", func(c *Config) { c.Brokers = []string{""}; c.Topics = []string{"a", ""} }, []string{
			"Config.Brokers[0]: is empty", "Config.Topics[1]: is empty",
		}},
		{"negative numbers", func(c *Config) { c.MaxAttempts = -1; c.Backoff = -time.Second; c.MaxPollRecords = -2 }, []string{
			"Config.MaxAttempts: is -1", "Config.Backoff: is -1s", "Config.MaxPollRecords: is -2",
		}},
		{"dead letter without topic", func(c *Config) { c.OnFailure = DeadLetter }, []string{
			"Config.DeadLetterTopic: is empty but OnFailure is DeadLetter",
		}},
		{"topic without dead letter", func(c *Config) { c.DeadLetterTopic = "dlq" }, []string{
			`Config.DeadLetterTopic: is "dlq" but OnFailure is Stop`,
		}},
		{"dead letter into a consumed topic", func(c *Config) { c.OnFailure = DeadLetter; c.DeadLetterTopic = "outbox.event.payment" }, []string{
			"Config.DeadLetterTopic: \"outbox.event.payment\" is also one of Topics",
		}},
		{"unknown policy", func(c *Config) { c.OnFailure = 7 }, []string{
			"Config.OnFailure: is FailurePolicy(7)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig()
			tc.edit(&cfg)
			err := cfg.validate()
			if err == nil {
				t.Fatal("validate accepted it")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("%v is not a *ConfigError", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, "consume: "+w) {
					t.Errorf("error %q\ndoes not say %q", msg, w)
				}
			}
			if got := strings.Count(msg, "consume: Config."); got != len(tc.want) {
				t.Errorf("%d problems reported, want %d:\n%s", got, len(tc.want), msg)
			}
		})
	}
}

func TestValidateDefaults(t *testing.T) {
	cfg := validConfig()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxAttempts != DefaultMaxAttempts || cfg.Backoff != DefaultBackoff || cfg.MaxPollRecords != DefaultMaxPollRecords || cfg.Logger == nil || cfg.OnFailure != Stop {
		t.Errorf("defaults not applied: %+v", cfg)
	}
}

func TestBackoff(t *testing.T) {
	base := 100 * time.Millisecond
	for n, want := range map[int]time.Duration{1: base, 2: 2 * base, 3: 4 * base, 20: MaxBackoff, 1000: MaxBackoff} {
		if got := backoff(base, n); got != want {
			t.Errorf("backoff(%v, %d) = %v, want %v", base, n, got, want)
		}
	}
	if got := retryBudget(base, 3); got != 3*base {
		t.Errorf("retryBudget(3 attempts) = %v, want %v", got, 3*base)
	}
	if got := retryBudget(base, 1); got != 0 {
		t.Errorf("retryBudget(1 attempt) = %v, want 0", got)
	}
}

func TestEventID(t *testing.T) {
	rec := func(hs ...string) *kgo.Record {
		r := &kgo.Record{}
		for i := 0; i < len(hs); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hs[i], Value: []byte(hs[i+1])})
		}
		return r
	}
	for _, tc := range []struct {
		r    *kgo.Record
		want string
		ok   bool
	}{
		{rec("id", "42", "event_type", "X"), "42", true},
		{rec("event_type", "X", "id", "42", "id", "42"), "42", true},
		{rec("event_type", "X"), "", false},
		{rec("id", ""), "", false},
		{rec("id", "1", "id", "2"), "", false},
		{rec("ID", "1"), "", false},
	} {
		if id, ok := eventID(tc.r); id != tc.want || ok != tc.ok {
			t.Errorf("eventID(%v) = %q, %v; want %q, %v", tc.r.Headers, id, ok, tc.want, tc.ok)
		}
	}
}

func TestRecordErrorMessage(t *testing.T) {
	err := &RecordError{Group: "billing", EventID: "42", Topic: "outbox.event.payment", Partition: 1, Offset: 17,
		Stage: StageHandler, Attempts: 3, Err: errors.New("boom")}
	want := "consume: group billing: event 42 (topic outbox.event.payment, partition 1, offset 17): handler failed after 3 attempts: boom; " +
		"offset 17 is not committed: fix the cause and start the consumer again to retry it, or set OnFailure to DeadLetter to set such records aside"
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
	noID := &RecordError{Group: "billing", Topic: "t", Offset: 3, Stage: StageEventID, Err: ErrMissingEventID}
	if !strings.Contains(noID.Error(), "event without id (topic t, partition 0, offset 3): event id failed: record has no usable \"id\" header") {
		t.Errorf("got %s", noID)
	}
	if !errors.Is(noID, ErrMissingEventID) {
		t.Error("RecordError does not unwrap")
	}
	odd := &RecordError{EventID: "a b\n", Err: errors.New("x")}
	if !strings.Contains(odd.Error(), `event "a b\n"`) {
		t.Errorf("an unprintable id is not quoted: %s", odd)
	}
}

func TestMetricsShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := newMetrics(reg, "billing")
	if err != nil {
		t.Fatal(err)
	}
	b, err := newMetrics(reg, "shipping")
	if err != nil {
		t.Fatal(err)
	}
	a.duplicates.Inc()
	b.duplicates.Add(2)
	if testutil.ToFloat64(a.duplicates) != 1 || testutil.ToFloat64(b.duplicates) != 2 {
		t.Error("groups share a counter")
	}
	n, err := testutil.GatherAndCount(reg, "cdc_outbox_consumer_duplicates_total", "cdc_outbox_consumer_processed_total",
		"cdc_outbox_consumer_failures_total", "cdc_outbox_consumer_dead_lettered_total", "cdc_outbox_consumer_commit_errors_total")
	if err != nil || n != 10 {
		t.Errorf("gathered %d series, %v; want 5 metrics × 2 groups", n, err)
	}
}
