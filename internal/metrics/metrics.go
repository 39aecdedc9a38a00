// Package metrics defines cdc-outbox's Prometheus metrics and serves them
// with the health endpoints.
//
// The names are a contract: dashboards and alerts (deploy/) depend on them.
//
//	cdc_outbox_events_total{topic,kind}         counter   events acknowledged by Kafka; kind row (an outbox row) or message (an outbox message)
//	cdc_outbox_transactions_total               counter   transactions fully confirmed
//	cdc_outbox_events_skipped_total{reason}     counter   changes not published: update, delete, truncate, other_table, other_prefix (a message of another prefix)
//	cdc_outbox_bad_events_total{action,kind}    counter   bad events: failed (stopped the stream) or dead_lettered; kind row or message
//	cdc_outbox_publish_errors_total             counter   produce errors, retried ones included
//	cdc_outbox_timestamps_replaced_total        counter   records whose created_at was too far ahead for Kafka and that carry the produce time instead
//	cdc_outbox_lag_seconds                      gauge     age by commit time of the oldest transaction not yet confirmed; 0 when none
//	cdc_outbox_replication_lag_bytes            gauge     server WAL end minus the confirmed LSN
//	cdc_outbox_end_to_end_latency_seconds       histogram commit time to broker acknowledgement
//	cdc_outbox_receive_latency_seconds          histogram commit time to arrival at cdc-outbox: PostgreSQL's share
//	cdc_outbox_confirmed_lsn                    gauge     last confirmed LSN, as a number
//	cdc_outbox_received_lsn                     gauge     newest server WAL end seen, as a number
//	cdc_outbox_inflight_events                  gauge     records sent and not yet acknowledged
//	cdc_outbox_inflight_bytes                   gauge     their estimated size
//	cdc_outbox_slot_retained_wal_bytes          gauge     pg_current_wal_lsn() - restart_lsn of the slot
//	cdc_outbox_slot_active                      gauge     1 while a process streams from the slot
//	cdc_outbox_slot_holder                      gauge     1 while this process holds the slot (streams from it); 0 while it waits for it (a standby) or connects
//	cdc_outbox_slot_failover                    gauge     1 when the slot is a failover slot (PostgreSQL 17+), synchronized to standbys
//	cdc_outbox_slot_failover_ready              gauge     1 when a failover keeps the stream: a failover slot, and every standby the connection string names holds a ready copy
//	cdc_outbox_slot_failover_standby{standby,state} gauge 1 for each standby's copy of the slot: ready, temporary, behind, missing, not_synced, invalidated, unreachable
//	cdc_outbox_standby_slots_blocking           gauge     slots named in the primary's synchronized_standby_slots that hold the failover slot's walsender back (missing, logical, invalidated, inactive)
//	cdc_outbox_slot_wal_status{status}          gauge     1 for the slot's wal_status (reserved, extended, unreserved, lost), 0 for the others
//	cdc_outbox_connected{target}                gauge     1 while connected: target postgres (streaming) or kafka (answers metadata requests)
//	cdc_outbox_reconnects_total{target}         counter   reconnections to postgres or kafka
//	cdc_outbox_status_updates_total             counter   standby status updates sent to PostgreSQL
//	cdc_outbox_ready                            gauge     1 while this process streams with Kafka reachable (/readyz answers 200 then, and for a standby too)
//	cdc_outbox_lost_history_total               counter   times Kafka was found to hold events of WAL the server no longer has (a failover past the standby's WAL, a restore)
//	cdc_outbox_history_epoch                    gauge     the history epoch of the events published now: 0 until a history was lost, then N, their sources ending in /epoch-N
//	cdc_outbox_build_info{version,revision,goversion} gauge 1
//
// Per outbox table, when a stream carries several (one series per table
// streamed; the latency histograms stay per stream, whose tables share one
// slot, one decoder and one producer):
//
//	cdc_outbox_outbox_events_total{outbox}               counter   events of the table acknowledged by Kafka
//	cdc_outbox_outbox_bad_events_total{outbox,action}    counter   its bad events: failed or dead_lettered
//	cdc_outbox_outbox_last_event_timestamp_seconds{outbox} gauge   commit time of its last acknowledged event; 0 before the first
//	cdc_outbox_outboxes_unpublished                      gauge     tables matching an outbox pattern that the publication does not publish wholly
//
// Schema registry, for outboxes whose values are written in a registry's
// format (Avro, Protobuf or JSON Schema):
//
//	cdc_outbox_schema_registry_requests_total{op,result}         counter   requests: op schema_by_id, subject_version, latest_version or register; result ok or error
//	cdc_outbox_schema_registry_request_seconds{op}               histogram their time
//	cdc_outbox_schema_encode_failures_total{outbox,reason}       counter   events not encoded: mismatch, subject, unavailable, not_found, schema
//	cdc_outbox_schema_registry_waiting                           gauge     1 while the stream waits for the registry, else 0
//	cdc_outbox_schema_info{outbox,registry,subject,schema_id,version} gauge 1 for the schema each outbox's subject is written by now
//
// Per shard, when a stream is split over several slots (Shards; the slot
// metrics above are then the worst shard's):
//
//	cdc_outbox_shard_slot_retained_wal_bytes{slot}  gauge  the shard's slot's retained WAL
//	cdc_outbox_shard_slot_active{slot}              gauge  1 while a process streams from the shard's slot
//	cdc_outbox_shard_replication_lag_bytes{slot}    gauge  the shard's received minus confirmed LSN
//
// Exactly-once delivery (zero in at-least-once):
//
//	cdc_outbox_kafka_transactions_total{outcome}     counter   Kafka transactions: committed or aborted
//	cdc_outbox_kafka_transaction_seconds             histogram a Kafka transaction's time from beginning to the broker's answer to its commit
//	cdc_outbox_checkpoint_lsn                        gauge     LSN of the last checkpoint committed in Kafka, as a number
//	cdc_outbox_transactions_skipped_total            counter   PostgreSQL transactions sent again that Kafka already held
//
// The Kafka client's own metrics (franz-go kprom) are under
// cdc_outbox_kafka_* (produce_batches_total among them), and the Go runtime and process collectors are
// registered as usual (go_*, process_*).
//
// Metrics are created on an injected registry. Values that other packages
// already track (positions, in-flight counts) are read at scrape time
// through functions rather than copied on every event.
package metrics

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// Sources are the values read at scrape time.
type Sources struct {
	Confirmed          func() float64 // LSN
	Received           func() float64 // LSN
	Transactions       func() float64
	InFlight           func() float64
	InFlightBytes      func() float64
	PostgresConnected  func() bool
	PostgresReconnects func() float64
	StatusUpdates      func() float64
	Oldest             func() (commitTime time.Time, ok bool)
	// Exactly-once delivery: the Kafka checkpoint (LSN) and the
	// transactions skipped because Kafka held them.
	Checkpoint          func() float64
	SkippedTransactions func() float64
	// Epoch is the history epoch of the events published now.
	Epoch func() float64
	// Skipped counts the changes not published, by reason (the label
	// values: update, delete, truncate, other_table, other_prefix).
	Skipped map[string]func() float64
	// Outboxes are the outbox tables streamed, with their counts.
	Outboxes func() []Outbox
	// Ready says whether the process does its part: it streams from
	// PostgreSQL with Kafka reachable, or it is a standby that can take
	// over; why is what is missing, or when ready, its role.
	Ready func() (ok bool, why string)
}

