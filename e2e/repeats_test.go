package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestWalsenderKilledInHugeTransaction: when the replication connection
// ends inside a transaction, PostgreSQL sends that transaction again from
// its start, with the same changes at the same LSNs. The streamer
// remembers which of its changes the broker acknowledged and publishes
// again only the others. Here the walsender is terminated once at least 100,000
// events of one 300,000-row transaction are in Kafka; the streamer
// reconnects, nothing is missing, and the repeats stay within
// --max-inflight-events. (100 in flight, with the 5 ms linger, paces the
// stream to some tens of thousands of events a second, so the cut lands
// inside the transaction.)
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
	notAgain := notPublishedAgain(s)
	t.Logf("walsender terminated with %d of %d events of one transaction in Kafka: %d records, %d distinct events (missing %d), %d repeats; %d events not published again",
		before, rows, total, len(seen), rows-len(seen), repeats, notAgain)
	if len(seen) != rows {
		t.Fatalf("%d distinct events in the topic, want %d", len(seen), rows)
	}
	if repeats > inflight {
		t.Fatalf("%d repeats: more than the %d in flight", repeats, inflight)
	}
	if notAgain < before-inflight {
		t.Fatalf("%d events not published again, with %d in Kafka before the cut", notAgain, before)
	}
	s.stop()
}

// notPublishedAgain sums what the streamer logged it did not publish again
// of the transactions PostgreSQL sent again.
func notPublishedAgain(s *streamer) int64 {
	var n int64
	for _, m := range notAgainField.FindAllStringSubmatch(s.logText(), -1) {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		n += v
	}
	return n
}

var notAgainField = regexp.MustCompile(`"not_published_again":(\d+)`)

// TestExactlyOnceWalsenderKilledInLargeTransaction: in exactly-once
// delivery, the records of a PostgreSQL transaction wait for its commit
// before any Kafka transaction takes them, so when the connection breaks
// inside it, none of them is in Kafka (nor acknowledged): they are dropped,
// and the transaction sent again is published once. The walsender is
// terminated while it sends one transaction of 50,000 rows (a sixth of the
// at-least-once test's: every record of it is held in memory until its
// commit), 200 ms after its decoding reached the transaction's commit; a
// cut that lands after the streamer had the transaction whole is tried
// again with another transaction, sooner. A read_committed consumer finds
// every event once.
func TestExactlyOnceWalsenderKilledInLargeTransaction(t *testing.T) {
	t.Parallel()
	const rows = 50_000
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	s := e.eo("--max-inflight-events", "2000")
	e.waitStreaming()
	dropped := func() int {
		n := 0
		for _, m := range droppedField.FindAllStringSubmatch(s.logText(), -1) {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
		return n
	}
	attempts := 0
	for dropped() == 0 {
		attempts++
		if attempts > 5 {
			t.Fatalf("5 cuts, none inside a transaction:\n%s", tailOf(s.logText(), 3000))
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := tx.Query(ctx, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'payment', 'agg%d-' || (g %% 100), 'Bulk', jsonb_build_object('seq', g / 100 + 1)
			FROM generate_series(0, %d) g RETURNING id::text, aggregate_id, (payload->>'seq')::int`, attempts, rows-1))
		if err != nil {
			t.Fatal(err)
		}
		var batch []written
		for lines.Next() {
			var w written
			if err := lines.Scan(&w.id, &w.aggregate, &w.seq); err != nil {
				t.Fatal(err)
			}
			batch = append(batch, w)
		}
		if err := lines.Err(); err != nil {
			t.Fatal(err)
		}
		// Every change of the transaction is in the WAL before this
		// position, its commit record after it.
		var rowsEnd pglogrepl.LSN
		if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&rowsEnd); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wl.events = append(wl.events, batch...)
		end := e.currentLSN()
		// The walsender has decoded the rows and sends the transaction
		// (sent_lsn reaches the commit only once it sent all of it), or
		// is already past it: then the next attempt.
		// Polled without pause: the streamer takes the transaction in
		// well under a second.
		for deadline := time.Now().Add(time.Minute); ; {
			var sent pglogrepl.LSN
			err := e.pool.QueryRow(ctx, `SELECT coalesce(max(r.sent_lsn), '0/0') FROM pg_replication_slots s
				JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, e.slot).Scan(&sent)
			if err != nil {
				t.Fatal(err)
			}
			if sent >= rowsEnd {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the walsender did not reach %s, the end of the transaction's rows, within a minute", rowsEnd)
			}
		}
		// The cut's moment, deeper into the transaction at first, sooner
		// on each attempt after one that came too late: not a wait for
		// a condition (whether it landed inside is read from the log).
		time.Sleep(200 * time.Millisecond >> (attempts - 1))
		testenv.Exec(t, e.url, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.slot)
		eventually(t, 3*time.Minute, "the slot to confirm the transaction", func() bool {
			confirmed, _ := e.slotLSNs()
			return confirmed >= end
		})
	}
	t.Logf("walsender terminated inside a %d-row transaction (attempt %d): %d of its records dropped, none in Kafka", rows, attempts, dropped())
	wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("after the walsender was terminated inside a %d-row transaction", rows))
	s.stop()
}

var droppedField = regexp.MustCompile(`"msg":"the replication connection was lost inside a transaction[^}]*"dropped":(\d+)`)
