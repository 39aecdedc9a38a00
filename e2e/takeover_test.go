package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// slotWatch polls a slot's confirmed_flush_lsn every 10 ms until stopped and
// records every time it went backwards, and every time the walsender that
// holds it had been told a flush position below the highest
// confirmed_flush_lsn seen before (pg_stat_replication's flush_lsn is what
// the client sent, which the server may refuse to move the slot back to:
// recent minor releases ignore a position below the slot's).
type slotWatch struct {
	stop    func() // stops the poll and waits for it
	mu      sync.Mutex
	samples int
	highest pglogrepl.LSN
	back    []string // "from -> to" of each decrease
}

func (e *env) watchSlot() *slotWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &slotWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var lsn, sent pglogrepl.LSN
			err := e.pool.QueryRow(ctx, `SELECT coalesce(s.confirmed_flush_lsn, '0/0'), coalesce(r.flush_lsn, '0/0')
				FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, e.slot).Scan(&lsn, &sent)
			if err != nil {
				continue // stopping, or the server is busy: the next sample counts
			}
			w.mu.Lock()
			w.samples++
			if lsn < w.highest {
				w.back = append(w.back, fmt.Sprintf("confirmed_flush_lsn %s -> %s", w.highest, lsn))
			}
			if sent != 0 && sent < w.highest {
				w.back = append(w.back, fmt.Sprintf("flush_lsn sent %s after confirmed_flush_lsn %s", sent, w.highest))
			}
			w.highest = max(w.highest, lsn)
			w.mu.Unlock()
		}
	}()
	w.stop = func() { cancel(); <-done }
	return w
}

// TestTakeoverNeverMovesTheSlotBack: a hot standby started early, so its
// own position is the slot's of long before, takes over the slot from an
// instance SIGKILLed under writers. Polled every 10 ms from before the
// standby starts to the end, the slot's confirmed_flush_lsn never
// decreases: the standby's first status update says at least the slot's
// position, read after acquiring it. Nothing is missing.
func TestTakeoverNeverMovesTheSlotBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	active := e.start()
	e.waitStreaming()
	watch := e.watchSlot()
	defer watch.stop()
	standby := e.start()
	eventually(t, 30*time.Second, "the standby to report the slot in use", func() bool {
		return standby.logged("in use by another process")
	})
	stopWriters := wl.steady(ctx, 10*time.Millisecond)
	defer stopWriters()
	wl.progress(t, 1500)
	before, _ := e.slotLSNs()
	active.kill()
	eventually(t, 30*time.Second, "the standby to take over", func() bool { return standby.sessions() == 1 })
	wl.progress(t, 1500)
	stopWriters()
	wl.check([]string{"payment"}, "across the takeover")
	_, end := e.slotLSNs()
	e.waitConfirmed(end, time.Minute, time.Now())
	watch.stop()
	watch.mu.Lock()
	defer watch.mu.Unlock()
	t.Logf("slot polled %d times; confirmed_flush_lsn at %s when the active instance was killed, %s at the end; backwards %d times",
		watch.samples, pglogrepl.LSN(before), watch.highest, len(watch.back))
	if len(watch.back) != 0 {
		t.Fatalf("the slot's position went backwards: %v", watch.back)
	}
	standby.stop()
}
