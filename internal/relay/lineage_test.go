package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
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

// recordsInMemory is a Store of one stream's records; down makes every
// call fail, missing answers as a topic that does not exist.
type recordsInMemory struct {
	mu            sync.Mutex
	values        map[string][]byte
	down, missing bool
	writes        int
}

func (m *recordsInMemory) Read(_ context.Context, key, _ string) (sink.Checkpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.down:
		return sink.Checkpoint{}, errors.New("broker unreachable")
	case m.missing:
		return sink.Checkpoint{}, kerr.UnknownTopicOrPartition
	}
	return sink.Checkpoint{Epochs: m.values[sink.EpochsKey(key)], Published: m.values[sink.PublishedKey(key)]}, nil
}

func (m *recordsInMemory) Write(_ context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return errors.New("broker unreachable")
	}
	if m.values == nil {
		m.values = map[string][]byte{}
	}
	m.values[key] = value
	m.writes++
	return nil
}

type lostCount struct{ n int }

func (l *lostCount) LostHistory() { l.n++ }

func newLineage(store Store) (*lineage, *lostCount) {
	lost := &lostCount{}
	return &lineage{store: store, topic: "checkpoints", stream: "7301/5/slot", timeline: func() int32 { return 2 },
		lost: lost, log: slog.New(slog.DiscardHandler)}, lost
}

// TestLineageLoadAtEveryTaking: the epochs another instance recorded after
// this one last read them are read when the slot is taken again; a store
// that does not answer is a retry, never a stream that goes on without
// them; a topic that does not exist holds none.
func TestLineageLoadAtEveryTaking(t *testing.T) {
	store := &recordsInMemory{}
	l, _ := newLineage(store)
	ctx := context.Background()
	if err := l.load(ctx); err != nil || len(l.epochs) != 0 {
		t.Fatalf("load of an empty store: %v, %d epochs", err, len(l.epochs))
	}
	other, _ := newLineage(store)
	if _, err := other.Begin(checkpoint.Epoch{Timeline: 2, From: 0x500, LostTimeline: 1, LostFrom: 0x500, LostTo: 0x900, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := l.load(ctx); err != nil || len(l.epochs) != 1 || l.epochs[0].N != 1 {
		t.Fatalf("load after another instance recorded an epoch: %v, epochs %v", err, l.epochs)
	}
	store.down = true
	err := l.load(ctx)
	var unknown *LineageUnknownError
	if !errors.As(err, &unknown) || !unknown.Retry() {
		t.Fatalf("load with the store away: %v, want a *LineageUnknownError to retry", err)
	}
	store.down, store.missing = false, true
	if err := l.load(ctx); err != nil || len(l.epochs) != 0 {
		t.Fatalf("load with no topic: %v, %d epochs", err, len(l.epochs))
	}
}

// TestLineageStopped: the lost history a stopped stream found is recorded
// as the start that finds it next would record it, so both give it one
// number.
func TestLineageStopped(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		err   error
		again checkpoint.Epoch // what a later start finds of the same loss
	}{
		{"failover past the fork", &replication.ForkError{FromTimeline: 1, ToTimeline: 2, Fork: 0x500, Newest: 0x900},
			checkpoint.Epoch{Timeline: 2, From: 0x500, LostTimeline: 1, LostFrom: 0x500, LostTo: 0x880}},
		{"restored under the stream", &replication.RestoreError{Timeline: 1, Flushed: 0x300, Confirmed: 0x500, Newest: 0x500},
			checkpoint.Epoch{Timeline: 1, LostTimeline: 1, LostTo: 0x500}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &recordsInMemory{}
			l, _ := newLineage(store)
			if err := l.stopped(c.err, 0); err != nil {
				t.Fatal(err)
			}
			next, _ := newLineage(store)
			if err := next.load(ctx); err != nil {
				t.Fatal(err)
			}
			es, err := next.Begin(c.again)
			if err != nil || len(es) != 1 || store.writes != 1 {
				t.Fatalf("found again by the next start: %v, epochs %v, %d writes; want the one epoch, written once", err, es, store.writes)
			}
		})
	}
	l, _ := newLineage(&recordsInMemory{})
	if err := l.stopped(errors.New("anything else"), 0); err != nil || len(l.epochs) != 0 {
		t.Fatalf("another error recorded %v (%v)", l.epochs, err)
	}
}

// TestLineageHoldingFindsWhatWasPublished: the published record of an
// at-least-once stream past the fork of the server's history, or past its
// WAL, begins an epoch; on the server's history it does not.
func TestLineageHoldingFindsWhatWasPublished(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		pub   checkpoint.Published
		h     replication.History
		epoch bool
	}{
		{"on the history", checkpoint.Published{End: 0x400, Timeline: 1}, replication.History{Timeline: 2, Ends: map[int32]pglogrepl.LSN{1: 0x500}, Flushed: 0x900}, false},
		{"past the fork", checkpoint.Published{End: 0x600, Timeline: 1}, replication.History{Timeline: 2, Ends: map[int32]pglogrepl.LSN{1: 0x500}, Flushed: 0x900}, true},
		{"past the WAL", checkpoint.Published{End: 0x600, Timeline: 1}, replication.History{Timeline: 1, Flushed: 0x300}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &recordsInMemory{}
			if err := store.Write(ctx, sink.PublishedKey("7301/5/slot"), c.pub.Encode()); err != nil {
				t.Fatal(err)
			}
			l, lost := newLineage(store)
			if err := l.load(ctx); err != nil {
				t.Fatal(err)
			}
			es, err := l.holding(c.h)
			if err != nil || (len(es) == 1) != c.epoch || (lost.n == 1) != c.epoch {
				t.Fatalf("epochs %v, lost %d, err %v; want an epoch: %v", es, lost.n, err, c.epoch)
			}
		})
	}
}
