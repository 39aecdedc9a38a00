package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestWalsenderKilledInHugeTransaction measures the real bound on repeats.
// A position can only be confirmed at a commit, so when the replication
// connection ends inside a transaction, PostgreSQL sends that transaction
// again whole: every event of it already published is repeated, however
// many that is, on top of what was in flight. Here the walsender is
// terminated once at least 100,000 events of one 300,000-row transaction
// are in Kafka; the streamer reconnects, nothing is missing, and the
// repeats stay within the part of the transaction published before the
// cut plus --max-inflight-events. (100 in flight, with the 5 ms linger,
// paces the stream to some tens of thousands of events a second, so the
// cut lands inside the transaction.)
func TestWalsenderKilledInHugeTransaction(t *testing.T) {
	t.Parallel()
	const rows, cutAt, inflight = 300_000, 100_000, 100
	e := newEnv(t)
	s := e.start("--max-inflight-events", fmt.Sprint(inflight))
	e.waitStreaming()
	testenv.Exec(t, e.url, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'huge', 'agg-' || (g %% 1000), 'Bulk', jsonb_build_object('seq', g) FROM generate_series(1, %d) g`, rows))
	end := e.currentLSN()

	adm := kadm.NewClient(testenv.KafkaClient(t))
	inTopic := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		offsets, err := adm.ListEndOffsets(ctx, e.topic("huge"))
		if err != nil {
			return 0
		}
		var n int64
		offsets.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	var before int64
	eventually(t, 3*time.Minute, fmt.Sprintf("%d events of the transaction in Kafka", cutAt), func() bool {
		before = inTopic()
		return before >= cutAt
	})
	testenv.Exec(t, e.url, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.slot)
	eventually(t, 5*time.Minute, "the slot to confirm the transaction", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= end
	})
	total := inTopic()

	// Every event must be there: read the topic back by event id.
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(e.topic("huge")), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	seen := make(map[string]bool, rows)
	for read := int64(0); read < total && ctx.Err() == nil; {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) { seen[header(r, "id")] = true; read++ })
	}
	repeats := total - rows
	t.Logf("walsender terminated with %d of %d events of one transaction in Kafka: %d records, %d distinct events, %d repeats",
		before, rows, total, len(seen), repeats)
	if len(seen) != rows {
		t.Fatalf("%d distinct events in the topic, want %d", len(seen), rows)
	}
	if repeats > int64(rows)-1+inflight {
		t.Fatalf("%d repeats: more than the transaction before its last event plus %d in flight", repeats, inflight)
	}
	s.stop()
}
