package consume

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// These tests need no server.

func validConfig() Config {
	return Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "billing",
		Topics:  []string{"outbox.event.payment"},
		DB:      &pgxpool.Pool{}, // never used by validate
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
			"Config.DB: is nil", "Config.Handler: is nil",
		}},
		{"nil pool", func(c *Config) { c.DB = (*pgxpool.Pool)(nil) }, []string{"Config.DB: is nil"}},
		{"blank broker and topic", func(c *Config) { c.Brokers = []string{""}; c.Topics = []string{"a", ""} }, []string{
			"Config.Brokers[0]: is empty", "Config.Topics[1]: is empty",
		}},
		{"negative numbers", func(c *Config) { c.MaxAttempts = -1; c.Backoff = -time.Second; c.MaxPollRecords = -2 }, []string{
			"Config.MaxAttempts: is negative (-1)", "Config.Backoff: is negative (-1s)", "Config.MaxPollRecords: is negative (-2)",
		}},
		{"dead letter without topic", func(c *Config) { c.OnFailure = DeadLetter }, []string{
			"Config.DeadLetterTopic: is empty but OnFailure is DeadLetter",
		}},
		{"topic without dead letter", func(c *Config) { c.DeadLetterTopic = "dlq" }, []string{
			`Config.DeadLetterTopic: is set ("dlq") but OnFailure is Stop`,
		}},
		{"dead letter into a consumed topic", func(c *Config) { c.OnFailure = DeadLetter; c.DeadLetterTopic = "outbox.event.payment" }, []string{
			"Config.DeadLetterTopic: \"outbox.event.payment\" is also one of Topics",
		}},
		{"unknown policy", func(c *Config) { c.OnFailure = 7 }, []string{
			"Config.OnFailure: is FailurePolicy(7)",
		}},
		{"instance id Kafka refuses", func(c *Config) { c.InstanceID = "billing 0" }, []string{
			`Config.InstanceID: "billing 0" is not 1 to 249 ASCII letters, digits, '.', '_' or '-'`,
		}},
		{"instance id too long", func(c *Config) { c.InstanceID = strings.Repeat("b", 250) }, []string{"Config.InstanceID: "}},
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

func ceStructured(doc string) *kgo.Record {
	return &kgo.Record{Value: []byte(doc), Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}}}
}

func TestEventKey(t *testing.T) {
	rec := func(hs ...string) *kgo.Record {
		r := &kgo.Record{}
		for i := 0; i < len(hs); i += 2 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: hs[i], Value: []byte(hs[i+1])})
		}
		return r
	}
	for _, tc := range []struct {
		r    *kgo.Record
		want dedupeKey
		ok   bool
	}{
		{rec("id", "42", "event_type", "X", "source", "payments"), dedupeKey{"payments", "42"}, true},
		{rec("id", "42", "event_type", "X"), dedupeKey{"", "42"}, true}, // an older streamer: no source
		{rec("event_type", "X", "id", "42", "id", "42"), dedupeKey{"", "42"}, true},
		{rec("id", "42", "source", "a", "source", "a"), dedupeKey{"a", "42"}, true},
		{rec("event_type", "X"), dedupeKey{}, false},
		{rec("id", ""), dedupeKey{}, false},
		{rec("id", "1", "id", "2"), dedupeKey{}, false},
		{rec("id", "1", "source", "a", "source", "b"), dedupeKey{}, false},
		{rec("ID", "1"), dedupeKey{}, false},
		// CloudEvents, binary mode: the ce_id and ce_source attributes.
		{rec("ce_specversion", "1.0", "ce_id", "42", "ce_source", "payments", "id", "7"), dedupeKey{"payments", "42"}, true},
		{rec("ce_specversion", "1.0", "ce_id", "42"), dedupeKey{}, false}, // source is required in CloudEvents
		{rec("ce_specversion", "1.0", "ce_id", "1", "ce_id", "2", "ce_source", "a"), dedupeKey{}, false},
		// Structured mode: the event's id and source members.
		{ceStructured(`{"specversion":"1.0","id":"42","source":"/billing","type":"t","data":{"id":"9"}}`), dedupeKey{"/billing", "42"}, true},
		{ceStructured(`{"specversion":"1.0","id":"42","type":"t"}`), dedupeKey{}, false},
		{ceStructured(`{"specversion":"1.0","id":42,"source":"a"}`), dedupeKey{}, false},
		{ceStructured(`not json`), dedupeKey{}, false},
	} {
		if ev, ok := eventKey(tc.r); ok != tc.ok || ok && ev != tc.want {
			t.Errorf("eventKey(%v) = %+v, %v; want %+v, %v", tc.r.Headers, ev, ok, tc.want, tc.ok)
		}
	}
}

func TestRecordErrorMessage(t *testing.T) {
	err := &RecordError{Group: "billing", Source: "payments", EventID: "42", Topic: "outbox.event.payment", Partition: 1, Offset: 17,
		Stage: StageHandler, Attempts: 3, Err: errors.New("boom")}
	want := "consume: group billing: event 42 from payments (topic outbox.event.payment, partition 1, offset 17): handler failed after 3 attempts: boom"
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
	noID := &RecordError{Group: "billing", Topic: "t", Offset: 3, Stage: StageEventID, Err: ErrMissingEventID}
	if want := `consume: group billing: event without id (topic t, partition 0, offset 3): event id failed: consume: no usable "id" or "source" header`; noID.Error() != want {
		t.Errorf("got  %s\nwant %s", noID, want)
	}
	if !errors.Is(noID, ErrMissingEventID) {
		t.Error("RecordError does not unwrap")
	}
	odd := &RecordError{EventID: "a b\n", Err: errors.New("x")}
	if !strings.Contains(odd.Error(), `event "a b\n"`) {
		t.Errorf("an unprintable id is not quoted: %s", odd)
	}
}
