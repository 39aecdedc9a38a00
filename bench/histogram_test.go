package main

import (
	"math"
	"testing"
)

func TestQuantileInterpolatesInsideBuckets(t *testing.T) {
	inf := math.Inf(1)
	// 100 observations: 50 in (0,1], 40 in (1,2], 10 in (2,4].
	bs := []bucket{{1, 50}, {2, 90}, {4, 100}, {inf, 100}}
	for _, c := range []struct {
		q    float64
		want float64
	}{
		{0.25, 0.5}, // rank 25 of 50 in the first bucket, from 0
		{0.5, 1},    // exactly the first bucket's bound
		{0.7, 1.5},  // rank 70: 20 of 40 into (1,2]
		{0.95, 3},   // rank 95: 5 of 10 into (2,4]
		{0.999, 3.98},
	} {
		got, over := quantile(c.q, bs)
		if over || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v (over %v), want %v", c.q, got, over, c.want)
		}
	}
}

func TestQuantileInInfBucketReportsLastBound(t *testing.T) {
	bs := []bucket{{0.01, 90}, {0.1, 98}, {math.Inf(1), 100}}
	got, over := quantile(0.999, bs)
	if !over || got != 0.1 {
		t.Fatalf("quantile = %v over=%v, want 0.1 over=true", got, over)
	}
}

func TestQuantileSkipsEmptyLeadingBuckets(t *testing.T) {
	// Nothing under 2 ms: p50 must land inside (2,3], not at a bucket that
	// holds no observations.
	bs := []bucket{{0.001, 0}, {0.002, 0}, {0.003, 10}, {math.Inf(1), 10}}
	got, _ := quantile(0.5, bs)
	if math.Abs(got-0.0025) > 1e-12 {
		t.Fatalf("p50 = %v, want 0.0025", got)
	}
}

func TestQuantileEmpty(t *testing.T) {
	if v, _ := quantile(0.5, nil); !math.IsNaN(v) {
		t.Fatalf("no buckets: %v, want NaN", v)
	}
	if v, _ := quantile(0.5, []bucket{{1, 0}, {math.Inf(1), 0}}); !math.IsNaN(v) {
		t.Fatalf("no observations: %v, want NaN", v)
	}
}

func TestDeltaBuckets(t *testing.T) {
	inf := math.Inf(1)
	before := []bucket{{1, 10}, {2, 15}, {inf, 20}}
	after := []bucket{{1, 12}, {2, 30}, {inf, 40}}
	got := deltaBuckets(after, before)
	want := []bucket{{1, 2}, {2, 15}, {inf, 20}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delta = %v, want %v", got, want)
		}
	}
	// A histogram absent before the load (a fresh process) is all new.
	if got := deltaBuckets(after, nil); got[2].count != 40 {
		t.Fatalf("delta against nothing = %v", got)
	}
}
