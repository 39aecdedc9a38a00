package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// latencyMetric is the streamer's commit→ack histogram, receiveMetric its
// commit→arrival one (PostgreSQL's share).
const (
	latencyMetric = "cdc_outbox_end_to_end_latency_seconds"
	receiveMetric = "cdc_outbox_receive_latency_seconds"
	// produceBatchesMetric counts batches (franz-go kprom); with one
	// partition, one per produce request.
	produceBatchesMetric = "cdc_outbox_kafka_produce_batches_total"
	statusUpdatesMetric  = "cdc_outbox_status_updates_total"
)

// steadyResult is one fixed-rate load.
type steadyResult struct {
	reader   string  // readerStreamer or readerStreamerEO
	rate     int     // requested events/s
	achieved float64 // committed events/s
	events   int     // acknowledged by Kafka during the window
	p50      quant
	p99      quant
	p999     quant
	// recvP99 is the p99 of the streamer's own commit→arrival histogram in
	// the same window: how much of p99 the PostgreSQL side took.
	recvP99     quant
	cpuPerEvent float64 // µs
	rssMiB      float64
	writeErrors int64
	// What the streamer asked of the machine in the window, per event
	// (status updates per second): where CPU per event comes from.
	perEvent     costs
	statusPerSec float64
	machine      machineLoad
	// ref is the reference at the same rate: commit to arrival at a client
	// that does nothing, the walsender's share of the latency.
	ref reference
}

// name is the streamer's row label: at-least-once unless said.
func (s steadyResult) name() string {
	if s.reader == "" {
		return readerStreamer
	}
	return s.reader
}

// reference is the steady-load reference's latency at one rate.
type reference struct {
	achieved       float64
	p50, p99, p999 quant
	machine        machineLoad
}

// costs are a process's system calls, wake-ups and produce requests per
// event.
type costs struct {
	reads, writes float64 // read and write system calls (sockets included)
	wakeups       float64 // voluntary context switches: a thread slept and was woken
	preempted     float64 // involuntary context switches
	produces      float64 // produce requests (batches: one partition here)
}

func costsOf(a activity, batches float64, events int) costs {
	if events <= 0 {
		return costs{}
	}
	n := float64(events)
	return costs{float64(a.reads) / n, float64(a.writes) / n, float64(a.voluntary) / n, float64(a.involunt) / n, batches / n}
}

// warmup runs before the measured window: the first events pay for
// connections, metadata and the Go runtime growing its heap, which is
// start-up rather than steady state.
const warmup = 3 * time.Second

// steadyLoads measures each rate twice, the reference first and then a
// fresh streamer (a rate's peak RSS is then its own), each on a slot made
// just before, so neither reads what was written for the other.
func (b *bench) steadyLoads(ctx context.Context, rates []int, d time.Duration) ([]steadyResult, error) {
	const aggType = "steady"
	if err := b.createTopic(ctx, aggType); err != nil {
		return nil, err
	}
	var out []steadyResult
	for _, rate := range rates {
		ref, err := b.steadyReference(ctx, aggType, rate, d)
		if err != nil {
			return out, fmt.Errorf("%d events/s, reference: %w", rate, err)
		}
		for _, reader := range []string{readerStreamer, readerStreamerEO} {
			r, err := b.steady(ctx, aggType, rate, d, reader)
			if err != nil {
				return out, fmt.Errorf("%d events/s, %s: %w", rate, reader, err)
			}
			r.ref = ref
			out = append(out, r)
		}
	}
	return out, nil
}

