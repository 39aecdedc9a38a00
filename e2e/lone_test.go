package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestExactlyOnceLoneMessageKilledBeforeTheSlotWasTold: in exactly-once
// delivery a non-transactional outbox message's dead-letter record commits
// in Kafka with a checkpoint at the message, naming the last commit before
// it, and the process is SIGKILLed before its next status update tells the
// slot (status updates 8 s apart make that the likely case, and the test
// counts the cycles where the slot stayed at the named commit). The server
// sends the message again, not the named commit: the restart must take the
// message for the checkpoint's proof, neither write its dead letter a
// second time nor take the next transaction for a history that was lost
// (which would put every later event under /epoch-1). Three cycles.
func TestExactlyOnceLoneMessageKilledBeforeTheSlotWasTold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	dlq := e.prefix + ".dead-letter"
	createTopic(t, dlq, nil) // read before its first record
	flags := []string{"--on-bad-event", "dead-letter", "--dead-letter-topic", dlq,
		"--status-interval", "8s", "--keepalive-interval", "20s", "--receive-timeout", "40s"}
	var logs []string
	hit := 0
	const cycles = 3
	for i := range cycles {
		s := e.eo(flags...)
		e.waitStreaming()
		if err := wl.write(ctx, i, 20, 1, "payment", false); err != nil {
			t.Fatal(err)
		}
		wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("cycle %d", i))
		// The slot told of the last commit: the one the checkpoint at the
		// message will name.
		end := pglogrepl.LSN(e.currentLSN())
		eventually(t, time.Minute, "the slot to be confirmed up to "+end.String(), func() bool {
			c, _ := e.slotLSNs()
			return pglogrepl.LSN(c) >= end
		})
		id := fmt.Sprintf("lone-%d", i)
		var at string
		if err := e.pool.QueryRow(ctx, `SELECT pg_logical_emit_message(false, 'cdc_outbox', $1)::text`, `{"v":1,"id":"`+id+`"}`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the dead-letter record of "+id+" in a committed Kafka transaction", func() bool {
			return committedRecords(t, dlq)[id] == 1
		})
		s.kill()
		logs = append(logs, s.logText())
		msg, _ := pglogrepl.ParseLSN(at)
		if c, _ := e.slotLSNs(); pglogrepl.LSN(c) < msg {
			hit++
		}
	}
	s := e.eo(flags...)
	e.waitStreaming()
	if err := wl.write(ctx, cycles, 20, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "after the cycles")
	dead := committedRecords(t, dlq)
	t.Logf("%d of %d cycles SIGKILLed with the slot before the message's checkpoint; dead letters %v", hit, cycles, dead)
	if hit == 0 {
		t.Fatalf("no cycle was killed before the slot was told of the message: the case is not tested (status updates came within the kill)")
	}
	for i := range cycles {
		if n := dead[fmt.Sprintf("lone-%d", i)]; n != 1 {
			t.Errorf("the dead-letter record of lone-%d is in Kafka %d times, want once", i, n)
		}
	}
	logs = append(logs, s.logText())
	for i, log := range logs {
		for _, w := range []string{"lost history", "is not on this server's WAL history"} {
			if strings.Contains(log, w) {
				t.Errorf("run %d says %q: a history that was not lost:\n%s", i, w, tailOf(log, 3000))
			}
		}
	}
	if n := metricValue(t, s, "cdc_outbox_history_epoch"); n != 0 {
		t.Fatalf("cdc_outbox_history_epoch = %v, want 0: nothing was lost", n)
	}
	s.stop()
}
