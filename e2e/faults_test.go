package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestStatusUpdatesFlowUnderBackpressure pauses the broker (SIGSTOP: it
// neither answers nor closes sockets) while events arrive, with at most 5
// events in flight and the walsender's timeout cut to 2s. Reading stops,
// but status updates must keep flowing or the server drops the
// connection; after SIGCONT everything arrives.
//
// Not parallel: it pauses the broker every test shares.
func TestStatusUpdatesFlowUnderBackpressure(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	e.walSenderTimeout("2s")
	s := e.start("--max-inflight-events", "5", "--keepalive-interval", "500ms")
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	resume := brokerFault(t, "pause", "resume")
	if err := wl.write(ctx, 1, 200, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // the fault's length (three walsender timeouts), not a wait for a condition
	resume()

	wl.check([]string{"payment"}, "after a 6s broker pause")
	if log := s.logText(); strings.Contains(log, "replication connection lost") {
		t.Fatalf("the replication connection dropped under backpressure:\n%s", log)
	}
	s.stop()
}

// TestReconnectsAfterPostgresRestart restarts PostgreSQL (fast shutdown)
// under a running streamer: it reconnects from the confirmed position and
// nothing is lost.
//
// Not parallel: it restarts the server every test shares.
func TestReconnectsAfterPostgresRestart(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	testenv.ControlPostgres(t, "restart")
	e.pool.Reset() // its connections died with the server
	if err := wl.write(ctx, 1, 300, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "across a PostgreSQL restart")
	if !strings.Contains(s.logText(), "reconnecting") {
		t.Fatalf("no reconnect logged:\n%s", s.logText())
	}
	s.stop()
}

// TestHotStandby: a second instance on the same slot waits while the first
// streams, takes over within 15s after the first is SIGKILLed, and nothing
// is lost.
func TestHotStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	active := e.start()
	e.waitStreaming()
	standby := e.startStandby()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 100, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	active.kill()
	killed := time.Now()
	if err := wl.write(ctx, 1, 100, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the standby to take over", func() bool {
		return strings.Count(standby.logText(), `"msg":"streaming"`) == 1
	})
	t.Logf("standby took over %s after the SIGKILL", time.Since(killed).Round(100*time.Millisecond))
	wl.check([]string{"payment"}, "across the takeover")
	standby.stop()
}

// TestBrokerKilledUnderLoad SIGKILLs the broker while writers commit, then
// starts it again on the same data: records the broker had not made durable
// are produced again by the idempotent producer's retries or, failing that,
// by the unconfirmed position; nothing is missing.
//
// Not parallel: it kills the broker every test shares.
func TestBrokerKilledUnderLoad(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	writing := make(chan error, 2)
	for w := 1; w <= 2; w++ {
		go func() { writing <- wl.write(ctx, w, 1000, 10, "payment", false) }()
	}
	wl.progress(t, 100) // the writers commit while the broker dies
	start := brokerFault(t, "kill", "start")
	for w := 1; w <= 2; w++ {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	start()
	wl.check([]string{"payment"}, "across a broker SIGKILL")
	s.stop()
}
