package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

func fixed(v float64) func() float64 { return func() float64 { return v } }

func newTestMetrics(t *testing.T, ready bool) (*Metrics, *prometheus.Registry) {
	t.Helper()
	now := time.Date(2026, 12, 1, 0, 0, 10, 0, time.UTC)
	reg := prometheus.NewRegistry()
	m := New(reg, Sources{
		Confirmed:           fixed(1000),
		Received:            fixed(1500),
		Transactions:        fixed(7),
		InFlight:            fixed(3),
		InFlightBytes:       fixed(900),
		PostgresConnected:   func() bool { return true },
		PostgresReconnects:  fixed(2),
		StatusUpdates:       fixed(11),
		Oldest:              func() (time.Time, bool) { return now.Add(-4 * time.Second), true },
		Checkpoint:          fixed(1200),
		SkippedTransactions: fixed(4),
		Epoch:               fixed(2),
		Outboxes: func() []Outbox {
			// Two tables of one name (dropped and created again) are one
			// series.
			return []Outbox{
				{Name: "svc_a.outbox", Events: 5, DeadLettered: 1, Last: time.Date(2026, 12, 1, 0, 0, 9, 500_000_000, time.UTC)},
				{Name: "svc_b.outbox", Events: 2},
				{Name: "svc_b.outbox", Events: 1, Failed: 1, Last: time.Date(2026, 12, 1, 0, 0, 8, 0, time.UTC)},
			}
		},
		Skipped: map[string]func() float64{
			"update": fixed(0), "delete": fixed(5), "truncate": fixed(0), "other_table": fixed(0), "other_prefix": fixed(3),
		},
		Ready: func() (bool, string) {
			if ready {
				return true, ""
			}
			return false, "Kafka does not answer metadata requests"
		},
	}, Build{Version: "v1.2.3", Revision: "abc"})
	m.now = func() time.Time { return now }
	return m, reg
}

