package relay

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// memStore keeps the stream's records in memory.
type memStore struct{ values map[string][]byte }

func (m *memStore) Read(_ context.Context, key, _ string) (sink.Checkpoint, error) {
	return sink.Checkpoint{Epochs: m.values[sink.EpochsKey(key)], Published: m.values[sink.PublishedKey(key)]}, nil
}

func (m *memStore) Write(_ context.Context, key string, value []byte) error {
	m.values[key] = value
	return nil
}

type streaming struct{}

func (streaming) Timeline() int32 { return 1 }
func (streaming) Connected() bool { return true }

// TestPublishedNeverGoesBack: a process that starts again from the slot's
// position hands on transactions below what the one before it published;
// the published record it writes keeps the position read when it took the
// slot, or a failover to a standby forked in between would not be found
// to have lost the events Kafka holds past it.
func TestPublishedNeverGoesBack(t *testing.T) {
	st := &memStore{values: map[string][]byte{}}
	st.values[sink.PublishedKey("s")] = checkpoint.Published{End: 0x900, Timeline: 1}.Encode()
	l := &lineage{store: st, stream: "s", timeline: func() int32 { return 1 }, lost: silent{}, log: slog.New(slog.DiscardHandler)}
	if err := l.load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.holding(replication.History{Timeline: 1, Flushed: 0x1000}); err != nil {
		t.Fatal(err)
	}
	at := func() checkpoint.Published { return checkpoint.Published{End: 0x400} }
	if _, err := l.publish(context.Background(), streaming{}, at, checkpoint.Published{}); err != nil {
		t.Fatal(err)
	}
	got, err := checkpoint.DecodePublished(st.values[sink.PublishedKey("s")])
	if err != nil || got.End != pglogrepl.LSN(0x900) {
		t.Fatalf("published %+v (%v), want it to stay at 0/900", got, err)
	}
}

// TestBeginKeepsOthersEpochs: a process stopping on a lost history it
// found while another held the slot records it next to the epochs the
// other recorded meanwhile, never over them with its own copy.
func TestBeginKeepsOthersEpochs(t *testing.T) {
	st := &memStore{values: map[string][]byte{}}
	l := &lineage{store: st, stream: "s", timeline: func() int32 { return 1 }, lost: silent{}, log: slog.New(slog.DiscardHandler)}
	if err := l.load(context.Background()); err != nil { // no epochs yet
		t.Fatal(err)
	}
	other := checkpoint.Epochs{{N: 1, Timeline: 1, LostTimeline: 1, LostTo: 0x500}}
	st.values[sink.EpochsKey("s")] = other.Encode()
	es, err := l.Begin(checkpoint.Epoch{Timeline: 2, From: 0x400, LostTimeline: 1, LostFrom: 0x400, LostTo: 0x480})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := checkpoint.DecodeEpochs(st.values[sink.EpochsKey("s")])
	if err != nil || len(es) != 2 || len(stored) != 2 || stored[0].LostTo != 0x500 || stored[1].N != 2 {
		t.Fatalf("epochs %v, stored %v (%v): want the other process's epoch 1 and this one as 2", es, stored, err)
	}
}
