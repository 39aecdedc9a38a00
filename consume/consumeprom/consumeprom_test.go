package consumeprom

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdc-outbox/cdc-outbox/consume"
)

var _ consume.Hooks = (*Metrics)(nil)

// Each outcome lands on its counter, under its group; the names and help
// texts are the documented ones.
func TestObserve(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []consume.Observation{
		{Outcome: consume.Processed, Group: "billing"},
		{Outcome: consume.Processed, Group: "billing"},
		{Outcome: consume.Duplicate, Group: "billing"},
		{Outcome: consume.Failed, Group: "billing", Err: errors.New("boom")},
		{Outcome: consume.DeadLettered, Group: "shipping"},
		{Outcome: consume.CommitFailed, Group: "shipping"},
		{Outcome: consume.Outcome(99), Group: "billing"}, // unknown: ignored
	} {
		m.Observe(o)
	}
	want := `
# HELP cdc_outbox_consumer_commit_errors_total Kafka offset commits that failed; their records are redelivered and skipped as duplicates.
# TYPE cdc_outbox_consumer_commit_errors_total counter
cdc_outbox_consumer_commit_errors_total{group="shipping"} 1
# HELP cdc_outbox_consumer_dead_lettered_total Records published to the dead-letter topic after their last failed attempt.
# TYPE cdc_outbox_consumer_dead_lettered_total counter
cdc_outbox_consumer_dead_lettered_total{group="shipping"} 1
# HELP cdc_outbox_consumer_duplicates_total Records skipped because the consumer group had already processed their event (same source and id).
# TYPE cdc_outbox_consumer_duplicates_total counter
cdc_outbox_consumer_duplicates_total{group="billing"} 1
# HELP cdc_outbox_consumer_failures_total Failed processing attempts (handler or database error), retried ones included.
# TYPE cdc_outbox_consumer_failures_total counter
cdc_outbox_consumer_failures_total{group="billing"} 1
# HELP cdc_outbox_consumer_processed_total Records whose handler ran and whose database transaction committed.
# TYPE cdc_outbox_consumer_processed_total counter
cdc_outbox_consumer_processed_total{group="billing"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// Two Metrics on one registerer (one per Consumer) share the counters.
func TestShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	a.Observe(consume.Observation{Outcome: consume.Duplicate, Group: "billing"})
	b.Observe(consume.Observation{Outcome: consume.Duplicate, Group: "shipping"})
	b.Observe(consume.Observation{Outcome: consume.Duplicate, Group: "shipping"})
	if got := testutil.ToFloat64(a.duplicates.WithLabelValues("shipping")); got != 2 {
		t.Errorf("shipping duplicates through the first Metrics = %v, want 2: the counters are shared", got)
	}
	if _, err := New(nil); err == nil {
		t.Error("New(nil) accepted")
	}
}