// Outbox is one outbox table's counts, for the per-outbox metrics.
type Outbox struct {
	Name         string // schema.table: the outbox label
	Events       uint64
	Failed       uint64
	DeadLettered uint64
	Last         time.Time // zero before the first event
}

// Build identifies the binary.
type Build struct{ Version, Revision string }

var runtimeVersion = runtime.Version()

// WALStatuses are the values of pg_replication_slots.wal_status.
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// Metrics holds the metrics that are updated as things happen.
type Metrics struct {
	events          *prometheus.CounterVec
	topics          sync.Map // eventSeries → prometheus.Counter, so an ack costs no label hashing
	badEvents       *prometheus.CounterVec
	publishErrors   prometheus.Counter
	tsReplaced      prometheus.Counter
	lostHistory     prometheus.Counter
	kafkaTx         *prometheus.CounterVec
	kafkaTxSeconds  prometheus.Histogram
	latency         prometheus.Histogram
	receiveLatency  prometheus.Histogram
	slotRetained    prometheus.Gauge
	slotActive      prometheus.Gauge
	unpublished     prometheus.Gauge
	slotWALStatus   *prometheus.GaugeVec
	slotFailover    prometheus.Gauge
	failoverReady   prometheus.Gauge
	standbyState    *prometheus.GaugeVec
	standbyBlocking prometheus.Gauge
	standbyMu       sync.Mutex
	standbys        map[string]string // standby → the state last set
	kafkaUp         atomic.Bool
	kafkaReconnects atomic.Uint64
	ready           func() (bool, string)
	kafka           *kprom.Metrics
	schema          *schemaMetrics
	now             func() time.Time
}

