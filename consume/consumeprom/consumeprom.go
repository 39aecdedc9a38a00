// Package consumeprom counts the outcomes of package consume's consumers in
// Prometheus: a consume.Hooks, as franz-go's plugin/kprom is kgo's.
//
// It is a module of its own,
// github.com/cdc-outbox/cdc-outbox/consume/consumeprom, so that package
// consume does not bring client_golang to services that do not use it.
//
// # Metrics
//
// Registered on the registerer given to New; several Consumers may share
// one Metrics (and one registerer), each counted under its own group label.
//
//	cdc_outbox_consumer_processed_total{group}      counter  records whose handler ran and whose transaction committed
//	cdc_outbox_consumer_duplicates_total{group}     counter  records skipped because the group already processed the event (same source and id)
//	cdc_outbox_consumer_failures_total{group}       counter  failed attempts (handler or database error), retried ones included
//	cdc_outbox_consumer_dead_lettered_total{group}  counter  records published to the dead-letter topic
//	cdc_outbox_consumer_commit_errors_total{group}  counter  Kafka offset commits that failed (the records are redelivered and skipped as duplicates)
//
// A rising duplicates counter after a restart or a rebalance is expected; a
// steadily rising one means offsets are not being committed.
package consumeprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdc-outbox/cdc-outbox/consume"
)

// Metrics is a consume.Hooks that counts each outcome by group. It is safe
// for concurrent use by several Consumers.
type Metrics struct {
	processed, duplicates, failures, deadLettered, commitErrors *prometheus.CounterVec
}

// New creates the counters and registers them on reg. Counters already
// registered there by another New are shared, so calling New once per
// Consumer on one registerer works too.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("consumeprom: nil Registerer")
	}
	m := &Metrics{}
	for _, c := range []struct {
		dst        **prometheus.CounterVec
		name, help string
	}{
		{&m.processed, "cdc_outbox_consumer_processed_total", "Records whose handler ran and whose database transaction committed."},
		{&m.duplicates, "cdc_outbox_consumer_duplicates_total", "Records skipped because the consumer group had already processed their event (same source and id)."},
		{&m.failures, "cdc_outbox_consumer_failures_total", "Failed processing attempts (handler or database error), retried ones included."},
		{&m.deadLettered, "cdc_outbox_consumer_dead_lettered_total", "Records published to the dead-letter topic after their last failed attempt."},
		{&m.commitErrors, "cdc_outbox_consumer_commit_errors_total", "Kafka offset commits that failed; their records are redelivered and skipped as duplicates."},
	} {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: c.name, Help: c.help}, []string{"group"})
		if err := reg.Register(v); err != nil {
			var are prometheus.AlreadyRegisteredError
			existing, ok := v, false
			if errors.As(err, &are) {
				existing, ok = are.ExistingCollector.(*prometheus.CounterVec)
			}
			if !ok {
				return nil, fmt.Errorf("consumeprom: register %s: %w", c.name, err)
			}
			v = existing
		}
		*c.dst = v
	}
	return m, nil
}

// Observe counts o under its group.
func (m *Metrics) Observe(o consume.Observation) {
	var v *prometheus.CounterVec
	switch o.Outcome {
	case consume.Processed:
		v = m.processed
	case consume.Duplicate:
		v = m.duplicates
	case consume.Failed:
		v = m.failures
	case consume.DeadLettered:
		v = m.deadLettered
	case consume.CommitFailed:
		v = m.commitErrors
	default:
		return
	}
	v.WithLabelValues(o.Group).Inc()
}