// TestMetricNamesTypesAndHelp is the contract dashboards and alerts rely
// on: a renamed metric, a changed type or label breaks this test first.
func TestMetricNamesTypesAndHelp(t *testing.T) {
	m, reg := newTestMetrics(t, true)
	m.Acked("outbox.event.payment", "row", time.Date(2026, 12, 1, 0, 0, 9, 996_000_000, time.UTC).UnixNano())
	m.Acked("outbox.event.payment", "row", 0)
	m.Acked("outbox.event.payment", "message", 0)
	m.Bad("dead_lettered", "message")
	m.TimestampReplaced()
	m.LostHistory()
	m.Slot(true, 4096, "extended")
	m.SlotFailover(true, false, map[string]string{"db-2:5432": "ready", "db-3:5432": "missing"})
	m.SlotFailover(true, false, map[string]string{"db-2:5432": "temporary", "db-3:5432": "missing"})
	m.StandbySlotsBlocking(1)
	m.Kafka(true, false, false)
	m.TxCommitted(10, 30*time.Millisecond)
	m.Unpublished(2)
	m.TxCommitted(1, 2*time.Second)
	m.TxAborted()
	m.RegistryCall("latest_version", 3*time.Millisecond, nil)
	m.RegistryCall("schema_by_id", time.Second, io.EOF)
	m.EncodeFailed("public.outbox", "mismatch")
	m.RegistryWaiting(true)
	m.SchemaInUse("public.outbox", "http://registry:8081", "payment-value", 3, 1)
	m.SchemaInUse("public.outbox", "http://registry:8081", "payment-value", 4, 2)
	hooks := m.Hooks()
	hooks[1].(kgo.HookProduceRecordUnbuffered).OnProduceRecordUnbuffered(&kgo.Record{}, io.EOF)

	want := `
# HELP cdc_outbox_bad_events_total Events that could not be published: failed (stopped the stream) or dead_lettered; kind row or message.
# TYPE cdc_outbox_bad_events_total counter
cdc_outbox_bad_events_total{action="dead_lettered",kind="message"} 1
cdc_outbox_bad_events_total{action="dead_lettered",kind="row"} 0
cdc_outbox_bad_events_total{action="failed",kind="message"} 0
cdc_outbox_bad_events_total{action="failed",kind="row"} 0
# HELP cdc_outbox_build_info Build of the running binary; always 1.
# TYPE cdc_outbox_build_info gauge
cdc_outbox_build_info{goversion="GOVERSION",revision="abc",version="v1.2.3"} 1
# HELP cdc_outbox_checkpoint_lsn LSN of the last checkpoint committed in Kafka (exactly-once delivery), as a number.
# TYPE cdc_outbox_checkpoint_lsn gauge
cdc_outbox_checkpoint_lsn 1200
# HELP cdc_outbox_confirmed_lsn Last LSN confirmed to PostgreSQL, as a number.
# TYPE cdc_outbox_confirmed_lsn gauge
cdc_outbox_confirmed_lsn 1000
# HELP cdc_outbox_connected 1 while connected: postgres (streaming) or kafka (answering metadata requests).
# TYPE cdc_outbox_connected gauge
cdc_outbox_connected{target="kafka"} 1
cdc_outbox_connected{target="postgres"} 1
# HELP cdc_outbox_events_skipped_total Changes that were not published, by reason.
# TYPE cdc_outbox_events_skipped_total counter
cdc_outbox_events_skipped_total{reason="delete"} 5
cdc_outbox_events_skipped_total{reason="other_prefix"} 3
cdc_outbox_events_skipped_total{reason="other_table"} 0
cdc_outbox_events_skipped_total{reason="truncate"} 0
cdc_outbox_events_skipped_total{reason="update"} 0
# HELP cdc_outbox_events_total Events acknowledged by Kafka, by topic and kind: row (an outbox row) or message (an outbox message).
# TYPE cdc_outbox_events_total counter
cdc_outbox_events_total{kind="message",topic="outbox.event.payment"} 1
cdc_outbox_events_total{kind="row",topic="outbox.event.payment"} 2
# HELP cdc_outbox_inflight_bytes Estimated size of the records sent to Kafka and not yet acknowledged.
# TYPE cdc_outbox_inflight_bytes gauge
cdc_outbox_inflight_bytes 900
# HELP cdc_outbox_inflight_events Records sent to Kafka and not yet acknowledged.
# TYPE cdc_outbox_inflight_events gauge
cdc_outbox_inflight_events 3
# HELP cdc_outbox_kafka_transactions_total Kafka transactions of exactly-once delivery, by outcome: committed, or aborted (or of unknown outcome; the stream stops).
# TYPE cdc_outbox_kafka_transactions_total counter
cdc_outbox_kafka_transactions_total{outcome="aborted"} 1
cdc_outbox_kafka_transactions_total{outcome="committed"} 2
# HELP cdc_outbox_lag_seconds Age, by commit time, of the oldest transaction received and not yet confirmed; 0 when none.
# TYPE cdc_outbox_lag_seconds gauge
cdc_outbox_lag_seconds 4
# HELP cdc_outbox_lost_history_total Times Kafka was found to hold events of WAL that the server streamed from no longer has (a failover past what the standby received, a restore): their ids may be handed out again.
# TYPE cdc_outbox_lost_history_total counter
cdc_outbox_lost_history_total 1
# HELP cdc_outbox_schema_encode_failures_total Events whose value could not be encoded by their schema, by outbox and reason: mismatch, subject (bad events), unavailable (the registry did not answer; the stream waits), not_found, schema (the stream stops).
# TYPE cdc_outbox_schema_encode_failures_total counter
cdc_outbox_schema_encode_failures_total{outbox="public.outbox",reason="mismatch"} 1
# HELP cdc_outbox_schema_info 1 for the schema each outbox's subject is written by now: the registry, its global id and version (0 when chosen by id).
# TYPE cdc_outbox_schema_info gauge
cdc_outbox_schema_info{outbox="public.outbox",registry="http://registry:8081",schema_id="4",subject="payment-value",version="2"} 1
# HELP cdc_outbox_schema_registry_requests_total Requests to the schema registry, by op (schema_by_id, subject_version, latest_version, register) and result (ok or error); schemas are cached, so this grows per schema, not per event.
# TYPE cdc_outbox_schema_registry_requests_total counter
cdc_outbox_schema_registry_requests_total{op="latest_version",result="ok"} 1
cdc_outbox_schema_registry_requests_total{op="schema_by_id",result="error"} 1
# HELP cdc_outbox_schema_registry_waiting 1 while the stream waits for the schema registry (its last attempt to get a schema had no usable answer), else 0.
# TYPE cdc_outbox_schema_registry_waiting gauge
cdc_outbox_schema_registry_waiting 1
# HELP cdc_outbox_publish_errors_total Errors producing to Kafka, including ones that were retried.
# TYPE cdc_outbox_publish_errors_total counter
cdc_outbox_publish_errors_total 1
# HELP cdc_outbox_ready 1 while this process streams from PostgreSQL with Kafka reachable (/readyz answers 200 then, and for a standby ready to take over).
# TYPE cdc_outbox_ready gauge
cdc_outbox_ready 1
# HELP cdc_outbox_received_lsn Newest server WAL end received, as a number.
# TYPE cdc_outbox_received_lsn gauge
cdc_outbox_received_lsn 1500
# HELP cdc_outbox_reconnects_total Reconnections after a lost connection, by target.
# TYPE cdc_outbox_reconnects_total counter
cdc_outbox_reconnects_total{target="kafka"} 0
cdc_outbox_reconnects_total{target="postgres"} 2
# HELP cdc_outbox_replication_lag_bytes Server WAL end minus the confirmed LSN.
# TYPE cdc_outbox_replication_lag_bytes gauge
cdc_outbox_replication_lag_bytes 500
# HELP cdc_outbox_slot_active 1 while a process streams from the replication slot.
# TYPE cdc_outbox_slot_active gauge
cdc_outbox_slot_active 1
# HELP cdc_outbox_slot_failover 1 when the replication slot is a failover slot (PostgreSQL 17+), which standbys with sync_replication_slots = on keep a copy of.
# TYPE cdc_outbox_slot_failover gauge
cdc_outbox_slot_failover 1
# HELP cdc_outbox_slot_failover_ready 1 when a failover keeps the stream: the slot is a failover slot, and every standby the connection string names holds a synchronized, persistent copy close to the primary's position.
# TYPE cdc_outbox_slot_failover_ready gauge
cdc_outbox_slot_failover_ready 0
# HELP cdc_outbox_slot_failover_standby 1 for the state of each standby's copy of the slot: ready, temporary (dropped at promotion), behind, missing, not_synced, invalidated or unreachable.
# TYPE cdc_outbox_slot_failover_standby gauge
cdc_outbox_slot_failover_standby{standby="db-2:5432",state="temporary"} 1
cdc_outbox_slot_failover_standby{standby="db-3:5432",state="missing"} 1
# HELP cdc_outbox_slot_holder 1 while this process holds the replication slot (streams from it); 0 while it waits for the slot, held by another process, or connects.
# TYPE cdc_outbox_slot_holder gauge
cdc_outbox_slot_holder 1
# HELP cdc_outbox_slot_retained_wal_bytes WAL the replication slot makes PostgreSQL keep: pg_current_wal_lsn() - restart_lsn.
# TYPE cdc_outbox_slot_retained_wal_bytes gauge
cdc_outbox_slot_retained_wal_bytes 4096
# HELP cdc_outbox_slot_wal_status 1 for the replication slot's wal_status, 0 for the other values.
# TYPE cdc_outbox_slot_wal_status gauge
cdc_outbox_slot_wal_status{status="extended"} 1
cdc_outbox_slot_wal_status{status="lost"} 0
cdc_outbox_slot_wal_status{status="reserved"} 0
cdc_outbox_slot_wal_status{status="unreserved"} 0
# HELP cdc_outbox_standby_slots_blocking Slots named in the primary's synchronized_standby_slots that hold the failover slot's walsender back (missing, logical, invalidated, or no standby streaming from them).
# TYPE cdc_outbox_standby_slots_blocking gauge
cdc_outbox_standby_slots_blocking 1
# HELP cdc_outbox_outbox_bad_events_total Events of the outbox table that could not be published: failed (stopped the stream) or dead_lettered.
# TYPE cdc_outbox_outbox_bad_events_total counter
cdc_outbox_outbox_bad_events_total{action="dead_lettered",outbox="svc_a.outbox"} 1
cdc_outbox_outbox_bad_events_total{action="dead_lettered",outbox="svc_b.outbox"} 0
cdc_outbox_outbox_bad_events_total{action="failed",outbox="svc_a.outbox"} 0
cdc_outbox_outbox_bad_events_total{action="failed",outbox="svc_b.outbox"} 1
# HELP cdc_outbox_outbox_events_total Events of the outbox table acknowledged by Kafka.
# TYPE cdc_outbox_outbox_events_total counter
cdc_outbox_outbox_events_total{outbox="svc_a.outbox"} 5
cdc_outbox_outbox_events_total{outbox="svc_b.outbox"} 3
# HELP cdc_outbox_outbox_last_event_timestamp_seconds Commit time of the outbox table's last event acknowledged by Kafka, as a Unix time; 0 before the first.
# TYPE cdc_outbox_outbox_last_event_timestamp_seconds gauge
cdc_outbox_outbox_last_event_timestamp_seconds{outbox="svc_a.outbox"} 1.7960832095e+09
cdc_outbox_outbox_last_event_timestamp_seconds{outbox="svc_b.outbox"} 1.796083208e+09
# HELP cdc_outbox_outboxes_unpublished Tables matching an outbox pattern that the publication does not publish wholly: their inserts are not streamed.
# TYPE cdc_outbox_outboxes_unpublished gauge
cdc_outbox_outboxes_unpublished 2
# HELP cdc_outbox_status_updates_total Standby status updates sent to PostgreSQL (confirmed positions and keepalives).
# TYPE cdc_outbox_status_updates_total counter
cdc_outbox_status_updates_total 11
# HELP cdc_outbox_timestamps_replaced_total Records whose created_at was too far ahead for Kafka (which refuses timestamps over an hour ahead by default) and that carry the produce time instead.
# TYPE cdc_outbox_timestamps_replaced_total counter
cdc_outbox_timestamps_replaced_total 1
# HELP cdc_outbox_transactions_skipped_total PostgreSQL transactions sent again that Kafka already held (exactly-once delivery): not published again.
# TYPE cdc_outbox_transactions_skipped_total counter
cdc_outbox_transactions_skipped_total 4
# HELP cdc_outbox_transactions_total Transactions fully confirmed to PostgreSQL.
# TYPE cdc_outbox_transactions_total counter
cdc_outbox_transactions_total 7
`
	want = strings.ReplaceAll(want, "GOVERSION", goVersion())
	names := []string{
		"cdc_outbox_bad_events_total", "cdc_outbox_build_info", "cdc_outbox_checkpoint_lsn", "cdc_outbox_confirmed_lsn", "cdc_outbox_connected",
		"cdc_outbox_events_skipped_total", "cdc_outbox_events_total", "cdc_outbox_inflight_bytes", "cdc_outbox_inflight_events",
		"cdc_outbox_kafka_transactions_total", "cdc_outbox_lag_seconds", "cdc_outbox_lost_history_total", "cdc_outbox_outbox_bad_events_total",
		"cdc_outbox_outbox_events_total", "cdc_outbox_outbox_last_event_timestamp_seconds", "cdc_outbox_outboxes_unpublished",
		"cdc_outbox_publish_errors_total", "cdc_outbox_ready", "cdc_outbox_schema_encode_failures_total", "cdc_outbox_schema_info",
		"cdc_outbox_schema_registry_requests_total", "cdc_outbox_schema_registry_waiting", "cdc_outbox_received_lsn", "cdc_outbox_reconnects_total",
		"cdc_outbox_replication_lag_bytes", "cdc_outbox_slot_active", "cdc_outbox_slot_failover", "cdc_outbox_slot_failover_ready",
		"cdc_outbox_slot_failover_standby", "cdc_outbox_slot_holder", "cdc_outbox_slot_retained_wal_bytes", "cdc_outbox_slot_wal_status",
		"cdc_outbox_standby_slots_blocking", "cdc_outbox_status_updates_total", "cdc_outbox_timestamps_replaced_total",
		"cdc_outbox_transactions_skipped_total", "cdc_outbox_transactions_total",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// The latency histogram: one observation of 4 ms (the ack without a
	// commit time is not observed), in a bucket fine enough for a 5 ms p99.
	if n := histogramCount(t, reg); n != 1 {
		t.Fatalf("latency observations: %v, want 1", n)
	}

	// The Kafka transaction histogram: 30 ms and 2 s.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cdc_outbox_kafka_transaction_seconds" {
			if h := mf.GetMetric()[0].GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() != 2.03 {
				t.Errorf("Kafka transaction seconds: %d observations summing to %v, want 2 and 2.03", h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}

	problems, err := testutil.GatherAndLint(reg, append(names, "cdc_outbox_end_to_end_latency_seconds", "cdc_outbox_kafka_transaction_seconds",
		"cdc_outbox_schema_registry_request_seconds")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "cdc_outbox_end_to_end_latency_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() == 0.004 && b.GetCumulativeCount() != 1 {
					t.Errorf("a 4 ms latency is not in the 4 ms bucket")
				}
			}
			return float64(h.GetSampleCount())
		}
	}
	t.Fatal("no latency histogram")
	return 0
}

