package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// emptyTransactions is a procedure committing n transactions that reach
// the streamer with no outbox row: each emits a transactional logical
// decoding message, which the stream carries (Begin, Message, Commit) and
// the streamer passes over, like an insert into another table of a shared
// publication (or, before PostgreSQL 15, any writing transaction). A
// procedure commits server-side, about 100,000 a second here.
const emptyTransactions = `CREATE PROCEDURE empty_transactions(n int) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		PERFORM pg_logical_emit_message(true, 'load', '');
		COMMIT;
	END LOOP;
END $$`

// TestMemoryBoundedWhileKafkaPaused: with the broker paused and one event
// in flight, a million transactions without outbox rows commit. Reading
// does not pause (one event is far below --max-inflight-events), so each
// of them reaches the checkpoint behind the waiting event; the streamer's
// peak RSS must stay within 64 MiB, and once the broker is back every
// event arrives and the slot confirms past the last transaction.
//
// Not parallel: it pauses the broker every test shares.
func TestMemoryBoundedWhileKafkaPaused(t *testing.T) {
	const transactions = 1_000_000
	e := newEnv(t)
	ctx := testenv.Context(t)
	testenv.Exec(t, e.url, emptyTransactions)
	createTopic(t, e.topic("payment"), nil)
	waitLeader(t, e.topic("payment"))
	s := e.start()
	e.waitStreaming()
	addr := s.httpAddr()
	wl := newWorkload(e)
	wl.prime(ctx)

	resume := brokerFault(t, "pause", "resume")
	if err := wl.write(ctx, 1, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	testenv.Exec(t, e.url, "CALL empty_transactions($1)", transactions)
	t.Logf("%d transactions without outbox rows committed in %s", transactions, time.Since(began).Round(time.Millisecond))
	// A second event after them: once it is in flight, the streamer has
	// read every transaction before it.
	if err := wl.write(ctx, 2, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	end := e.currentLSN()
	// How long reading a million transactions takes depends on the CPU the
	// streamer and the walsender get (half a minute on an idle machine,
	// minutes with both cores saturated), so the deadline is on progress:
	// transactions received, counted by the receive latency histogram.
	received, lastMoved := -1.0, time.Now()
	eventually(t, 15*time.Minute, "the streamer to read up to the second event (2 in flight)", func() bool {
		m := scrape(t, addr)
		if n := m["cdc_outbox_receive_latency_seconds_count"]; n != received {
			received, lastMoved = n, time.Now()
		}
		if time.Since(lastMoved) > time.Minute {
			t.Fatalf("no transaction received for a minute; %.0f so far, %v in flight", received, m["cdc_outbox_inflight_events"])
		}
		return m["cdc_outbox_inflight_events"] == 2
	})
	peak := peakRSS(t, s.cmd.Process.Pid)
	t.Logf("read %d transactions behind a paused broker in %s; streamer peak RSS %.1f MiB",
		transactions, time.Since(began).Round(time.Millisecond), float64(peak)/(1<<20))
	resume()

	wl.check([]string{"payment"}, "after the broker pause")
	eventually(t, time.Minute, "the slot to confirm past the last transaction", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= end
	})
	if peak > 64<<20 {
		t.Errorf("peak RSS %.1f MiB, want at most 64 MiB", float64(peak)/(1<<20))
	}
	s.stop()
	// Paused this long, the broker lost its session with the controller;
	// leave it serving new topics again for the tests that follow.
	probe := testenv.Name("probe")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(testenv.KafkaClient(t)).DeleteTopics(ctx, probe)
	})
	eventually(t, 2*time.Minute, "the broker to serve a new topic after the pause", func() bool {
		adm := kadm.NewClient(testenv.KafkaClient(t))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = adm.CreateTopic(ctx, 1, 1, nil, probe)
		return hasLeader(ctx, adm, probe)
	})
}

// waitLeader waits until topic's partition has a leader: right after a
// broker pause the broker may not host a new topic's partition yet, and a
// producer gives up on a partition it is told is unknown.
func waitLeader(t *testing.T, topic string) {
	t.Helper()
	adm := kadm.NewClient(testenv.KafkaClient(t))
	eventually(t, 2*time.Minute, "topic "+topic+" to have a leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hasLeader(ctx, adm, topic)
	})
}

func hasLeader(ctx context.Context, adm *kadm.Client, topic string) bool {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return false
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return false
	}
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// TestShutdownWithKafkaPausedIsNoBadEvent: SIGTERM while the broker is
// paused with events in flight. After --shutdown-timeout the producer is
// closed and fails those records with a closed-client error: that is a
// shutdown, not a bad event. The streamer exits 0, logs no bad event or
// refusal, and the next start delivers the events.
//
// Not parallel: it pauses the broker every test shares.
func TestShutdownWithKafkaPausedIsNoBadEvent(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	createTopic(t, e.topic("payment"), nil)
	waitLeader(t, e.topic("payment"))
	s := e.start("--shutdown-timeout", "1s")
	e.waitStreaming()
	addr := s.httpAddr()
	wl := newWorkload(e)
	wl.prime(ctx)

	resume := brokerFault(t, "pause", "resume")
	if err := wl.write(ctx, 1, 20, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the events to be in flight", func() bool {
		return scrape(t, addr)["cdc_outbox_inflight_events"] == 20
	})
	s.stop()
	log := s.logText()
	for _, bad := range []string{"bad event", "refused", `"level":"ERROR"`} {
		if strings.Contains(log, bad) {
			t.Fatalf("shutdown with Kafka paused logged %q:\n%s", bad, log)
		}
	}
	if !strings.Contains(log, "records still in flight will be sent again on the next start") {
		t.Fatalf("no word of the records left in flight:\n%s", log)
	}
	resume()
	// The paused broker may still append what was sent to it before the
	// pause; the new start sends the unconfirmed events again either way.
	s = e.start()
	e.waitStreaming()
	wl.check([]string{"payment"}, "after a shutdown with the broker paused")
	s.stop()
}