// LatencyBuckets resolve a 5 ms p99 and still cover multi-second outages.
// The steps at 150 and 200 ms resolve exactly-once delivery's latency,
// which waits for a Kafka commit every 100 ms by default.
var LatencyBuckets = []float64{0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
	0.1, 0.15, 0.2, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New creates every metric on reg.
func New(reg prometheus.Registerer, src Sources, build Build) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cdc_outbox_events_total", Help: "Events acknowledged by Kafka, by topic and kind: row (an outbox row) or message (an outbox message).",
		}, []string{"topic", "kind"}),
		badEvents: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cdc_outbox_bad_events_total", Help: "Events that could not be published: failed (stopped the stream) or dead_lettered; kind row or message.",
		}, []string{"action", "kind"}),
		publishErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "cdc_outbox_publish_errors_total", Help: "Errors producing to Kafka, including ones that were retried.",
		}),
		tsReplaced: f.NewCounter(prometheus.CounterOpts{
			Name: "cdc_outbox_timestamps_replaced_total",
			Help: "Records whose created_at was too far ahead for Kafka (which refuses timestamps over an hour ahead by default) and that carry the produce time instead.",
		}),
		lostHistory: f.NewCounter(prometheus.CounterOpts{
			Name: "cdc_outbox_lost_history_total",
			Help: "Times Kafka was found to hold events of WAL that the server streamed from no longer has (a failover past what the standby received, a restore): their ids may be handed out again.",
		}),
		latency: f.NewHistogram(prometheus.HistogramOpts{
			Name: "cdc_outbox_end_to_end_latency_seconds", Help: "Time from the transaction's commit to the broker's acknowledgement of its event.",
			Buckets: LatencyBuckets,
		}),
		receiveLatency: f.NewHistogram(prometheus.HistogramOpts{
			Name: "cdc_outbox_receive_latency_seconds", Help: "Time from a transaction's commit to its arrival at cdc-outbox: PostgreSQL's share of the end-to-end latency.",
			Buckets: LatencyBuckets,
		}),
		kafkaTx: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cdc_outbox_kafka_transactions_total", Help: "Kafka transactions of exactly-once delivery, by outcome: committed, or aborted (or of unknown outcome; the stream stops).",
		}, []string{"outcome"}),
		kafkaTxSeconds: f.NewHistogram(prometheus.HistogramOpts{
			Name: "cdc_outbox_kafka_transaction_seconds", Help: "Time from a Kafka transaction's beginning to the broker's answer to its commit (exactly-once delivery).",
			Buckets: LatencyBuckets,
		}),
		slotRetained: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_retained_wal_bytes", Help: "WAL the replication slot makes PostgreSQL keep: pg_current_wal_lsn() - restart_lsn.",
		}),
		slotFailover: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_failover", Help: "1 when the replication slot is a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots = on keep a copy of.",
		}),
		failoverReady: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_failover_ready",
			Help: "1 when a failover keeps the stream: the slot is a failover slot, and every standby the connection string names holds a synchronized, persistent copy close to the primary's position.",
		}),
		standbyState: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_failover_standby",
			Help: "1 for the state of each standby's copy of the slot: ready, temporary (dropped at promotion), behind, missing, not_synced, invalidated or unreachable.",
		}, []string{"standby", "state"}),
		standbyBlocking: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_standby_slots_blocking",
			Help: "Slots named in the primary's synchronized_standby_slots that hold the failover slot's walsender back (missing, logical, invalidated, or no standby streaming from them).",
		}),
		slotActive: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_active", Help: "1 while a process streams from the replication slot.",
		}),
		unpublished: f.NewGauge(prometheus.GaugeOpts{
			Name: "cdc_outbox_outboxes_unpublished", Help: "Tables matching an outbox pattern that the publication does not publish wholly: their inserts are not streamed.",
		}),
		slotWALStatus: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cdc_outbox_slot_wal_status", Help: "1 for the replication slot's wal_status, 0 for the other values.",
		}, []string{"status"}),
		ready: src.Ready,
		now:   time.Now,
	}
	// A standby is ready (/readyz), so that rolling updates proceed, but it
	// streams nothing: cdc_outbox_ready stays what alerts ask of a job, that
	// some process streams.
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_ready", Help: "1 while this process streams from PostgreSQL with Kafka reachable (/readyz answers 200 then, and for a standby ready to take over).",
	}, func() float64 {
		ok, _ := src.Ready()
		return b2f(ok && src.PostgresConnected())
	})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_slot_holder", Help: "1 while this process holds the replication slot (streams from it); 0 while it waits for the slot, held by another process, or connects.",
	}, func() float64 { return b2f(src.PostgresConnected()) })
	for _, s := range WALStatuses {
		m.slotWALStatus.WithLabelValues(s)
	}
	for _, a := range []string{"failed", "dead_lettered"} {
		m.badEvents.WithLabelValues(a, "row")
		m.badEvents.WithLabelValues(a, "message")
	}
	for _, o := range []string{"committed", "aborted"} {
		m.kafkaTx.WithLabelValues(o)
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_checkpoint_lsn", Help: "LSN of the last checkpoint committed in Kafka (exactly-once delivery), as a number.",
	}, src.Checkpoint)
	f.NewCounterFunc(prometheus.CounterOpts{
		Name: "cdc_outbox_transactions_skipped_total", Help: "PostgreSQL transactions sent again that Kafka already held (exactly-once delivery): not published again.",
	}, src.SkippedTransactions)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_history_epoch",
		Help: "History epoch of the events published now: 0 until Kafka was found to hold events of a history the server does not have, then the epoch's number, which their sources end with (/epoch-N).",
	}, src.Epoch)

	reg.MustRegister(&funcs{
		desc: prometheus.NewDesc("cdc_outbox_connected", "1 while connected: postgres (streaming) or kafka (answering metadata requests).", []string{"target"}, nil),
		kind: prometheus.GaugeValue,
		series: map[string]func() float64{
			"postgres": func() float64 { return b2f(src.PostgresConnected()) },
			"kafka":    func() float64 { return b2f(m.kafkaUp.Load()) },
		},
	}, &funcs{
		desc: prometheus.NewDesc("cdc_outbox_reconnects_total", "Reconnections after a lost connection, by target.", []string{"target"}, nil),
		kind: prometheus.CounterValue,
		series: map[string]func() float64{
			"postgres": src.PostgresReconnects,
			"kafka":    func() float64 { return float64(m.kafkaReconnects.Load()) },
		},
	})
	if src.Outboxes != nil {
		reg.MustRegister(outboxCollector(src.Outboxes))
	}
	f.NewCounterFunc(prometheus.CounterOpts{
		Name: "cdc_outbox_transactions_total", Help: "Transactions fully confirmed to PostgreSQL.",
	}, src.Transactions)
	f.NewCounterFunc(prometheus.CounterOpts{
		Name: "cdc_outbox_status_updates_total", Help: "Standby status updates sent to PostgreSQL (confirmed positions and keepalives).",
	}, src.StatusUpdates)
	reg.MustRegister(&funcs{
		desc:   prometheus.NewDesc("cdc_outbox_events_skipped_total", "Changes that were not published, by reason.", []string{"reason"}, nil),
		kind:   prometheus.CounterValue,
		series: src.Skipped,
	})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_lag_seconds", Help: "Age, by commit time, of the oldest transaction received and not yet confirmed; 0 when none.",
	}, func() float64 {
		t, ok := src.Oldest()
		if !ok {
			return 0
		}
		return max(0, m.now().Sub(t).Seconds())
	})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_replication_lag_bytes", Help: "Server WAL end minus the confirmed LSN.",
	}, func() float64 { return max(0, src.Received()-src.Confirmed()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_confirmed_lsn", Help: "Last LSN confirmed to PostgreSQL, as a number.",
	}, src.Confirmed)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_received_lsn", Help: "Newest server WAL end received, as a number.",
	}, src.Received)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_inflight_events", Help: "Records sent to Kafka and not yet acknowledged.",
	}, src.InFlight)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdc_outbox_inflight_bytes", Help: "Estimated size of the records sent to Kafka and not yet acknowledged.",
	}, src.InFlightBytes)
	f.NewGauge(prometheus.GaugeOpts{
		Name: "cdc_outbox_build_info", Help: "Build of the running binary; always 1.",
		ConstLabels: prometheus.Labels{"version": build.Version, "revision": build.Revision, "goversion": runtimeVersion},
	}).Set(1)

	m.schema = newSchemaMetrics(reg)

	// Batches besides kprom's defaults: batches per event is what the
	// producer's linger buys, and a benchmark figure.
	m.kafka = kprom.NewMetrics("cdc_outbox", kprom.Subsystem("kafka"), kprom.Registerer(reg),
		kprom.FetchAndProduceDetail(kprom.ByNode, kprom.ByTopic, kprom.UncompressedBytes, kprom.Batches))
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// funcs is a metric with one label whose series are computed at scrape
// time, for values that live elsewhere.
type funcs struct {
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	series map[string]func() float64
}

