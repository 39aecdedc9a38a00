package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// crashResult is what Kafka holds after a SIGKILL under load.
type crashResult struct {
	rate       int
	duration   time.Duration
	written    int // events committed to the outbox
	records    int // records in the topic
	duplicates int // records beyond the first per event id
	missing    int // committed events with no record: must be 0
}

// msWorth expresses the duplicates as milliseconds of the load.
func (c crashResult) msWorth() float64 { return float64(c.duplicates) / float64(c.rate) * 1000 }

// crash runs a paced load, SIGKILLs the streamer half-way, starts a new one
// on the same slot at once, and then reads the whole topic back: every
// committed event must be there, and the duplicates are the price of the
// crash (events acknowledged by Kafka but not yet confirmed to PostgreSQL).
func (b *bench) crash(ctx context.Context, rate int, d time.Duration) (crashResult, error) {
	const aggType = "crash"
	c := crashResult{rate: rate, duration: d}
	slot := b.slot("crash")
	if err := b.createTopic(ctx, aggType); err != nil {
		return c, err
	}
	if err := b.createSlot(ctx, slot); err != nil {
		return c, err
	}
	defer func() { _ = b.dropSlot(context.Background(), slot) }()

	progress("crash: %d events/s for %s, SIGKILL at %s", rate, d, d/2)
	first, err := b.startStreamer(slot)
	if err != nil {
		return c, err
	}
	if err := first.waitReady(ctx, 60*time.Second); err != nil {
		b.killStreamer(first)
		return c, err
	}
	var written atomic.Int64
	done := make(chan pacedResult, 1)
	go func() { done <- writePaced(ctx, b.pool, rate, d, aggType, &written) }()
	select {
	case <-time.After(d / 2):
	case <-ctx.Done():
		b.killStreamer(first)
		<-done
		return c, ctx.Err()
	}
	b.killStreamer(first)
	progress("crash: killed the streamer after %d events were committed; restarting it", written.Load())
	second, err := b.startStreamer(slot)
	if err != nil {
		<-done
		return c, err
	}
	defer func() { _ = b.stopStreamer(second, 60*time.Second) }()
	w := <-done
	if w.lastErr != nil {
		progress("  crash: %d writes failed, e.g. %v", w.errors, w.lastErr)
	}

	// The events that committed are the ones in the table.
	want := map[string]bool{}
	rows, err := b.pool.Query(ctx, "SELECT id::text FROM outbox WHERE aggregate_type = $1", aggType)
	if err != nil {
		return c, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return c, err
		}
		want[id] = true
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	c.written = len(want)
	progress("crash: load done (%d events); reading the topic back", c.written)

	seen, records, err := b.consumeAll(ctx, b.topic(aggType), want, second)
	if err != nil {
		return c, err
	}
	c.records = records
	for _, n := range seen {
		if n > 1 {
			c.duplicates += n - 1
		}
	}
	for id := range want {
		if seen[id] == 0 {
			c.missing++
		}
	}
	progress("crash: %d records for %d events: %d duplicates (%.0f ms worth), %d missing",
		c.records, c.written, c.duplicates, c.msWorth(), c.missing)
	if c.missing > 0 {
		progress("!!! crash: %d COMMITTED EVENTS ARE MISSING FROM KAFKA: at-least-once delivery is broken", c.missing)
	}
	return c, b.stopStreamer(second, 60*time.Second)
}

// consumeAll reads a topic from the start and counts records per event id
// (header id) until every wanted id has arrived and the topic's end offsets
// are reached, or 2 minutes pass. Duplicates precede the last new events in
// the partition (the restarted streamer resends from the confirmed
// position, in order), so reading to the end offsets after the last wanted
// id finds all of them.
func (b *bench) consumeAll(ctx context.Context, topic string, want map[string]bool, s *streamer) (map[string]int, int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, 0, err
	}
	defer cl.Close()
	seen := map[string]int{}
	records, found := 0, 0
	offsets := map[int32]int64{} // next offset per partition
	deadline := time.Now().Add(2 * time.Minute)
	var ends map[int32]int64
	for {
		if found == len(want) {
			if ends == nil {
				// Everything arrived; what the streamer still sends now
				// would only be more duplicates, so wait for it to have
				// nothing in flight and read up to the end offsets.
				if err := waitIdle(ctx, s); err != nil {
					return nil, 0, err
				}
				lo, err := b.adm.ListEndOffsets(ctx, topic)
				if err != nil {
					return nil, 0, err
				}
				ends = map[int32]int64{}
				lo.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
			}
			reached := true
			for p, e := range ends {
				if offsets[p] < e {
					reached = false
				}
			}
			if reached {
				return seen, records, nil
			}
		}
		if time.Now().After(deadline) {
			return seen, records, nil // missing ones are reported by the caller
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			records++
			offsets[r.Partition] = r.Offset + 1
			id := headerValue(r, "id")
			seen[id]++
			if seen[id] == 1 && want[id] {
				found++
			}
		})
	}
}

// waitIdle waits until the streamer has no record in flight.
func waitIdle(ctx context.Context, s *streamer) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if ms, err := s.scrape(ctx); err == nil {
			if v, ok := ms.value("cdc_outbox_inflight_events"); ok && v == 0 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("streamer still has events in flight after 30s")
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
