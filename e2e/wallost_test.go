package e2e

import (
	"errors"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// walLostCluster is a PostgreSQL of the test's own that keeps at most 1 MB
// of WAL for a slot: any slot whose restart_lsn is in an older segment than
// the current one is unreserved at once and lost at the next checkpoint.
func walLostCluster(t *testing.T) *env {
	t.Helper()
	c := testenv.Cluster(t, testenv.ClusterOptions{Config: []string{"max_slot_wal_keep_size = '1MB'"}})
	return newEnvAt(t, c.URL)
}

// switchWAL writes a little WAL and moves the server to a new segment, so
// the slot's restart_lsn is in an older segment than the current one.
func (e *env) switchWAL() {
	e.t.Helper()
	testenv.Exec(e.t, e.url, `CREATE TABLE IF NOT EXISTS filler (x text);
		INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 100);
		SELECT pg_switch_wal()`)
}

// slotWALStatus is the slot's wal_status as the server says it.
func (e *env) slotWALStatus() string {
	e.t.Helper()
	var status string
	err := e.pool.QueryRow(testenv.Context(e.t), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&status)
	if err != nil {
		e.t.Fatalf("read wal_status of slot %s: %v", e.slot, err)
	}
	return status
}

// loseSlot makes the slot lose its WAL: a segment switch, then checkpoints
// until PostgreSQL has invalidated the slot.
func (e *env) loseSlot() {
	e.t.Helper()
	e.switchWAL()
	eventually(e.t, time.Minute, "the slot's wal_status to become lost", func() bool {
		testenv.Exec(e.t, e.url, `CHECKPOINT`)
		if e.slotWALStatus() == "lost" {
			return true
		}
		e.switchWAL()
		return false
	})
}

// TestWALLostWhileStopped: the streamer is stopped, events are committed,
// and the slot loses the WAL holding them (max_slot_wal_keep_size). The
// next start must not stream on as if nothing happened: it exits with an
// error that says the slot lost WAL, that those events are skipped, and
// how to recover. --recreate-slot then streams what commits afterwards;
// the events of the lost WAL stay missing, which is what the error said.
func TestWALLostWhileStopped(t *testing.T) {
	t.Parallel()
	e := walLostCluster(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	before := newWorkload(e)
	before.prime(ctx)
	s.stop()

	lost := newWorkload(e)
	if err := lost.write(ctx, 1, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	e.loseSlot()

	s = e.start()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 on a slot that lost its WAL")
	}
	log := s.logText()
	wants := []string{`lost WAL it still needed (wal_status lost)`, "skipped, not delayed", "re-publish the outbox rows", "--recreate-slot", "max_slot_wal_keep_size"}
	if e.serverMajor() >= 17 {
		wants = append(wants, "(invalidation_reason wal_removed)")
	}
	for _, want := range wants {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}

	// cdc-outbox status agrees: exit 1, verdict wal_lost.
	e.checkStatusLost("wal_removed", "max_slot_wal_keep_size")

	s = e.start("--recreate-slot")
	e.waitStreaming()
	if !strings.Contains(s.logText(), "dropped the replication slot that lost its WAL (--recreate-slot)") {
		t.Errorf("no warning that --recreate-slot skipped events:\n%s", s.logText())
	}
	after := newWorkload(e)
	if err := after.write(ctx, 2, 20, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := after.verify([]string{"payment"}, 2*time.Minute); v.missing != 0 {
		t.Fatalf("after --recreate-slot: %s; missing ids: %v", v, v.missingIDs)
	}
	// Everything the new slot streams is in the topic by now.
	v, _ := lost.verify([]string{"payment"}, 5*time.Second)
	t.Logf("events committed while the slot lost its WAL: %s", v)
	if v.missing != 50 {
		t.Errorf("%d of the 50 events in the lost WAL arrived; want none (the slot could not stream them)", 50-v.missing)
	}
	s.stop()
}

// TestWALLostWhileKafkaDown: the streamer runs but Kafka never answers, so
// it takes the slot only to find that it cannot read the stream's history
// epochs, reads nothing (it must not publish before it knows them), and
// nothing is confirmed: the slot holds WAL from the first event on. The
// slot poller reports the slot's wal_status as it turns unreserved (error
// log, cdc_outbox_slot_wal_status), and when the checkpoint invalidates the
// slot (PostgreSQL ends the walsender for it), the reconnect meets the
// server's refusal to stream from an invalidated slot (its words differ
// between versions; 17+ name the reason in pg_replication_slots) and the
// streamer stops with the same explained error as at start.
func TestWALLostWhileKafkaDown(t *testing.T) {
	t.Parallel()
	e := walLostCluster(t)
	ctx := testenv.Context(t)
	// A port nothing listens on: Kafka is down from the start.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	s := e.start("--kafka-brokers", dead, "--slot-poll-interval", "1s")
	eventually(t, time.Minute, "the streamer to take the slot and wait for the history epochs", func() bool {
		return strings.Contains(s.logText(), "cannot read the stream's history epochs")
	})
	if err := newWorkload(e).write(ctx, 1, 10, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	// The events are not confirmed: the slot stays before them.
	e.switchWAL()
	eventually(t, 30*time.Second, "the slot's wal_status to become unreserved", func() bool {
		if e.slotWALStatus() == "unreserved" {
			return true
		}
		e.switchWAL()
		return false
	})
	addr := s.httpAddr()
	eventually(t, 30*time.Second, "the streamer to report wal_status unreserved", func() bool {
		return strings.Contains(s.logText(), `"level":"ERROR","msg":"the slot holds more WAL than max_slot_wal_keep_size allows`) &&
			scrape(t, addr)[`cdc_outbox_slot_wal_status{status="unreserved"}`] == 1
	})

	e.loseSlot()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 after its slot lost its WAL")
	}
	log := s.logText()
	wants := []string{"lost WAL it still needed (wal_status lost)", "--recreate-slot", "max_slot_wal_keep_size"}
	switch major := e.serverMajor(); {
	case major >= 17: // the reason by name, from pg_replication_slots
		wants = append(wants, "(invalidation_reason wal_removed)")
	default: // the server's own words (14 to 16)
		wants = append(wants, "invalidated because it exceeded the maximum reserved size")
	}
	for _, want := range wants {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}
}

// checkStatusLost runs cdc-outbox status on the invalidated slot: exit 1,
// verdict wal lost, what happened and how to recover; from PostgreSQL 17
// on, the invalidation reason by name.
func (e *env) checkStatusLost(reason, why string) {
	e.t.Helper()
	out, err := exec.Command(binary, "status", "--postgres-url", e.url, "--slot", e.slot).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !regexp.MustCompile(`verdict:\s+wal lost`).Match(out) ||
		!strings.Contains(string(out), "--recreate-slot") || !strings.Contains(string(out), why) {
		e.t.Errorf("cdc-outbox status on the invalidated slot: %v\n%s", err, out)
	}
	if e.serverMajor() >= 17 && !regexp.MustCompile(`invalidation_reason:\s+`+reason).Match(out) {
		e.t.Errorf("cdc-outbox status does not name the invalidation reason %s:\n%s", reason, out)
	}
}

// TestSlotInvalidatedWhileIdle (PostgreSQL 18+): a slot left inactive
// longer than idle_replication_slot_timeout is invalidated at the next
// checkpoint, and the WAL it held goes. The next start stops with an error
// that names the reason (invalidation_reason idle_timeout), what it costs
// and what prevents it; cdc-outbox status says the same. --recreate-slot
// then streams what commits afterwards.
func TestSlotInvalidatedWhileIdle(t *testing.T) {
	t.Parallel()
	// The test's cluster is of the shared server's version; an older one
	// would refuse to start with the setting.
	if major := testenv.ServerMajor(t, testenv.PostgresURL(t)); major < 18 {
		t.Skipf("PostgreSQL %d has no idle_replication_slot_timeout (18+); make test runs this on 18", major)
	}
	c := testenv.Cluster(t, testenv.ClusterOptions{Config: []string{"idle_replication_slot_timeout = '1s'"}})
	e := newEnvAt(t, c.URL)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()
	newWorkload(e).prime(ctx)
	s.stop()
	e.waitSlotInactive()
	if err := newWorkload(e).write(ctx, 1, 10, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "a checkpoint to invalidate the idle slot", func() bool {
		testenv.Exec(t, e.url, `CHECKPOINT`)
		var reason string
		err := e.pool.QueryRow(ctx, `SELECT coalesce(invalidation_reason, '') FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&reason)
		if err != nil {
			t.Fatalf("read invalidation_reason: %v", err)
		}
		return reason == "idle_timeout"
	})

	s = e.start()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 on an invalidated slot")
	}
	log := s.logText()
	for _, want := range []string{"(invalidation_reason idle_timeout)", "inactive longer than idle_replication_slot_timeout",
		"skipped, not delayed", "--recreate-slot", "raise idle_replication_slot_timeout"} {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}
	e.checkStatusLost("idle_timeout", "idle_replication_slot_timeout")

	s = e.start("--recreate-slot")
	e.waitStreaming()
	after := newWorkload(e)
	if err := after.write(ctx, 2, 20, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	after.check([]string{"payment"}, "after --recreate-slot")
	s.stop()
}