func TestEndpoints(t *testing.T) {
	for _, ready := range []bool{true, false} {
		m, reg := newTestMetrics(t, ready)
		srv := httptest.NewServer(m.Handler(reg))
		get := func(path string) (int, string) {
			resp, err := srv.Client().Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, _ := get("/healthz"); code != 200 {
			t.Errorf("/healthz: %d", code)
		}
		code, body := get("/readyz")
		if ready && code != 200 || !ready && (code != 503 || !strings.Contains(body, "Kafka does not answer")) {
			t.Errorf("ready=%v: /readyz %d %q", ready, code, body)
		}
		if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "cdc_outbox_kafka_") && !strings.Contains(body, "go_goroutines") {
			t.Errorf("/metrics %d lacks the runtime collectors", code)
		}
		srv.Close()
	}
}

func goVersion() string { return runtimeVersion }

// TestStandbyReadyButNotHolder: a standby waiting for the slot is ready
// (/readyz 200, saying so, for rolling updates to proceed), and still shows
// as not holding the slot and not streaming, which alerts count.
func TestStandbyReadyButNotHolder(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, Sources{
		Confirmed: fixed(0), Received: fixed(0), Transactions: fixed(0), InFlight: fixed(0), InFlightBytes: fixed(0),
		PostgresConnected: func() bool { return false }, PostgresReconnects: fixed(0), StatusUpdates: fixed(0),
		Oldest:     func() (time.Time, bool) { return time.Time{}, false },
		Checkpoint: fixed(0), SkippedTransactions: fixed(0), Epoch: fixed(0),
		Ready: func() (bool, string) { return true, "standby: the slot is held by another process" },
	}, Build{})
	want := `
# HELP cdc_outbox_ready 1 while this process streams from PostgreSQL with Kafka reachable (/readyz answers 200 then, and for a standby ready to take over).
# TYPE cdc_outbox_ready gauge
cdc_outbox_ready 0
# HELP cdc_outbox_slot_holder 1 while this process holds the replication slot (streams from it); 0 while it waits for the slot, held by another process, or connects.
# TYPE cdc_outbox_slot_holder gauge
cdc_outbox_slot_holder 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cdc_outbox_ready", "cdc_outbox_slot_holder"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(reg))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != "ready: standby: the slot is held by another process\n" {
		t.Errorf("/readyz of a standby: %d %q", resp.StatusCode, b)
	}
}

// TestReceiveLatency: each transaction's arrival is one observation of the
// time since its commit, linted like the other metrics.
func TestReceiveLatency(t *testing.T) {
	m, reg := newTestMetrics(t, true)
	m.Received(time.Date(2026, 12, 1, 0, 0, 9, 998_500_000, time.UTC).UnixNano()) // 1.5 ms before now
	want := `
# HELP cdc_outbox_receive_latency_seconds Time from a transaction's commit to its arrival at cdc-outbox: PostgreSQL's share of the end-to-end latency.
# TYPE cdc_outbox_receive_latency_seconds histogram
`
	var b strings.Builder
	b.WriteString(want)
	for _, le := range LatencyBuckets {
		n := 0
		if le >= 0.0015 {
			n = 1
		}
		fmt.Fprintf(&b, "cdc_outbox_receive_latency_seconds_bucket{le=%q} %d\n", strconv.FormatFloat(le, 'g', -1, 64), n)
	}
	b.WriteString("cdc_outbox_receive_latency_seconds_bucket{le=\"+Inf\"} 1\ncdc_outbox_receive_latency_seconds_sum 0.0015\ncdc_outbox_receive_latency_seconds_count 1\n")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(b.String()), "cdc_outbox_receive_latency_seconds"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg, "cdc_outbox_receive_latency_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
