package e2e

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestSlotCreationBlocked: pg_create_logical_replication_slot waits for
// every transaction running in the cluster. With a forgotten prepared
// transaction, and with a session idle in transaction, the streamer names
// the blocker in its log every 10 s while it waits; stopped while waiting,
// it exits 0 and cancels its own backend so neither it nor the half-made
// slot is left behind; once the blocker ends, the next start creates the slot and
// streams. On a cluster of its own: it needs max_prepared_transactions,
// and no other test's transactions.
func TestSlotCreationBlocked(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t, testenv.ClusterOptions{Config: []string{"max_prepared_transactions = 10"}})
	e := newEnvAt(t, c.URL)
	testenv.Exec(t, e.url, `CREATE TABLE blocker (x int)`)
	ctx := testenv.Context(t)

	for w, tc := range []struct {
		name  string
		block func(conn *pgx.Conn) (blocker string, unblock func())
	}{
		{"prepared transaction", func(conn *pgx.Conn) (string, func()) {
			mustExec(t, conn, `BEGIN; INSERT INTO blocker VALUES (1); PREPARE TRANSACTION 'forgotten'`)
			return `prepared transaction 'forgotten'`, func() { mustExec(t, conn, `ROLLBACK PREPARED 'forgotten'`) }
		}},
		{"idle in transaction", func(conn *pgx.Conn) (string, func()) {
			mustExec(t, conn, `BEGIN; INSERT INTO blocker VALUES (2)`)
			return "pid " + itoa(conn.PgConn().PID()) + " (idle in transaction", func() { mustExec(t, conn, `ROLLBACK`) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocker, unblock := tc.block(testenv.Connect(t, e.url))
			s := e.start()
			eventually(t, 30*time.Second, "the streamer to name "+blocker, func() bool {
				log := strings.ReplaceAll(s.logText(), `\"`, `"`)
				return strings.Contains(log, "creating the replication slot waits") && strings.Contains(log, blocker)
			})
			for _, line := range strings.Split(s.logText(), "\n") {
				if strings.Contains(line, "creating the replication slot waits") {
					t.Logf("waiting: %s", line)
					break
				}
			}
			// A stop while starting is a clean stop, as in a rollout that
			// replaces a pod before it ever streamed: exit 0, not an error
			// that pages someone.
			s.interrupt()
			if err := s.exited(30 * time.Second); err != nil {
				t.Fatalf("stopped while waiting for the slot: %v; want a clean exit\n%s", err, s.logText())
			}
			if !strings.Contains(s.logText(), "stopped before streaming") {
				t.Fatalf("no clean stop in the log:\n%s", s.logText())
			}
			eventually(t, 10*time.Second, "no backend left creating the slot, and no slot", func() bool {
				var left int
				err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_create_logical_replication_slot%' AND pid <> pg_backend_pid())
					+ (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)`, e.slot).Scan(&left)
				return err == nil && left == 0
			})
			if !strings.Contains(s.logText(), "cancelled its backend") {
				t.Fatalf("no word of the cancelled backend:\n%s", s.logText())
			}
			unblock()
			s = e.start()
			e.waitStreaming()
			wl := newWorkload(e)
			if err := wl.write(ctx, w, 5, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			wl.check([]string{"payment"}, "after the blocker ended")
			s.stop()
			// The walsender releases the slot after the streamer exits:
			// drop it once it is inactive.
			eventually(t, 30*time.Second, "the slot to be released and dropped", func() bool {
				_, err := e.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, e.slot)
				var left int
				_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&left)
				return err == nil && left == 0
			})
			testenv.Exec(t, e.url, `COMMENT ON PUBLICATION cdc_outbox IS NULL`)
		})
	}
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// interrupt sends SIGTERM without waiting.
func (s *streamer) interrupt() { _ = s.cmd.Process.Signal(syscall.SIGTERM) }
