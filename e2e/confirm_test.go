package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestNeverConfirmsUnacked stops the broker for a full minute while two
// writers keep committing, and checks all along that the slot's
// confirmed_flush_lsn does not pass the first event written after the stop.
// Once the broker is back every event arrives, and only then the slot
// moves past them. The outage outlasts the server's wal_sender_timeout
// (60s), and the writers outrun --max-inflight-events, so reading pauses:
// the replication connection survives only because status updates keep
// flowing.
//
// Not parallel: it stops the one broker every test shares (make test runs
// packages one at a time, and Go runs parallel tests after this one).
func TestNeverConfirmsUnacked(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start("--max-inflight-events", "5000")
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	brokerUp := brokerFault(t, "stop", "start")
	stopped := time.Now()
	if err := wl.write(ctx, 1, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	// The first unacked transaction ends at or before this position.
	firstUnacked := e.currentLSN()
	const outage = time.Minute
	writing := make(chan error, 2)
	for w := 2; w <= 3; w++ {
		go func() {
			for time.Since(stopped) < outage {
				if err := wl.write(ctx, w, 10, 10, "payment", false); err != nil {
					writing <- err
					return
				}
				time.Sleep(25 * time.Millisecond)
			}
			writing <- nil
		}()
	}
	for time.Since(stopped) < outage {
		if confirmed, _ := e.slotLSNs(); confirmed >= firstUnacked {
			t.Fatalf("broker down, yet the slot confirmed %d, past the first unacknowledged transaction (ends by %d)", confirmed, firstUnacked)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for w := 2; w <= 3; w++ {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	end := e.currentLSN()

	down := time.Since(stopped)
	brokerUp()
	t.Logf("broker stopped for %s while %d events were written", down.Round(time.Second), len(wl.events))
	wl.check([]string{"payment"}, "after the broker outage")
	eventually(t, 30*time.Second, "the slot to confirm the events once acknowledged", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= end
	})
	if log := s.logText(); strings.Contains(log, "replication connection lost") {
		t.Fatalf("the replication connection dropped during the outage:\n%s", log)
	}
	s.stop()
}

// TestIdleOutboxReleasesWAL: while only other tables change, keepalives
// move the slot along, so it does not hold WAL.
func TestIdleOutboxReleasesWAL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	testenv.Exec(t, e.url, `CREATE TABLE other (body text)`)
	// About 50 MB of WAL that is not outbox traffic.
	testenv.Exec(t, e.url, `INSERT INTO other SELECT repeat(md5(g::text), 30) FROM generate_series(1, 50000) g`)
	target := e.currentLSN()
	eventually(t, 30*time.Second, "the slot to follow the WAL while the outbox is idle", func() bool {
		confirmed, current := e.slotLSNs()
		return confirmed >= target-(1<<20) && current-confirmed < 1<<20
	})
	s.stop()
}

// TestBadEventFail: a row whose topic renders invalid stops the stream with
// the event id and LSN in the error, and nothing past it is confirmed.
func TestBadEventFail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	ctx := testenv.Context(t)
	var badID string
	err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('not a topic!', 'a1', 'Oops', '{}') RETURNING id::text`).Scan(&badID)
	if err != nil {
		t.Fatal(err)
	}
	before := e.currentLSN()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 after a bad event under --on-bad-event=fail")
	}
	log := s.logText()
	if !strings.Contains(log, "bad event "+badID+" at LSN ") || !strings.Contains(log, "--on-bad-event=dead-letter") {
		t.Fatalf("the error does not name event %s, its LSN and the way out:\n%s", badID, log)
	}
	e.waitSlotInactive()
	if confirmed, _ := e.slotLSNs(); confirmed >= before {
		t.Fatalf("the slot confirmed %d, past the bad event (WAL was at %d after it)", confirmed, before)
	}
}

// TestBadEventDeadLetter: under dead-letter the bad row goes to the
// dead-letter topic with an error header, and later events still arrive.
func TestBadEventDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dlq := e.prefix + ".dead-letter"
	s := e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)
	e.waitStreaming()
	ctx := testenv.Context(t)
	var badID string
	err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('not a topic!', 'a1', 'Oops', '{"x": 1}') RETURNING id::text`).Scan(&badID)
	if err != nil {
		t.Fatal(err)
	}
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 20, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, time.Minute); v.missing != 0 {
		t.Fatalf("events after the bad one: %s", v)
	}

	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fetches := cl.PollRecords(pctx, 1)
	if err := fetches.Err(); err != nil {
		t.Fatalf("read the dead-letter topic: %v", err)
	}
	r := fetches.Records()[0]
	if header(r, "id") != badID || !strings.Contains(header(r, "error"), "topic") ||
		!strings.Contains(string(r.Value), `"aggregate_type":"not a topic!"`) {
		t.Fatalf("dead-letter record: headers %v value %s", r.Headers, r.Value)
	}
	s.stop()
}
