package consume

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one group's counters (see the package documentation).
type metrics struct {
	processed, duplicates, failures, deadLettered, commitErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, group string) (*metrics, error) {
	vec := func(name, help string) (*prometheus.CounterVec, error) {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"group"})
		if reg == nil {
			return v, nil
		}
		if err := reg.Register(v); err != nil {
			// Another Consumer on the same registerer (another group, or
			// the same group restarted) created it: share it.
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
					return existing, nil
				}
			}
			return nil, fmt.Errorf("consume: register metric %s: %w", name, err)
		}
		return v, nil
	}
	m := &metrics{}
	for _, c := range []struct {
		dst        *prometheus.Counter
		name, help string
	}{
		{&m.processed, "cdc_outbox_consumer_processed_total", "Records whose handler ran and whose database transaction committed."},
		{&m.duplicates, "cdc_outbox_consumer_duplicates_total", "Records skipped because the consumer group had already processed their event id."},
		{&m.failures, "cdc_outbox_consumer_failures_total", "Failed processing attempts (handler or database error), retried ones included."},
		{&m.deadLettered, "cdc_outbox_consumer_dead_lettered_total", "Records published to the dead-letter topic after their last failed attempt."},
		{&m.commitErrors, "cdc_outbox_consumer_commit_errors_total", "Kafka offset commits that failed; their records are redelivered and skipped as duplicates."},
	} {
		v, err := vec(c.name, c.help)
		if err != nil {
			return nil, err
		}
		*c.dst = v.WithLabelValues(group)
	}
	return m, nil
}