// steadyReference runs the load at rate with only commitDelays reading.
func (b *bench) steadyReference(ctx context.Context, aggType string, rate int, d time.Duration) (reference, error) {
	var ref reference
	slot := b.slot(fmt.Sprintf("steady%d_goreader", rate))
	if err := b.createSlot(ctx, slot); err != nil {
		return ref, err
	}
	defer func() { _ = b.dropSlot(context.Background(), slot) }()
	progress("steady %d/s: the reference (a Go reader) alone, %s warm-up, then %s measured", rate, warmup, d)
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	var measuring atomic.Bool
	type readResult struct {
		delays []time.Duration
		err    error
	}
	done := make(chan readResult, 1)
	go func() {
		delays, err := commitDelays(readCtx, b.dbURL, slot, &measuring)
		done <- readResult{delays, err}
	}()
	if w := writePaced(ctx, b.pool, rate, warmup, aggType, nil); w.lastErr != nil && ctx.Err() == nil {
		return ref, fmt.Errorf("warm-up writes: %w", w.lastErr)
	}
	measuring.Store(true)
	watch := watchMachine()
	w := writePaced(ctx, b.pool, rate, d, aggType, nil)
	ref.machine = watch()
	// The window's last commits arrive within moments at any rate the
	// reader keeps up with; one that arrives later is lost to the tail.
	time.Sleep(time.Second)
	stopReading()
	res := <-done
	if ctx.Err() != nil {
		return ref, ctx.Err()
	}
	if res.err != nil {
		return ref, res.err
	}
	ref.achieved = w.rate()
	ref.p50, ref.p99, ref.p999 = exactQuantile(0.50, res.delays), exactQuantile(0.99, res.delays), exactQuantile(0.999, res.delays)
	progress("steady %d/s: reference: %d transactions; commit to arrival p50 %s p99 %s p99.9 %s; %s",
		rate, len(res.delays), ref.p50, ref.p99, ref.p999, ref.machine)
	return ref, nil
}

