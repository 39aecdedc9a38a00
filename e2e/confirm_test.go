package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestNeverConfirmsUnacked stops the broker, writes events, and checks that
// the slot's confirmed_flush_lsn does not pass them; once the broker is back
// the events arrive, and only then the slot moves past them.
//
// Not parallel: it stops the one broker every test shares (make test runs
// packages one at a time, and Go runs parallel tests after this one).
func TestNeverConfirmsUnacked(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	brokerUp := brokerFault(t, "stop", "start")
	if err := wl.write(ctx, 1, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	// The first unacked transaction ends at or before this position.
	firstUnacked := e.currentLSN()
	if err := wl.write(ctx, 1, 99, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if confirmed, _ := e.slotLSNs(); confirmed >= firstUnacked {
			t.Fatalf("broker down, yet the slot confirmed %d, past the first unacknowledged transaction (ends by %d)", confirmed, firstUnacked)
		}
	}

	brokerUp()
	v, _ := wl.verify([]string{"payment"}, 2*time.Minute)
	t.Logf("verifier after the broker outage: %s", v)
	if v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s", v)
	}
	eventually(t, 30*time.Second, "the slot to confirm the events once acknowledged", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= end
	})
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
