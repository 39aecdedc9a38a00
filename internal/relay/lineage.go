package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// Store is where a stream's own records live: the checkpoint topic in
// production (KafkaStore), memory in the simulation of the protocol.
type Store interface {
	// Read returns what the store holds under key: the last checkpoint
	// written with origin (exactly-once), and the stream's epochs and
	// published records. A store that does not exist yet holds nothing
	// (an error that errors.Is kerr.UnknownTopicOrPartition is taken for
	// that).
	Read(ctx context.Context, key, origin string) (sink.Checkpoint, error)
	// Write writes value under key, durably (every in-sync replica),
	// before it returns.
	Write(ctx context.Context, key string, value []byte) error
}

// LineageObserver is told when a lost history is found; metrics implement
// it.
type LineageObserver interface{ LostHistory() }

// lineage keeps the stream's history epochs in its store, in either
// delivery: the epochs a lost history began must be known at every later
// taking of the slot, or the new history's events would be published again
// under the lost one's source, where a consumer deduping by (source, id)
// takes them for events it has seen.
type lineage struct {
	store     Store
	topic     string       // for messages
	stream    string       // the stream's identity: the records' key and origin
	timeline  func() int32 // the server's, for an epoch that does not name it
	lost      LineageObserver
	log       *slog.Logger
	mu        sync.Mutex
	epochs    checkpoint.Epochs
	published checkpoint.Published // as load read it (at-least-once)
	// floor is the published record's position when the stream last took
	// the slot and found it on the server's history: Kafka holds events up
	// to it there, whoever published them, so no published record written
	// after it says less (publish).
	floor pglogrepl.LSN
}

// set sets the epochs read when the slot was taken (the value of the
// epochs record) and returns them.
func (l *lineage) set(value []byte) (checkpoint.Epochs, error) {
	es, err := checkpoint.DecodeEpochs(value)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic %s, key %s: %w: delete the record (a null value under that key) only if no failover lost a history", l.topic, sink.EpochsKey(l.stream), err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epochs = es
	if len(es) > 0 {
		l.log.Info("history epochs: events of transactions committed in a later history carry their source with the epoch's number",
			"epochs", len(es), "last", es[len(es)-1].String(), "checkpoint_topic", l.topic, "epochs_key", sink.EpochsKey(l.stream))
	}
	return es, nil
}

// load reads, in at-least-once delivery, each time the stream takes the
// slot and before it reads anything, the stream's epochs and how far it
// had published (the published record, which watch writes): whoever held
// the slot before, another instance or this one before a lost connection,
// may have recorded a lost history since this process last read them. A
// missing topic holds none. A store that does not answer within
// loadTimeout gives the connection up (a *LineageUnknownError, which the
// stream tries again): nothing is published before the epochs are known,
// or the events of a new history might go out under a lost one's source.
func (l *lineage) load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	cp, err := l.store.Read(ctx, l.stream, l.stream)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		l.mu.Lock()
		l.epochs, l.published = nil, checkpoint.Published{}
		l.mu.Unlock()
		return nil
	case err != nil:
		return &LineageUnknownError{Topic: l.topic, Err: err}
	}
	if _, err := l.set(cp.Epochs); err != nil {
		return err
	}
	pub, err := checkpoint.DecodePublished(cp.Published)
	if err != nil {
		return fmt.Errorf("checkpoint topic %s, key %s: %w: delete the record (a null value under that key)", l.topic, sink.PublishedKey(l.stream), err)
	}
	l.mu.Lock()
	l.published = pub
	l.mu.Unlock()
	return nil
}

// loadTimeout bounds load: well within wal_sender_timeout's default of a
// minute, as load runs while the stream holds the slot and sends nothing.
const loadTimeout = 10 * time.Second

