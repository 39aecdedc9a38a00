package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// schemaMetrics are those of the value formats written through a schema
// registry (package schema): its requests, the events it could not encode,
// the wait for it, and which schema each outbox writes by now.
type schemaMetrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	failures *prometheus.CounterVec
	waiting  prometheus.Gauge
	info     *prometheus.GaugeVec

	mu    sync.Mutex
	inUse map[[2]string][3]string // (outbox, subject) → (registry, schema id, version) set in info
}

// RegistryBuckets cover a cached answer of a local registry (a millisecond)
// to a request cut by the client's timeout (10 s by default).
var RegistryBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newSchemaMetrics(reg prometheus.Registerer) *schemaMetrics {
	f := promauto.With(reg)
	return &schemaMetrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cdc_outbox_schema_registry_requests_total",
			Help: "Requests to the schema registry, by op (schema_by_id, subject_version, latest_version, register) and result (ok or error); schemas are cached, so this grows per schema, not per event.",
		}, []string{"op", "result"}),
		seconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cdc_outbox_schema_registry_request_seconds", Help: "Time of the requests to the schema registry, by op.",
			Buckets: RegistryBuckets,
		}, []string{"op"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cdc_outbox_schema_encode_failures_total",
			Help: "Events whose value could not be encoded by their schema, by outbox and reason: mismatch, subject (bad events), unavailable (the registry did not answer; the stream waits), not_found, schema (the stream stops).",
		}, []string{"outbox", "reason"}),
		waiting: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_schema_registry_waiting",
			Help: "1 while the stream waits for the schema registry (its last attempt to get a schema had no usable answer), else 0.",
		}),
		info: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdc_outbox_schema_info", Help: "1 for the schema each outbox's subject is written by now: the registry, its global id and version (0 when chosen by id).",
		}, []string{"outbox", "registry", "subject", "schema_id", "version"}),
		inUse: map[[2]string][3]string{},
	}
}

// RegistryCall counts and times one request to the schema registry; it is
// package schema's Observer.
func (m *Metrics) RegistryCall(op string, elapsed time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.schema.requests.WithLabelValues(op, result).Inc()
	m.schema.seconds.WithLabelValues(op).Observe(elapsed.Seconds())
}

// EncodeFailed counts an event of outbox whose value could not be encoded.
func (m *Metrics) EncodeFailed(outbox, reason string) {
	m.schema.failures.WithLabelValues(outbox, reason).Inc()
}

// RegistryWaiting records whether the stream waits for the registry.
func (m *Metrics) RegistryWaiting(waiting bool) { m.schema.waiting.Set(b2f(waiting)) }

// SchemaInUse records that outbox writes subject's values by schema id,
// version version, of the registry at url, in place of the one before.
func (m *Metrics) SchemaInUse(outbox, url, subject string, id, version int) {
	s := m.schema
	key, val := [2]string{outbox, subject}, [3]string{url, strconv.Itoa(id), strconv.Itoa(version)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.inUse[key]; ok && old != val {
		s.info.DeleteLabelValues(outbox, old[0], subject, old[1], old[2])
	}
	s.inUse[key] = val
	s.info.WithLabelValues(outbox, url, subject, val[1], val[2]).Set(1)
}
