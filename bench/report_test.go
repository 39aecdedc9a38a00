package main

import (
	"strings"
	"testing"
)

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -45678: "-45,678"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestLimitIsTheFasterReference(t *testing.T) {
	d := sampleResults().drains[0]
	// pg_recvlogical 100k/s, Go reader 111k/s: the limit is the Go reader.
	if got, want := d.limit(), 1000000/9.0; got < want-1 || got > want+1 {
		t.Fatalf("limit = %v, want %v", got, want)
	}
}

func TestTargets(t *testing.T) {
	got := map[string]bool{}
	for _, tg := range sampleResults().targets() {
		got[tg.name] = tg.pass
	}
	want := map[string]bool{
		"drain, 1 event/tx: streamer ≥ 0.9 × limit":                               false, // 83k of 111k
		"drain, 100 events/tx: streamer ≥ 0.9 × limit":                            false, // 200k of 250k
		"steady 1,000/s: p99 ≤ 15 ms":                                             true,  // 9 ms
		"steady 1,000/s: CPU ≤ 40 µs/event":                                       false, // 50 µs
		"steady 5,000/s: p99 ≤ 50 ms":                                             true,  // 25 ms
		"steady 5,000/s: commit to arrival p99 ≤ 3 × the reference's":             false, // 20 ms against 5 ms
		"steady 5,000/s: CPU ≤ 15 µs/event":                                       true,  // 7.5 µs
		"idle: CPU ≤ 0.2% of a core":                                              true,  // 0.1%
		"peak RSS ≤ 64 MiB (largest of all runs)":                                 false, // 70 MiB
		"drain, 1 event/tx: CPU ≤ 8 µs/event":                                     true,  // 6 µs
		"drain, 100 events/tx: CPU ≤ 8 µs/event":                                  true,  // 4 µs
		"crash: duplicates ≤ ~200 ms worth":                                       true,  // 300 at 2,000/s = 150 ms
		"crash: no committed event missing":                                       true,
		"drain, 1 event/tx: exactly-once ≥ 0.7 × at-least-once":                   true,  // 12 s against 15 s: 0.8
		"drain, 100 events/tx: exactly-once ≥ 0.7 × at-least-once":                false, // 5 s against 10 s: 0.5
		"steady 1,000/s, exactly-once: p99 ≤ 200 ms (2 × --transaction-interval)": true,  // 150 ms
	}
	for name, pass := range want {
		if p, ok := got[name]; !ok || p != pass {
			t.Errorf("target %q: got pass=%v (present %v), want %v", name, p, ok, pass)
		}
	}
	if len(got) != len(want) {
		t.Errorf("targets = %v", got)
	}
}

func TestReportsMentionMethodAndRows(t *testing.T) {
	r := sampleResults()
	txt, md := r.text(), r.markdown()
	for _, s := range []string{txt, md} {
		for _, want := range []string{"15.18", "4.1.1", "pg_recvlogical", "steady 5,000/s", "> 60000 ms", "streamer, exactly-once", "bucket", "commit time from the Begin message", "MISS", "PASS"} {
			if !strings.Contains(s, want) {
				t.Errorf("report lacks %q", want)
			}
		}
	}
	if !strings.Contains(md, "![events/s and latency](latest.svg)") {
		t.Error("latest.md does not show the chart")
	}
	if strings.Contains(txt, "WARNING") {
		t.Error("a quiet machine is reported busy")
	}
	r.info.loadPeak = 7.5
	if !strings.Contains(r.text(), "WARNING: the load average reached 7.5 on 2 cores") {
		t.Error("a busy machine is not reported")
	}
	r.crash.missing = 3
	if !strings.Contains(r.text(), "3 COMMITTED EVENTS NEVER REACHED KAFKA") {
		t.Error("missing events are not reported loudly")
	}
}
