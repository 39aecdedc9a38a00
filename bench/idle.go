package main

import (
	"context"
	"fmt"
	"time"
)

// idleResult is the streamer with nothing to stream: what it costs to keep
// the connections, timers and status updates going.
type idleResult struct {
	window       time.Duration
	cpuShare     float64 // of one core
	wakeupsPerS  float64
	statusPerSec float64
}

// idle runs a streamer with no load for d after it is ready and settled.
func (b *bench) idle(ctx context.Context, d time.Duration) (idleResult, error) {
	var r idleResult
	slot := b.slot("idle")
	if err := b.createSlot(ctx, slot); err != nil {
		return r, err
	}
	defer func() { _ = b.dropSlot(context.Background(), slot) }()
	progress("idle: the streamer with no events for %s", d)
	s, err := b.startStreamer(slot)
	if err != nil {
		return r, err
	}
	defer func() { _ = b.stopStreamer(s, 60*time.Second) }()
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		return r, err
	}
	// The first seconds after start (metadata, the first status updates)
	// are not idle.
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(5 * time.Second):
	}
	before, err := s.scrape(ctx)
	if err != nil {
		return r, err
	}
	a0, err := readActivity(s.pid())
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(d):
	}
	a1, err := readActivity(s.pid())
	if err != nil {
		return r, err
	}
	r.window = time.Since(t0)
	after, err := s.scrape(ctx)
	if err != nil {
		return r, err
	}
	a := a1.sub(a0)
	r.cpuShare = float64(a.runNanos) / float64(r.window.Nanoseconds())
	r.wakeupsPerS = float64(a.voluntary) / r.window.Seconds()
	r.statusPerSec = (after.sum(statusUpdatesMetric) - before.sum(statusUpdatesMetric)) / r.window.Seconds()
	progress("idle: %.3f%% of a core, %.1f wake-ups/s, %.2f status updates/s", 100*r.cpuShare, r.wakeupsPerS, r.statusPerSec)
	return r, b.stopStreamer(s, 60*time.Second)
}

func (r idleResult) String() string {
	return fmt.Sprintf("%.3f%% of a core over %s (%.1f wake-ups/s, %.2f status updates/s)",
		100*r.cpuShare, r.window.Round(time.Second), r.wakeupsPerS, r.statusPerSec)
}