// holding decides, once the stream holds the slot and knows the server's
// history h, whether what the stream had published (load) lies on WAL the
// server does not have (a failover past the fork while no cdc-outbox ran,
// a restore); then that is a lost history, and an epoch begins. It returns
// the epochs.
func (l *lineage) holding(h replication.History) (checkpoint.Epochs, error) {
	l.mu.Lock()
	pub, es := l.published, l.epochs
	l.mu.Unlock()
	lost, from := checkpoint.LostPast(pub, h.Timeline, h.Ends, h.Flushed)
	if !lost {
		l.mu.Lock()
		l.floor = pub.End
		l.mu.Unlock()
		return es, nil
	}
	l.lost.LostHistory()
	l.log.Warn("lost history: the stream had published transactions up to a position on WAL this server does not have "+
		"(a failover past what the standby had received, or a restore): the events Kafka holds of it are of a history the server does not have",
		"published_lsn", pub.End, "published_timeline", pub.Timeline, "published_epoch", pub.Epoch, "timeline", h.Timeline,
		"server_flushed_lsn", h.Flushed, "lost_from_lsn", from)
	return l.Begin(checkpoint.Epoch{Timeline: h.Timeline, From: from, LostEpoch: pub.Epoch, LostTimeline: pub.Timeline,
		LostFrom: from, LostTo: pub.End, At: time.Now()})
}

// publishedEvery is how often watch records how far the stream published.
const publishedEvery = time.Second

// watch records, in at-least-once delivery, how far the stream has handed
// transactions to Kafka and in which epoch (at), with the timeline, every
// publishedEvery while it streams and moves on, until ctx ends (publish).
// A write that fails is a WARN (once until one succeeds): the record is
// for the next start, the stream does not wait on it.
func (l *lineage) watch(ctx context.Context, st streamState, at func() checkpoint.Published) {
	var last checkpoint.Published
	failing := false
	tick := time.NewTicker(publishedEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p, err := l.publish(ctx, st, at, last)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			l.log.Warn("cannot record how far the stream published in the checkpoint topic: a start on a promoted standby may not know of events Kafka holds past its fork; "+
				"grant this user Write and Create on the topic", "checkpoint_topic", l.topic, "error", err)
		case err == nil:
			last, failing = p, false
		}
	}
}

// streamState is what the published record is read with: the stream's
// timeline, and whether it streams (replication.Stream).
type streamState interface {
	Timeline() int32
	Connected() bool
}

