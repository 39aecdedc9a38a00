package e2e

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// Network faults between the streamer and its servers, made by a TCP proxy
// of the test's own (testenv.Proxy): a cut resets every connection, a
// blackhole keeps them open and forwards nothing, the silent network only
// timeouts detect. The writers connect to PostgreSQL directly and keep
// committing through the fault; only the streamer's connections cross the
// proxy.

// TestPostgresNetworkCut resets the streamer's PostgreSQL connections three
// times under load: it reconnects each time, from the confirmed position,
// and nothing is lost.
func TestPostgresNetworkCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	proxy := postgresProxy(t, e)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	stop := wl.steady(ctx, 20*time.Millisecond)
	for cut := 1; cut <= 3; cut++ {
		wl.progress(t, 200)
		lsn, sessions := e.currentLSN(), s.sessions()
		conns := proxy.Cut()
		at := time.Now()
		eventually(t, time.Minute, "the streamer to stream again after the cut", func() bool { return s.sessions() > sessions })
		streaming := time.Since(at)
		caughtUp := e.waitConfirmed(lsn, 2*time.Minute, at)
		t.Logf("cut %d (%d connections reset): streaming again %s after it, everything committed before it confirmed after %s",
			cut, conns, streaming.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	}
	stop()
	wl.check([]string{"payment"}, "across 3 PostgreSQL connection cuts")
	s.stop()
}

