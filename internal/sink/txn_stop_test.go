package sink_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// TestTransactionalStoppedMidCommitAborts (kfake): Run stopped while its
// Kafka transaction's records are still unanswered (the broker holds the
// produce request) ends that transaction with an abort, on a context of
// its own. Aborted on Run's context, which has ended, the abort never
// reached the broker: the transaction stayed open, holding back the last
// stable offset of its partitions until the broker's transaction timeout.
// No promise is called: nothing of it may be confirmed.
func TestTransactionalStoppedMidCommitAborts(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events", "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	held := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		// The transaction's first produce request waits until the test
		// releases it; then the cluster answers it as usual.
		once.Do(func() {
			close(held)
			c.SleepControl(func() { <-release })
		})
		return nil, nil, false
	})
	ends := make(chan bool, 10) // EndTxn's commit flag, as the broker receives it
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		ends <- req.(*kmsg.EndTxnRequest).Commit
		return nil, nil, false
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tp := fencedOn(ctx, t, c)
	tp.Produce(&kgo.Record{Topic: "events", Key: []byte("a"), Value: []byte("{}")}, func(*kgo.Record, error) {
		t.Error("a promise was called for a transaction that never committed")
	})
	tp.Boundary(0x100, 1, time.Now())

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tp.Run(runCtx) }()
	tp.CommitNow()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the transaction's records never reached the broker")
	}
	stop()
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run stopped with %v, want nil", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after its context ended")
	}
	select {
	case commit := <-ends:
		if commit {
			t.Fatal("the interrupted transaction was committed")
		}
	default:
		t.Fatal("the interrupted transaction was neither committed nor aborted: it is left open")
	}
}

// TestTransactionalUnconfirmedCommitSettled (kfake): the broker's answer
// to the commit leaves its outcome unknown, as a connection that fails
// while the commit is asked does (the broker restarting). Run does not stop: it aborts what is left of
// the transaction, reads the checkpoint topic to learn that the commit was
// not made, and writes the records again in a new transaction, which
// commits. Before, such a commit stopped the stream ("unable to dial"),
// and a broker restart under exactly-once delivery left every later event
// undelivered until cdc-outbox was started again.
func TestTransactionalUnconfirmedCommitSettled(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events", "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	var commits, dropped int
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !req.(*kmsg.EndTxnRequest).Commit {
			return nil, nil, false
		}
		mu.Lock()
		defer mu.Unlock()
		commits++
		if dropped == 0 {
			// The first commit is not made, and its answer says nothing
			// sure: UNKNOWN_SERVER_ERROR, which franz-go returns as an
			// unknown outcome, as it does a connection that failed under
			// the request.
			dropped++
			resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = kerr.UnknownServerError.Code
			return resp, nil, true
		}
		return nil, nil, false
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tp := fencedOn(ctx, t, c)
	acked := make(chan error, 2)
	tp.Produce(&kgo.Record{Topic: "events", Key: []byte("a"), Value: []byte("{}")}, func(_ *kgo.Record, err error) { acked <- err })
	tp.Boundary(0x100, 1, time.Now())

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tp.Run(runCtx) }()
	tp.CommitNow()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("the record's promise: %v", err)
		}
	case err := <-done:
		t.Fatalf("Run stopped with %v: an unconfirmed commit must be settled, not fatal", err)
	case <-ctx.Done():
		t.Fatal("the record was never acknowledged")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	if commits != 2 {
		t.Errorf("%d commits asked, want 2: the lost one and the one of the records written again", commits)
	}
	mu.Unlock()

	// A read_committed consumer sees the record once: the first
	// transaction was aborted, the second committed.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := 0
	for seen == 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no committed record of the transaction written again")
		}
		fs.EachRecord(func(*kgo.Record) { seen++ })
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	cl.PollFetches(pctx).EachRecord(func(*kgo.Record) { seen++ })
	if seen != 1 {
		t.Fatalf("%d committed records, want 1", seen)
	}
	cp, err := sink.ReadCheckpoint(ctx, sink.Config{Brokers: c.ListenAddrs()}, "checkpoints", "slot_a", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x100 {
		t.Fatalf("checkpoint: %+v, %v; want 0/100", cp, err)
	}
}

// fencedOn is a transactional producer on the kfake cluster c, fenced
// (registered) and closed at cleanup, that commits only when told
// (CommitNow): its Interval is an hour.
func fencedOn(ctx context.Context, t *testing.T, c *kfake.Cluster) *sink.Transactional {
	t.Helper()
	tp, err := sink.NewTransactional(sink.TxConfig{
		Config:          sink.Config{Brokers: c.ListenAddrs(), Linger: time.Millisecond},
		TransactionalID: "tx", CheckpointTopic: "checkpoints", CheckpointKey: "slot_a", Origin: "1/2/3",
		Interval: time.Hour, CommitRecords: 1000,
	}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Close)
	if err := tp.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	return tp
}
