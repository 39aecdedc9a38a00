package consume

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourcesDoNotCollide: one group reads the topics of two outboxes
// whose ids overlap (each has its own bigserial), plus records of a
// streamer that sets no source; every event is processed once, and only
// the true redeliveries are duplicates.
func TestSourcesDoNotCollide(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	refunds := newTopic(t, "consume_refunds", 2)
	const n = 50
	var events []event
	for i := 1; i <= n; i++ {
		id := fmt.Sprint(i)
		events = append(events,
			event{id: id, key: fmt.Sprintf("pay-%d", i%7), amount: i, source: "7312345678901234567/16384/16390"},
			event{id: id, key: fmt.Sprintf("ref-%d", i%5), amount: i, source: "7398765432109876543/16384/16401", topic: refunds},
			event{id: id, key: fmt.Sprintf("old-%d", i%3), amount: i}, // an older streamer: no source header
		)
		if i%10 == 0 { // a redelivery of each source's event
			events = append(events, events[len(events)-3], events[len(events)-2], events[len(events)-1])
		}
	}
	e.produce(events...)

	cfg := e.config(bill)
	cfg.Topics = []string{e.topic, refunds}
	c := e.consumer(cfg)
	total := int64(len(events))
	if err := runUntil(t, c, func() bool { return stats(c).processed.Load()+stats(c).duplicates.Load() == total }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p, d := stats(c).processed.Load(), stats(c).duplicates.Load(); p != 3*n || d != 3*n/10 {
		t.Errorf("processed %d, duplicates %d; want %d (every event of every source) and %d (the redeliveries)", p, d, 3*n, 3*n/10)
	}
	if rows, distinct := e.billing(); rows != 3*n || distinct != 3*n {
		t.Errorf("billing: %d rows, %d distinct (source, id); want %d and %d", rows, distinct, 3*n, 3*n)
	}
	if sources := e.count(`SELECT count(DISTINCT source) FROM processed_events WHERE consumer_group = $1`, e.group); sources != 3 {
		t.Errorf("processed_events holds %d sources, want 3 (two, and '' for no header)", sources)
	}
}

// TestAmbiguousSourceNotRecorded: a record whose "source" headers disagree
// cannot be deduplicated: it is dead-lettered untried and not recorded as
// processed, so it cannot make a later event with the same id pass for a
// duplicate.
func TestAmbiguousSourceNotRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlt := newTopic(t, "dlq", 1)
	ambiguous := event{id: "ev-1", key: "k"}.record(e.topic)
	ambiguous.Headers = append(ambiguous.Headers,
		kgo.RecordHeader{Key: HeaderSource, Value: []byte("a")}, kgo.RecordHeader{Key: HeaderSource, Value: []byte("b")})
	cl := kafkaClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, ambiguous, event{id: "ev-1", key: "k", amount: 7}.record(e.topic)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(bill)
	cfg.OnFailure = DeadLetter
	cfg.DeadLetterTopic = dlt
	c := e.consumer(cfg)
	if err := runUntil(t, c, func() bool {
		return stats(c).deadLettered.Load()+stats(c).processed.Load()+stats(c).duplicates.Load() == 2
	}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if dl, p, d := stats(c).deadLettered.Load(), stats(c).processed.Load(), stats(c).duplicates.Load(); dl != 1 || p != 1 || d != 0 {
		t.Errorf("dead-lettered %d, processed %d, duplicates %d; want 1, 1, 0", dl, p, d)
	}
	if n := e.processedRows(); n != 1 {
		t.Errorf("processed_events: %d rows, want 1 (the record without a source)", n)
	}
}