// publish writes the published record once: how far the stream has handed
// transactions to Kafka (at), with the timeline, unless it is last, the
// one written before. Only a position read while the stream streams on one
// timeline throughout is written: after a connection is lost, a promoted
// standby's timeline must not be written with positions read on the old
// primary. It never writes a position below floor: a process that starts
// again from the slot's position hands on transactions below what the one
// before it published, and a record that went back would hide the events
// Kafka holds past it from a start on a standby that forked in between.
// It returns what it wrote (last when nothing).
func (l *lineage) publish(ctx context.Context, st streamState, at func() checkpoint.Published, last checkpoint.Published) (checkpoint.Published, error) {
	tl := st.Timeline()
	if !st.Connected() {
		return last, nil
	}
	p := at()
	p.Timeline = tl
	l.mu.Lock()
	p.End = max(p.End, l.floor)
	l.mu.Unlock()
	if !st.Connected() || st.Timeline() != tl || p == last || p.End == 0 {
		return last, nil
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.store.Write(wctx, sink.PublishedKey(l.stream), p.Encode()); err != nil {
		return last, err
	}
	return p, nil
}

// Begin records that the events of e's lost range in Kafka are of a
// history the server does not have (pipeline.Lineage): a new epoch, unless
// one stands for it already.
func (l *lineage) Begin(e checkpoint.Epoch) (checkpoint.Epochs, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Timeline == 0 {
		e.Timeline = l.timeline()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Read again, whether or not they were read when the slot was taken:
	// another process may have recorded one since (this one stops on a
	// lost history it found while another held the slot), and writing
	// this process's copy would erase it; a new epoch must not take a
	// number an earlier one has either.
	cp, err := l.store.Read(ctx, l.stream, l.stream)
	if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("read the stream's history epochs before recording a new one: %w; start cdc-outbox again once the broker answers", err)
	}
	if l.epochs, err = checkpoint.DecodeEpochs(cp.Epochs); err != nil {
		return nil, err
	}
	es, got, changed := l.epochs.Begin(e)
	if changed {
		if err := l.store.Write(ctx, sink.EpochsKey(l.stream), es.Encode()); err != nil {
			return nil, fmt.Errorf("record history epoch %d, which the events of the new history need before any is published (%v): %w; "+
				"nothing of the new history was published or confirmed: start cdc-outbox again once the broker takes writes to %s",
				got.N, got, err, l.topic)
		}
		l.epochs = es
	}
	l.log.Warn("lost history recorded: the events of the new history carry their outbox's source with /epoch-N, so that none shares its source and id "+
		"with an event of the lost history; reconcile the lost range's events, which Kafka holds and the server does not",
		"epoch", got.N, "from_lsn", got.From, "timeline", got.Timeline, "lost_epoch", got.LostEpoch, "lost_timeline", got.LostTimeline,
		"lost_from_lsn", got.LostFrom, "lost_to_lsn", got.LostTo, "checkpoint_topic", l.topic, "epochs_key", sink.EpochsKey(l.stream), "new", changed)
	return es, nil
}

// stopped records the lost history the stream found and stopped on
// before the process exits, so that the restart publishes the server's
// events in the new epoch; epoch is the one the stream published the lost
// events in. A failover past the fork (*replication.ForkError) lost the
// old timeline's WAL from the fork on; a server put back from a backup or
// a snapshot (*replication.RestoreError) lost it from a place not known,
// so the epoch begins at 0, as a start that finds it does (Decide,
// LostPast): the same epoch whichever finds it first.
func (l *lineage) stopped(err error, epoch int) error {
	var (
		fe *replication.ForkError
		re *replication.RestoreError
	)
	switch {
	case errors.As(err, &fe):
		_, err := l.Begin(checkpoint.Epoch{Timeline: fe.ToTimeline, From: fe.Fork, LostEpoch: epoch, LostTimeline: fe.FromTimeline,
			LostFrom: fe.Fork, LostTo: fe.Newest, At: time.Now()})
		return err
	case errors.As(err, &re):
		_, err := l.Begin(checkpoint.Epoch{Timeline: re.Timeline, LostEpoch: epoch, LostTimeline: re.Timeline,
			LostTo: re.Newest, At: time.Now()})
		return err
	}
	return nil
}

// LineageUnknownError: the stream's epochs could not be read when it took
// the slot. The stream gives the connection up and tries again (Retry).
type LineageUnknownError struct {
	Topic string
	Err   error
}

func (e *LineageUnknownError) Error() string {
	return fmt.Sprintf("cannot read the stream's history epochs from checkpoint topic %s before streaming (nothing is published until they are known, "+
		"so that no new event goes out under the source of a lost history): %v; trying again", e.Topic, e.Err)
}

func (e *LineageUnknownError) Unwrap() error { return e.Err }

// Retry has the stream give the connection up and try again.
func (e *LineageUnknownError) Retry() bool { return true }

// KafkaStore is the Store of the checkpoint topic.
type KafkaStore struct {
	admin   sink.Config // the topic's clients: TLS and SASL, not the producer's metrics hooks
	topic   string
	records *sink.StreamRecords
}

// NewKafkaStore makes the store of topic; it connects at its first use.
func NewKafkaStore(admin sink.Config, topic string) (*KafkaStore, error) {
	records, err := sink.NewStreamRecords(admin, topic)
	if err != nil {
		return nil, err
	}
	return &KafkaStore{admin: admin, topic: topic, records: records}, nil
}

// Read reads the topic's records of key (sink.ReadCheckpoint).
func (k *KafkaStore) Read(ctx context.Context, key, origin string) (sink.Checkpoint, error) {
	return sink.ReadCheckpoint(ctx, k.admin, k.topic, key, origin)
}

// Write writes a record of the stream's (sink.StreamRecords).
func (k *KafkaStore) Write(ctx context.Context, key string, value []byte) error {
	return k.records.Write(ctx, key, value)
}

// Close closes the writer's client.
func (k *KafkaStore) Close() { k.records.Close() }
