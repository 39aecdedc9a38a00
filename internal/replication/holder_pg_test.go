package replication

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestHolderOneOfTwo: of two processes' holders of one stream's shards,
// the second waits while the first holds; when the first's connection is
// lost and the second takes the lock meanwhile, the first's Hold returns
// ErrHolderTaken (its process stops every shard) instead of holding some
// shards beside the second.
func TestHolderOneOfTwo(t *testing.T) {
	url := testenv.Database(t)
	log := slog.New(slog.DiscardHandler)
	ctx := testenv.Context(t)
	first := NewHolder(url, "stream_a", 100*time.Millisecond, log)
	if err := first.Take(ctx); err != nil {
		t.Fatal(err)
	}
	second := NewHolder(url, "stream_a", 100*time.Millisecond, log)
	waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := second.Take(waitCtx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !second.Waiting() {
		t.Fatalf("the second holder's Take = %v (waiting %v) while the first holds, want it waiting", err, second.Waiting())
	}
	// Another stream's lock is another lock.
	other := NewHolder(url, "stream_b", 100*time.Millisecond, log)
	if err := other.Take(ctx); err != nil {
		t.Fatal(err)
	}

	holding := make(chan error, 1)
	go func() { holding <- first.Hold(ctx) }()
	// The first's connection lost: the second takes the lock at once.
	testenv.Exec(t, url, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND objid = (hashtext('stream_a') & 4294967295)::oid`)
	if err := second.Take(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-holding:
		if !errors.Is(err, ErrHolderTaken) {
			t.Fatalf("the first holder's Hold = %v, want ErrHolderTaken", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first holder still holds 30s after the second took the lock")
	}
}
