package sink_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

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

	tp, err := sink.NewTransactional(sink.TxConfig{
		Config:          sink.Config{Brokers: c.ListenAddrs(), Linger: time.Millisecond},
		TransactionalID: "tx", CheckpointTopic: "checkpoints", CheckpointKey: "slot_a", Origin: "1/2/3",
		Interval: time.Hour, CommitRecords: 1000,
	}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tp.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	tp.Produce(&kgo.Record{Topic: "events", Key: []byte("a"), Value: []byte("{}")}, func(*kgo.Record, error) {
		t.Error("a promise was called for a transaction that never committed")
	})
	tp.Boundary(0x100)

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