// exactQuantile is the q-quantile of samples (nearest rank); NaN when there
// are none.
func exactQuantile(q float64, samples []time.Duration) quant {
	if len(samples) == 0 {
		return quant{sec: math.NaN()}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	i := min(int(math.Ceil(q*float64(len(s))))-1, len(s)-1)
	return quant{sec: s[max(i, 0)].Seconds()}
}

func (b *bench) steady(ctx context.Context, aggType string, rate int, d time.Duration, reader string) (steadyResult, error) {
	r := steadyResult{rate: rate, reader: reader}
	var extra []string
	tag := "streamer"
	if reader == readerStreamerEO {
		extra, tag = exactlyOnceFlags, "streamer_eo"
	}
	slot := b.slot(fmt.Sprintf("steady%d_%s", rate, tag))
	if err := b.createSlot(ctx, slot); err != nil {
		return r, err
	}
	defer func() { _ = b.dropSlot(context.Background(), slot) }()
	progress("steady %d/s: starting the %s", rate, reader)
	s, err := b.startStreamer(slot, extra...)
	if err != nil {
		return r, err
	}
	defer func() { _ = b.stopStreamer(s, 60*time.Second) }()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		return r, err
	}

	progress("steady %d/s: %s warm-up, then %s measured", rate, warmup, d)
	if w := writePaced(ctx, b.pool, rate, warmup, aggType, nil); w.lastErr != nil && ctx.Err() == nil {
		return r, fmt.Errorf("warm-up writes: %w", w.lastErr)
	}
	before, err := s.scrape(ctx)
	if err != nil {
		return r, err
	}
	// CPU and costs are counted over the first half of the window and the
	// CPU profile is taken in the second: a profile's signals interrupt
	// the streamer's sleeps and cost CPU of their own.
	c0, err := s.costsNow(ctx)
	if err != nil {
		return r, err
	}
	watch := watchMachine()
	var written atomic.Int64
	done := make(chan pacedResult, 1)
	go func() { done <- writePaced(ctx, b.pool, rate, d, aggType, &written) }()
	var w pacedResult
	half := time.NewTimer(d / 2)
	tick := time.NewTicker(10 * time.Second)
	var c1 costSnapshot
	profiled := func() profile { return profile{} }
wait:
	for {
		select {
		case w = <-done:
			break wait
		case <-half.C:
			if c1, err = s.costsNow(ctx); err != nil {
				return r, err
			}
			r.machine = watch()
			if reader == readerStreamer { // one profile per rate: at-least-once's
				profiled = b.cpuProfile(ctx, s, fmt.Sprintf("steady %d per second", rate), d/2-time.Second)
			}
		case <-tick.C:
			progress("  steady %d/s: %d events committed", rate, written.Load())
		}
	}
	tick.Stop()
	half.Stop()
	defer profiled()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if w.lastErr != nil {
		progress("  steady %d/s: %d writes failed, e.g. %v", rate, w.errors, w.lastErr)
	}
	r.achieved, r.writeErrors = w.rate(), w.errors

	// Wait for the window's last events to be acknowledged, so its
	// histogram holds all of them.
	target := before.sum("cdc_outbox_events_total") + float64(w.written)
	var after metricSet
	deadline := time.Now().Add(60 * time.Second)
	for {
		if s.exited() {
			return r, s.failure("exited during the steady load")
		}
		after, err = s.scrape(ctx)
		if err == nil && after.sum("cdc_outbox_events_total") >= target {
			break
		}
		if time.Now().After(deadline) {
			return r, s.failure("had not acknowledged the load's events 60s after it ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	u, err := readUsage(s.pid())
	if err != nil {
		return r, err
	}
	r.events = int(after.sum("cdc_outbox_events_total") - before.sum("cdc_outbox_events_total"))
	if c1.at.IsZero() {
		return r, fmt.Errorf("the load ended before half of the window (%s) passed", d/2)
	}
	counted := int(c1.events - c0.events)
	if counted > 0 {
		r.cpuPerEvent = float64((c1.cpu - c0.cpu).Microseconds()) / float64(counted)
	}
	r.perEvent = costsOf(c1.act.sub(c0.act), c1.batches-c0.batches, counted)
	r.statusPerSec = (c1.status - c0.status) / c1.at.Sub(c0.at).Seconds()
	r.rssMiB = mib(u.hwmKiB)
	hist := deltaBuckets(after.histogram(latencyMetric), before.histogram(latencyMetric))
	r.p50, r.p99, r.p999 = quantileOf(0.50, hist), quantileOf(0.99, hist), quantileOf(0.999, hist)
	r.recvP99 = quantileOf(0.99, deltaBuckets(after.histogram(receiveMetric), before.histogram(receiveMetric)))
	progress("steady %d/s, %s: achieved %.0f/s; latency p50 %s p99 %s p99.9 %s (p99 commit to arrival %s); %.1f µs CPU/event; peak RSS %.1f MiB; %s",
		rate, reader, r.achieved, r.p50, r.p99, r.p999, r.recvP99, r.cpuPerEvent, r.rssMiB, r.machine)
	c := r.perEvent
	progress("steady %d/s, %s: per event: %.2f reads, %.2f writes, %.2f wake-ups, %.2f preemptions, %.3f produce requests; %.1f status updates/s",
		rate, reader, c.reads, c.writes, c.wakeups, c.preempted, c.produces, r.statusPerSec)
	return r, b.stopStreamer(s, 60*time.Second)
}

// costSnapshot is a running streamer's counters at one moment.
type costSnapshot struct {
	at                      time.Time
	cpu                     time.Duration
	act                     activity
	events, batches, status float64
}

func (s *streamer) costsNow(ctx context.Context) (costSnapshot, error) {
	c := costSnapshot{at: time.Now()}
	ms, err := s.scrape(ctx)
	if err != nil {
		return c, err
	}
	if c.cpu, err = readCPU(s.pid()); err != nil {
		return c, err
	}
	if c.act, err = readActivity(s.pid()); err != nil {
		return c, err
	}
	c.events, c.batches, c.status = ms.sum("cdc_outbox_events_total"), ms.sum(produceBatchesMetric), ms.sum(statusUpdatesMetric)
	return c, nil
}

// quant is an estimated latency quantile.
type quant struct {
	sec  float64 // NaN when nothing was observed
	over bool    // in the +Inf bucket: the true value is above sec
}

func quantileOf(q float64, bs []bucket) quant {
	v, over := quantile(q, bs)
	return quant{sec: v, over: over}
}

func (q quant) ok() bool { return !math.IsNaN(q.sec) }

// String is the quantile in milliseconds.
func (q quant) String() string {
	if !q.ok() {
		return "n/a"
	}
	if q.over {
		return fmt.Sprintf("> %.0f ms", q.sec*1000)
	}
	return fmt.Sprintf("%.1f ms", q.sec*1000)
}
