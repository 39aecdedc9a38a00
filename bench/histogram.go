package main

import "math"

// bucket is one cumulative histogram bucket: count observations ≤ le.
type bucket struct {
	le    float64
	count float64
}

// deltaBuckets subtracts a histogram snapshot taken before a load from one
// taken after it, leaving the observations made during the load. Buckets are
// matched by upper bound; one missing from before counts as empty.
func deltaBuckets(after, before []bucket) []bucket {
	prev := make(map[float64]float64, len(before))
	for _, b := range before {
		prev[b.le] = b.count
	}
	out := make([]bucket, len(after))
	for i, b := range after {
		out[i] = bucket{le: b.le, count: b.count - prev[b.le]}
	}
	return out
}

// quantile estimates the q-quantile (0 < q < 1) of cumulative buckets the
// way Prometheus' histogram_quantile does: find the bucket holding rank
// q×total and interpolate linearly inside it, taking 0 as the lower bound of
// the first bucket. A rank in the +Inf bucket returns the highest finite
// bound with over=true (the true value is above it). No observations: NaN.
func quantile(q float64, bs []bucket) (v float64, over bool) {
	if len(bs) == 0 {
		return math.NaN(), false
	}
	// Cumulative: the last bucket (+Inf in a complete scrape) holds all.
	total := bs[len(bs)-1].count
	if total <= 0 {
		return math.NaN(), false
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank && b.count > below {
			if math.IsInf(b.le, 1) {
				return lower, true
			}
			return lower + (b.le-lower)*(rank-below)/(b.count-below), false
		}
		if !math.IsInf(b.le, 1) {
			lower = b.le
		}
		below = b.count
	}
	return lower, true
}