// TestPostgresNetworkBlackhole makes the streamer's PostgreSQL connection
// silent for longer than the walsender's and the streamer's timeouts. The
// streamer must notice by itself (a read with no answer would otherwise
// wait for as long as TCP retransmits, a quarter of an hour), keep trying,
// and stream again soon after the network heals; nothing is lost.
func TestPostgresNetworkBlackhole(t *testing.T) {
	t.Parallel()
	const silence = 12 * time.Second
	e := newEnv(t)
	ctx := testenv.Context(t)
	// The server ends the silent walsender after 5s, freeing the slot for
	// the streamer's next connection.
	e.walSenderTimeout("5s")
	proxy := postgresProxy(t, e)
	s := e.start("--receive-timeout", "4s", "--keepalive-interval", "1s")
	e.waitStreaming()
	wl := newWorkload(e)
	stop := wl.steady(ctx, 20*time.Millisecond)
	wl.progress(t, 200)

	sessions := s.sessions()
	proxy.Blackhole()
	at := time.Now()
	eventually(t, time.Minute, "the streamer to give the silent connection up", func() bool {
		return strings.Contains(s.logText(), "stopped answering on the replication connection")
	})
	detected := time.Since(at)
	for time.Since(at) < silence { // the fault's length, not a wait for a condition
		time.Sleep(100 * time.Millisecond)
	}
	if s.sessions() != sessions {
		t.Fatal("the streamer streamed through the blackhole")
	}
	lsn := e.currentLSN()
	proxy.Restore()
	restored := time.Now()
	eventually(t, time.Minute, "the streamer to stream again after the blackhole", func() bool { return s.sessions() > sessions })
	streaming := time.Since(restored)
	caughtUp := e.waitConfirmed(lsn, 2*time.Minute, restored)
	t.Logf("PostgreSQL blackhole of %s: the streamer gave the connection up %s after it began (--receive-timeout 4s); "+
		"after restore, streaming again in %s, everything committed before it confirmed in %s",
		silence, detected.Round(time.Millisecond), streaming.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	stop()
	wl.check([]string{"payment"}, "across a PostgreSQL blackhole")
	s.stop()
}

// TestKafkaNetworkCut resets the streamer's Kafka connections five times
// under load, produce requests in flight: the producer reconnects and
// retries, nothing is lost, and the verifier reports what was repeated.
//
// Not parallel: one proxy at a time can listen on the broker's PROXIED
// address.
func TestKafkaNetworkCut(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	proxy := kafkaProxy(t, e)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	if proxy.Conns() == 0 {
		t.Fatal("the streamer reached Kafka without the proxy")
	}
	stop := wl.steady(ctx, 5*time.Millisecond)
	for cut := 1; cut <= 5; cut++ {
		wl.progress(t, 500)
		lsn := e.currentLSN()
		conns := proxy.Cut()
		at := time.Now()
		caughtUp := e.waitConfirmed(lsn, 2*time.Minute, at)
		t.Logf("cut %d (%d connections reset): everything committed before it acknowledged and confirmed %s after it",
			cut, conns, caughtUp.Round(time.Millisecond))
	}
	stop()
	wl.check([]string{"payment"}, "across 5 Kafka connection cuts")
	s.stop()
}

// TestKafkaNetworkBlackhole makes the streamer's Kafka connections silent
// for 25s, longer than the producer's own deadline for a produce response
// (franz-go: the 10s produce request timeout plus the 10s request timeout
// overhead), with at most 5 events in flight and the walsender's timeout cut
// to 2s. Reading pauses, but status updates keep the replication
// connection alive; the slot never confirms past an event Kafka has not
// acknowledged; readiness reports Kafka unreachable (a metadata request
// that is really sent, not answered from the client's cache); after the
// network heals everything arrives.
//
// Not parallel: one proxy at a time can listen on the broker's PROXIED
// address.
func TestKafkaNetworkBlackhole(t *testing.T) {
	const silence = 25 * time.Second
	e := newEnv(t)
	ctx := testenv.Context(t)
	e.walSenderTimeout("2s")
	proxy := kafkaProxy(t, e)
	s := e.start("--max-inflight-events", "5", "--keepalive-interval", "500ms")
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	stop := wl.steady(ctx, 50*time.Millisecond)
	wl.progress(t, 100)

	proxy.Blackhole()
	at := time.Now()
	// Committed after the blackhole began, this transaction can only be
	// acknowledged after it ends; it ends at or before firstUnacked.
	if err := wl.write(ctx, 9, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	firstUnacked := e.currentLSN()
	var noticed time.Duration
	for time.Since(at) < silence { // the fault's length; the slot is checked throughout
		if confirmed, _ := e.slotLSNs(); confirmed >= firstUnacked {
			t.Fatalf("Kafka silent, yet the slot confirmed %d, past a transaction it cannot have acknowledged (ends by %d)", confirmed, firstUnacked)
		}
		if noticed == 0 && strings.Contains(s.logText(), "Kafka does not answer") {
			noticed = time.Since(at)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if noticed == 0 {
		t.Fatalf("the streamer did not report Kafka unreachable during a %s blackhole:\n%s", silence, s.logText())
	}
	lsn := e.currentLSN()
	proxy.Restore()
	restored := time.Now()
	first := e.waitConfirmed(firstUnacked, 2*time.Minute, restored)
	eventually(t, time.Minute, "the streamer to report Kafka reachable again", func() bool {
		return strings.Contains(s.logText(), "Kafka answers again")
	})
	reachable := time.Since(restored)
	caughtUp := e.waitConfirmed(lsn, 2*time.Minute, restored)
	t.Logf("Kafka blackhole of %s: reported unreachable %s after it began; after restore, the first event of the blackhole confirmed in %s, "+
		"reported reachable in %s, everything committed before the restore confirmed in %s (at most 5 in flight)",
		silence, noticed.Round(time.Millisecond), first.Round(time.Millisecond), reachable.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	stop()
	wl.check([]string{"payment"}, "across a Kafka blackhole")
	if log := s.logText(); strings.Contains(log, "replication connection lost") {
		t.Fatalf("the replication connection dropped while Kafka was silent:\n%s", log)
	}
	s.stop()
}

// postgresProxy puts a proxy between the streamer and PostgreSQL: e.runURL,
// which the streamer is given, goes through it from now on; the test's pool
// stays direct.
func postgresProxy(t *testing.T, e *env) *testenv.Proxy {
	t.Helper()
	u, err := url.Parse(e.runURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProxy(t, "127.0.0.1:0", u.Host)
	u.Host = p.Addr()
	e.runURL = u.String()
	return p
}

// kafkaProxy puts a proxy on the broker's PROXIED address, where the broker
// sends the clients bootstrapped there, and points the streamer at it; the
// verifier reads from the broker directly.
func kafkaProxy(t *testing.T, e *env) *testenv.Proxy {
	t.Helper()
	addr := testenv.KafkaProxiedBrokers(t)
	p := testenv.NewProxy(t, addr, testenv.KafkaProxiedTarget(t))
	e.brokers = []string{addr}
	return p
}

// steady starts two writers that commit until stopped, one transaction
// each per pause: one of 1 event, one of 10. The returned function stops
// them and fails the test if one failed.
func (wl *workload) steady(ctx context.Context, pause time.Duration) (stop func()) {
	done := make(chan struct{})
	errs := make(chan error, 2)
	for w, size := range map[int]int{1: 1, 2: 10} {
		go func() {
			for {
				if err := wl.write(ctx, w, size, size, "payment", false); err != nil {
					errs <- err
					return
				}
				select {
				case <-done:
					errs <- nil
					return
				case <-time.After(pause):
				}
			}
		}()
	}
	stopped := false
	return func() {
		wl.e.t.Helper()
		if stopped {
			return
		}
		stopped = true
		close(done)
		for range 2 {
			if err := <-errs; err != nil {
				wl.e.t.Fatalf("writer: %v", err)
			}
		}
	}
}

// written is how many events the workload has committed.
func (wl *workload) written() int {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return len(wl.events)
}

// progress waits until n more events are committed.
func (wl *workload) progress(t *testing.T, n int) {
	t.Helper()
	want := wl.written() + n
	eventually(t, time.Minute, "the writers to commit more events", func() bool { return wl.written() >= want })
}

// waitConfirmed waits until the slot has confirmed lsn and returns the time
// since from.
func (e *env) waitConfirmed(lsn int64, timeout time.Duration, from time.Time) time.Duration {
	e.t.Helper()
	eventually(e.t, timeout, "the slot to confirm the position", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= lsn
	})
	return time.Since(from)
}

// sessions counts the replication sessions the streamer started.
func (s *streamer) sessions() int { return strings.Count(s.logText(), `"msg":"streaming"`) }
