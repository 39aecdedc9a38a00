package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestSIGKILLCycles: 20 SIGKILLs at random moments while 4 writers commit
// 100,000 events in transactions of 1 to 50 rows. Nothing is missing, the
// first deliveries keep per-aggregate order, and the duplicates stay within
// what can be in flight at each kill.
func TestSIGKILLCycles(t *testing.T) {
	t.Parallel()
	const cycles, inflight = 20, 2000
	e := newEnv(t)
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	first := e.start()
	e.waitStreaming()
	first.kill()

	writing := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() { writing <- wl.write(ctx, w, 25000, []int{1, 5, 20, 50}[w], "payment", false) }()
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for cycle := 0; cycle < cycles; cycle++ {
		s := e.start("--max-inflight-events", strconv.Itoa(inflight))
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the kill's moment, not a wait for a condition
		s.kill()
	}
	for w := 0; w < 4; w++ {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	s := e.start()
	v, _ := wl.verify([]string{"payment"}, 5*time.Minute)
	t.Logf("verifier after %d SIGKILL cycles: %s", cycles, v)
	if v.expected != 100000 || v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
	if v.duplicates > cycles*inflight {
		t.Fatalf("%d duplicates: more than %d kills × %d in flight", v.duplicates, cycles, inflight)
	}
	s.stop()
}

// TestPostgresCrashUnderLoad: PostgreSQL is SIGKILLed (crash recovery on
// restart) and then restarted with a fast shutdown, while writers keep
// committing. The streamer reconnects each time; nothing is lost. The
// writers (transactions of 1, 11 and 21 rows) go on until both faults are
// past, however fast the machine: writers that could finish before a
// fault would leave the progress it waits for unreachable.
//
// Not parallel: it kills the server every test shares.
func TestPostgresCrashUnderLoad(t *testing.T) {
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	ctx, stop := context.WithCancel(testenv.Context(t))
	defer stop()
	writing := make(chan error, 3)
	for w := 0; w < 3; w++ {
		go func() {
			for ctx.Err() == nil {
				if err := wl.writeThroughFaults(ctx, w, 50, 1+w*10, "payment"); err != nil && ctx.Err() == nil {
					writing <- err
					return
				}
			}
			writing <- nil
		}()
	}
	// Each fault at a point of progress, not of time: while the writers
	// commit and the streamer streams, whatever the machine's speed.
	wl.progress(t, 100)
	testenv.ControlPostgres(t, "kill")
	testenv.ControlPostgres(t, "start")
	e.waitStreaming()
	wl.progress(t, 100)
	testenv.ControlPostgres(t, "restart")
	e.waitStreaming()
	wl.progress(t, 100)
	stop()
	for w := 0; w < 3; w++ {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	// A transaction whose COMMIT the stop interrupted may have committed
	// unrecorded: the table is the truth.
	wl.expectTable()
	wl.check([]string{"payment"}, "across a PostgreSQL crash and a restart")
	s.stop()
}

// TestHugeTransaction: one transaction of 1,000,000 outbox rows arrives
// whole, and the streamer's peak RSS stays under 256 MiB, because reading
// pauses while too much is in flight.
func TestHugeTransaction(t *testing.T) {
	t.Parallel()
	const rows = 1_000_000
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	testenv.Exec(t, e.url, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'huge', 'agg-' || (g %% 1000), 'Bulk', jsonb_build_object('seq', g, 'pad', repeat('x', 100))
		FROM generate_series(1, %d) g`, rows))
	end := e.currentLSN()

	adm := kadm.NewClient(testenv.KafkaClient(t))
	var total int64
	eventually(t, 5*time.Minute, "a million records in the topic", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		offsets, err := adm.ListEndOffsets(ctx, e.topic("huge"))
		if err != nil {
			return false
		}
		total = 0
		offsets.Each(func(o kadm.ListedOffset) { total += o.Offset })
		return total >= rows
	})
	eventually(t, time.Minute, "the slot to confirm the transaction", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= end
	})
	peak := peakRSS(t, s.cmd.Process.Pid)
	t.Logf("1,000,000-row transaction: %d records, streamer peak RSS %d MiB", total, peak>>20)
	if total != rows {
		t.Errorf("%d records in the topic, want %d (a restart-free run sends each once)", total, rows)
	}
	if peak >= 256<<20 {
		t.Errorf("peak RSS %d MiB, want under 256 MiB", peak>>20)
	}
	s.stop()
}

// peakRSS reads VmHWM of a process, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestSlotDroppedWhileRunning: the slot is dropped under a running
// streamer. It must not create a new one (that would skip every change in
// between); it stops with an error that says what happened and what to do.
func TestSlotDroppedWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	testenv.TerminateAndDropSlot(t, e.url, e.slot)
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 after its slot was dropped")
	}
	log := s.logText()
	if !strings.Contains(log, "dropped while cdc-outbox ran") {
		t.Fatalf("the error does not explain the dropped slot:\n%s", log)
	}
	var slots int
	if err := e.pool.QueryRow(testenv.Context(t), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Fatal("the streamer re-created the dropped slot")
	}
}

// TestDroppedSlotIsNotRecreatedSilently: after the slot cdc-outbox created
// is dropped, the next start refuses to create it again (that would skip
// every change since) until --recreate-slot says so.
func TestDroppedSlotIsNotRecreatedSilently(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	s.stop()
	testenv.DropSlot(t, e.url, e.slot)

	s = e.start()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 with its slot gone")
	}
	if log := s.logText(); !strings.Contains(log, "--recreate-slot") || !strings.Contains(log, "would skip every change") {
		t.Fatalf("the error does not explain the missing slot:\n%s", log)
	}
	s = e.start("--recreate-slot")
	e.waitStreaming()
	if !strings.Contains(s.logText(), "re-created the replication slot") {
		t.Fatalf("no warning that changes were skipped:\n%s", s.logText())
	}
	s.stop()
}
