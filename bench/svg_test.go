package main

import (
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// sampleResults is a complete run with made-up numbers.
func sampleResults() *results {
	return &results{
		info: runInfo{date: "2026-01-02 03:04 UTC", pgVersion: "15.18", kafkaVersion: "4.1.1", goVersion: "go1.26", cores: 2,
			cpuModel: "Test CPU", loadStart: 0.5, loadPeak: 1.2, duration: 9 * time.Minute,
			opts: options{events: 1000000, steady: time.Minute, rates: []int{1000, 5000}, crashRate: 2000, crashFor: 10 * time.Second}},
		drains: []drainResult{
			{perTx: 1, events: 1000000, writeTime: time.Minute, walBytes: 400 << 20, readers: []readerRun{
				{name: readerRecvlogical, wall: 10 * time.Second, events: 1000000, cpu: time.Second, walsenderCPU: 9 * time.Second},
				{name: readerStreamer, wall: 12 * time.Second, events: 1000000, cpu: 6 * time.Second, walsenderCPU: 9 * time.Second, rssMiB: 40},
				{name: readerStreamerEO, wall: 15 * time.Second, events: 1000000, cpu: 7 * time.Second, rssMiB: 45},
				{name: readerGo, wall: 9 * time.Second, events: 1000000, cpu: 2 * time.Second},
			}},
			{perTx: 100, events: 1000000, readers: []readerRun{
				{name: readerGo, wall: 5 * time.Second, events: 1000000},
				{name: readerStreamer, wall: 5 * time.Second, events: 1000000, cpu: 4 * time.Second, rssMiB: 70},
				{name: readerStreamerEO, wall: 10 * time.Second, events: 1000000, cpu: 5 * time.Second, rssMiB: 50},
				{name: readerRecvlogical, wall: 4 * time.Second, events: 1000000},
			}},
		},
		steady: []steadyResult{
			{rate: 1000, achieved: 999.6, events: 60000, p50: quant{sec: 0.004}, p99: quant{sec: 0.009}, p999: quant{sec: 0.014}, cpuPerEvent: 50, rssMiB: 30},
			{reader: readerStreamerEO, rate: 1000, achieved: 999.6, events: 60000, p50: quant{sec: 0.06}, p99: quant{sec: 0.15}, p999: quant{sec: 0.18}, cpuPerEvent: 25, rssMiB: 31},
			{rate: 5000, achieved: 4990, events: 300000, p50: quant{sec: 0.005}, p99: quant{sec: 0.025}, p999: quant{sec: 60, over: true}, cpuPerEvent: 7.5, rssMiB: 35,
				recvP99: quant{sec: 0.02}, ref: reference{p50: quant{sec: 0.001}, p99: quant{sec: 0.005}}},
			{reader: readerStreamerEO, rate: 5000, achieved: 4990, events: 300000, p50: quant{sec: 0.07}, p99: quant{sec: 0.18}, p999: quant{sec: 0.19}, cpuPerEvent: 9, rssMiB: 36},
		},
		idle:  &idleResult{window: 30 * time.Second, cpuShare: 0.001},
		crash: &crashResult{rate: 2000, duration: 10 * time.Second, written: 20000, records: 20300, duplicates: 300},
	}
}

// wellFormed fails the test unless s parses as XML from start to end.
func wellFormed(t *testing.T, s string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
	}
}

func TestChartIsWellFormedAndLabelled(t *testing.T) {
	s := chart(sampleResults())
	wellFormed(t, s)
	for _, want := range []string{"<svg", "pg_recvlogical", "Go reader", "streamer", "1 event/tx", "100 events/tx",
		"1,000 events/s", "5,000 events/s", "p99.9", "p99 target at 1,000/s: 15 ms", "streamer 0.75 × limit", "100k"} {
		if !strings.Contains(s, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestChartOfSkippedPhases(t *testing.T) {
	s := chart(&results{info: runInfo{pgVersion: "x<y&z"}})
	wellFormed(t, s)
	if !strings.Contains(s, "drain skipped") || !strings.Contains(s, "steady load skipped") {
		t.Error("skipped panels are not labelled")
	}
	if !strings.Contains(s, "x&lt;y&amp;z") {
		t.Error("text is not escaped")
	}
}

func TestNiceScale(t *testing.T) {
	for _, c := range []struct {
		max, step, top float64
	}{
		{123456, 25000, 125000},
		{20, 5, 20},
		{22, 5, 25},
		{250000, 50000, 250000},
		{0.7, 0.2, 0.8},
		{0, 1, 1},
		{math.NaN(), 1, 1},
	} {
		step, top := niceScale(c.max, 5)
		if math.Abs(step-c.step) > 1e-9 || math.Abs(top-c.top) > 1e-9 {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", c.max, step, top, c.step, c.top)
		}
	}
}

func TestShortNumber(t *testing.T) {
	for v, want := range map[float64]string{950: "950", 1500: "1.5k", 2000: "2k", 152345: "152k", 1234567: "1.23M", 0: "0"} {
		if got := shortNumber(v); got != want {
			t.Errorf("shortNumber(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestLogTicks(t *testing.T) {
	for _, c := range []struct {
		min, max float64
		lo, hi   float64
		want     []float64
	}{
		{3.2, 2470, 1, 10000, []float64{1, 10, 100, 1000, 10000}},
		{3, 250, 1, 1000, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}},
	} {
		ticks, lo, hi := logTicks(c.min, c.max)
		if lo != c.lo || hi != c.hi || len(ticks) != len(c.want) {
			t.Fatalf("logTicks(%v, %v) = %v, %v..%v; want %v, %v..%v", c.min, c.max, ticks, lo, hi, c.want, c.lo, c.hi)
		}
		for i := range c.want {
			if math.Abs(ticks[i]-c.want[i]) > 1e-9*c.want[i] {
				t.Fatalf("logTicks(%v, %v) = %v, want %v", c.min, c.max, ticks, c.want)
			}
		}
	}
}

func TestChartSwitchesToLogScaleForFarMisses(t *testing.T) {
	r := sampleResults() // its p99.9 at 5,000/s is beyond 60 s
	s := chart(r)
	wellFormed(t, s)
	if !strings.Contains(s, "log scale") {
		t.Error("a latency 3000× the target is drawn on a linear axis")
	}
	r.steady[2].p999 = quant{sec: 0.03} // 5,000/s, at-least-once
	for _, i := range []int{1, 3} {     // exactly-once, within 10× the 15 ms target
		r.steady[i].p99, r.steady[i].p999 = quant{sec: 0.12}, quant{sec: 0.14}
	}
	if s := chart(r); strings.Contains(s, "log scale") {
		t.Error("latencies near the target are drawn on a log axis")
	}
}
