package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestSignalWhileStarting: SIGTERM while cdc-outbox is still starting (here
// held up creating its slot, which waits for an open transaction) is a
// clean stop: exit 0, as in a rollout that replaces a pod before it ever
// streamed, not an error that pages someone.
func TestSignalWhileStarting(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	blocker := testenv.Connect(t, e.url)
	if _, err := blocker.Exec(ctx, `BEGIN; SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = blocker.Exec(context.Background(), `ROLLBACK`) })
	s := e.start()
	eventually(t, time.Minute, "the streamer to wait in slot creation", func() bool {
		var waiting bool
		err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE '%pg_create_logical_replication_slot%' AND pid <> pg_backend_pid())`).Scan(&waiting)
		return err == nil && waiting
	})
	s.stop()
	if !strings.Contains(s.logText(), "stopped before streaming") {
		t.Fatalf("no clean stop in the log:\n%s", s.logText())
	}
}