func (f *funcs) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f *funcs) Collect(ch chan<- prometheus.Metric) {
	for label, fn := range f.series {
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, fn(), label)
	}
}

var (
	outboxEvents = prometheus.NewDesc("cdc_outbox_outbox_events_total", "Events of the outbox table acknowledged by Kafka.", []string{"outbox"}, nil)
	outboxBad    = prometheus.NewDesc("cdc_outbox_outbox_bad_events_total", "Events of the outbox table that could not be published: failed (stopped the stream) or dead_lettered.",
		[]string{"outbox", "action"}, nil)
	outboxLast = prometheus.NewDesc("cdc_outbox_outbox_last_event_timestamp_seconds", "Commit time of the outbox table's last event acknowledged by Kafka, as a Unix time; 0 before the first.",
		[]string{"outbox"}, nil)
)

// outboxCollector is the per-outbox metrics, read at scrape time from the
// pipeline's counts: the tables come and go while streaming.
type outboxCollector func() []Outbox

func (outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- outboxEvents
	ch <- outboxBad
	ch <- outboxLast
}

func (c outboxCollector) Collect(ch chan<- prometheus.Metric) {
	// A table dropped and created again under its name is two tables of
	// one name: one series, their sums.
	byName := map[string]*Outbox{}
	var order []string
	for _, o := range c() {
		if s, ok := byName[o.Name]; ok {
			s.Events += o.Events
			s.Failed += o.Failed
			s.DeadLettered += o.DeadLettered
			if o.Last.After(s.Last) {
				s.Last = o.Last
			}
			continue
		}
		byName[o.Name] = &o
		order = append(order, o.Name)
	}
	for _, name := range order {
		o := byName[name]
		ch <- prometheus.MustNewConstMetric(outboxEvents, prometheus.CounterValue, float64(o.Events), o.Name)
		ch <- prometheus.MustNewConstMetric(outboxBad, prometheus.CounterValue, float64(o.Failed), o.Name, "failed")
		ch <- prometheus.MustNewConstMetric(outboxBad, prometheus.CounterValue, float64(o.DeadLettered), o.Name, "dead_lettered")
		last := 0.0
		if !o.Last.IsZero() {
			last = float64(o.Last.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(outboxLast, prometheus.GaugeValue, last, o.Name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TxCommitted records a committed Kafka transaction (sink.TxObserver).
func (m *Metrics) TxCommitted(_ int, took time.Duration) {
	m.kafkaTx.WithLabelValues("committed").Inc()
	m.kafkaTxSeconds.Observe(took.Seconds())
}

// TxAborted records an aborted Kafka transaction (sink.TxObserver).
func (m *Metrics) TxAborted() { m.kafkaTx.WithLabelValues("aborted").Inc() }

// eventSeries keys the events counters.
type eventSeries struct{ topic, kind string }

// Acked records one event acknowledged by the broker; kind is row or
// message.
func (m *Metrics) Acked(topic, kind string, commitUnixNano int64) {
	c, ok := m.topics.Load(eventSeries{topic, kind})
	if !ok {
		c, _ = m.topics.LoadOrStore(eventSeries{topic, kind}, m.events.WithLabelValues(topic, kind))
	}
	c.(prometheus.Counter).Inc()
	if commitUnixNano > 0 {
		m.latency.Observe(max(0, float64(m.now().UnixNano()-commitUnixNano)/1e9))
	}
}

// Received records the arrival of a transaction that committed at
// commitUnixNano. Set against the end-to-end latency it tells a slow
// PostgreSQL side (the walsender starved, or behind) from a slow Kafka
// side.
func (m *Metrics) Received(commitUnixNano int64) {
	m.receiveLatency.Observe(max(0, float64(m.now().UnixNano()-commitUnixNano)/1e9))
}

// Bad records a bad event and what was done with it: failed or
// dead_lettered; kind is row or message.
func (m *Metrics) Bad(action, kind string) { m.badEvents.WithLabelValues(action, kind).Inc() }

// TimestampReplaced records a record whose created_at was replaced by the
// produce time.
func (m *Metrics) TimestampReplaced() { m.tsReplaced.Inc() }

// LostHistory records that Kafka holds events of a WAL history the server
// no longer has.
func (m *Metrics) LostHistory() { m.lostHistory.Inc() }

// Slot records the slot's state from the poller.
func (m *Metrics) Slot(active bool, retainedBytes int64, walStatus string) {
	m.slotActive.Set(b2f(active))
	m.slotRetained.Set(float64(retainedBytes))
	for _, s := range WALStatuses {
		m.slotWALStatus.WithLabelValues(s).Set(b2f(s == walStatus))
	}
}

// SlotFailover records whether the slot is a failover slot, whether a
// failover keeps the stream, and each standby's state (standby → state).
func (m *Metrics) SlotFailover(failover, ready bool, standbys map[string]string) {
	m.slotFailover.Set(b2f(failover))
	m.failoverReady.Set(b2f(ready))
	m.standbyMu.Lock()
	defer m.standbyMu.Unlock()
	for sb, state := range m.standbys {
		if standbys[sb] != state {
			m.standbyState.DeleteLabelValues(sb, state)
		}
	}
	for sb, state := range standbys {
		m.standbyState.WithLabelValues(sb, state).Set(1)
	}
	m.standbys = standbys
}

// StandbySlotsBlocking records how many slots of synchronized_standby_slots
// hold the walsender back.
func (m *Metrics) StandbySlotsBlocking(n int) { m.standbyBlocking.Set(float64(n)) }

// Unpublished records how many tables matching an outbox pattern the
// publication does not publish wholly.
func (m *Metrics) Unpublished(tables int) { m.unpublished.Set(float64(tables)) }

// Kafka records whether the broker answers; a false→true change after the
// first success counts as a reconnect.
func (m *Metrics) Kafka(up, wasUp, everUp bool) {
	m.kafkaUp.Store(up)
	if up && !wasUp && everUp {
		m.kafkaReconnects.Add(1)
	}
}

// Hooks are the franz-go hooks that feed the Kafka client's metrics and
// the publish error counter.
func (m *Metrics) Hooks() []kgo.Hook { return []kgo.Hook{m.kafka, publishErrorHook{m.publishErrors}} }

// ShardHooks are the hooks of the producers of a stream's shards after the
// first: the publish error counter only. The Kafka client's metrics
// register once per registry, so they are the first shard's producer's.
func (m *Metrics) ShardHooks() []kgo.Hook { return []kgo.Hook{publishErrorHook{m.publishErrors}} }

// publishErrorHook counts produce requests that failed on the wire (they
// are retried) and records that failed for good.
type publishErrorHook struct{ c prometheus.Counter }

func (h publishErrorHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	const produceKey = 0
	if key == produceKey && e2e.Err() != nil {
		h.c.Inc()
	}
}

func (h publishErrorHook) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err != nil {
		h.c.Inc()
	}
}
