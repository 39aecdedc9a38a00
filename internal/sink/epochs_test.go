package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestReadCheckpointLaterEpochFirst: after a restore, the new history
// goes on at the same timeline below the lost history's positions; its
// checkpoints are of a later history epoch, which makes them the latest
// whatever their LSN. The epochs and published records are read with the
// checkpoint, the last value of each the one returned, and a stream that
// wrote none has none.
func TestReadCheckpointLaterEpochFirst(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkpoints := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	const stream = "1/2/slot_a"
	w, err := sink.NewStreamRecords(cfg, checkpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Write(ctx, sink.EpochsKey(stream), []byte(`{"epochs":[1]}`)); err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.TransactionalID(testenv.Name("txid")))
	commit := func(at sink.Commit) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, sink.CheckpointRecordAt(checkpoints, stream, stream, at)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	commit(sink.Commit{End: 0x900, Timeline: 1, Xid: 90, CommitTime: time.Unix(9, 0)})
	commit(sink.Commit{End: 0x500, Timeline: 1, Xid: 50, CommitTime: time.Unix(10, 0), Epoch: 1})
	commit(sink.Commit{End: 0x700, Timeline: 1, Xid: 70, CommitTime: time.Unix(8, 0)}) // a zombie of the lost history
	for _, r := range []struct{ key, value string }{
		{sink.EpochsKey(stream), `{"epochs":[1,2]}`},
		{sink.PublishedKey(stream), `{"lsn":"0/400"}`},
		{sink.PublishedKey(stream), `{"lsn":"0/600"}`},
	} {
		if err := w.Write(ctx, r.key, []byte(r.value)); err != nil {
			t.Fatal(err)
		}
	}

	cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, stream, stream)
	if err != nil || !cp.Found || cp.LSN != 0x500 || cp.Commit.Epoch != 1 {
		t.Fatalf("checkpoint %+v, %v; want 0/500 of epoch 1", cp, err)
	}
	if string(cp.Epochs) != `{"epochs":[1,2]}` || string(cp.Published) != `{"lsn":"0/600"}` {
		t.Fatalf("epochs record %q, published %q; want the last ones written", cp.Epochs, cp.Published)
	}
	if cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "1/2/slot_b", "1/2/slot_b"); err != nil || cp.Found || cp.Epochs != nil || cp.Published != nil {
		t.Fatalf("a stream that wrote nothing: %+v, %v", cp, err)
	}
}

// TestReadCheckpointMissingTopic: a checkpoint topic that does not exist
// (at-least-once delivery, where only a lost history creates it) is an
// error that says so, which the caller takes for "no epochs", not a
// broker it waits for.
func TestReadCheckpointMissingTopic(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := sink.ReadCheckpoint(ctx, sink.Config{Brokers: testenv.KafkaBrokers(t)}, testenv.Name("absent"), "1/2/slot_a", "1/2/slot_a")
	if !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("err = %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
}
