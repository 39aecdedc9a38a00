package main

import (
	"math"
	"strings"
	"testing"
)

const scrape = `# HELP cdc_outbox_events_total Events acknowledged by Kafka.
# TYPE cdc_outbox_events_total counter
cdc_outbox_events_total{topic="bench.a"} 1500
cdc_outbox_events_total{topic="bench.b"} 500
cdc_outbox_ready 1
cdc_outbox_connected{target="kafka"} 1
cdc_outbox_connected{target="postgres"} 0
cdc_outbox_end_to_end_latency_seconds_bucket{le="0.001"} 3
cdc_outbox_end_to_end_latency_seconds_bucket{le="+Inf"} 10
cdc_outbox_end_to_end_latency_seconds_bucket{le="0.01"} 7
cdc_outbox_end_to_end_latency_seconds_sum 0.05
cdc_outbox_build_info{goversion="go1.26",revision="a\"b\\c",version="v1, {x}"} 1
go_gc_duration_seconds{quantile="0.5"} NaN
process_start_time_seconds 1.7e+09 1700000000000
`

func TestParseProm(t *testing.T) {
	ms, err := parseProm(strings.NewReader(scrape))
	if err != nil {
		t.Fatal(err)
	}
	if got := ms.sum("cdc_outbox_events_total"); got != 2000 {
		t.Errorf("sum = %v, want 2000", got)
	}
	if v, ok := ms.value("cdc_outbox_connected", "target", "postgres"); !ok || v != 0 {
		t.Errorf("connected{postgres} = %v %v", v, ok)
	}
	if v, ok := ms.value("cdc_outbox_ready"); !ok || v != 1 {
		t.Errorf("ready = %v %v", v, ok)
	}
	if _, ok := ms.value("cdc_outbox_missing"); ok {
		t.Error("a missing metric was found")
	}
	if v, _ := ms.value("cdc_outbox_build_info", "revision", `a"b\c`, "version", "v1, {x}"); v != 1 {
		t.Error("escaped label values were not parsed")
	}
	if v, _ := ms.value("process_start_time_seconds"); v != 1.7e9 {
		t.Errorf("value with timestamp = %v", v)
	}
	if v, _ := ms.value("go_gc_duration_seconds"); !math.IsNaN(v) {
		t.Errorf("NaN = %v", v)
	}
	h := ms.histogram("cdc_outbox_end_to_end_latency_seconds")
	if len(h) != 3 || h[0].le != 0.001 || h[1].le != 0.01 || !math.IsInf(h[2].le, 1) || h[2].count != 10 {
		t.Errorf("histogram = %v, want sorted buckets with +Inf last", h)
	}
}

func TestParsePromRejectsGarbage(t *testing.T) {
	for _, s := range []string{"novalue", `m{a="x" 1`, "m notanumber"} {
		if _, err := parseProm(strings.NewReader(s)); err == nil {
			t.Errorf("%q parsed without error", s)
		}
	}
}
