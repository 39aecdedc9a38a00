package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// lineage keeps the stream's history epochs in the checkpoint topic
// (sink.StreamRecords), in either delivery: the epochs a lost history began
// must be known at every later start, or the new history's events would be
// published again under the lost one's source, where a consumer deduping
// by (source, id) takes them for events it has seen.
type lineage struct {
	admin     sink.Config
	topic     string
	records   *sink.StreamRecords
	stream    string       // the stream's identity: the epochs record's key and origin
	timeline  func() int32 // the server's, for an epoch that does not name it
	lost      interface{ LostHistory() }
	log       *slog.Logger
	mu        sync.Mutex
	epochs    checkpoint.Epochs
	published checkpoint.Published // as load read it (at-least-once)
	known     bool                 // epochs were read (set)
}

// set sets the epochs read at start, the value of the epochs record (with
// the checkpoint in exactly-once delivery, by load in at-least-once), and
// returns them.
func (l *lineage) set(value []byte) (checkpoint.Epochs, error) {
	es, err := checkpoint.DecodeEpochs(value)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic %s, key %s: %w: delete the record (a null value under that key) only if no failover lost a history", l.topic, sink.EpochsKey(l.stream), err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epochs, l.known = es, true
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
// missing topic holds none. Kafka unreachable or refusing within
// loadTimeout gives the connection up (a *lineageUnknown, which the stream
// tries again): nothing is published before the epochs are known, or the
// events of a new history might go out under a lost one's source.
func (l *lineage) load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	cp, err := sink.ReadCheckpoint(ctx, l.admin, l.topic, l.stream, l.stream)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		l.mu.Lock()
		l.epochs, l.published, l.known = nil, checkpoint.Published{}, true
		l.mu.Unlock()
		return nil
	case err != nil:
		return &lineageUnknown{topic: l.topic, err: err}
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

// lineageUnknown: the stream's epochs could not be read when it took the
// slot. The stream gives the connection up and tries again.
type lineageUnknown struct {
	topic string
	err   error
}

func (e *lineageUnknown) Error() string {
	return fmt.Sprintf("cannot read the stream's history epochs from checkpoint topic %s before streaming (nothing is published until they are known, "+
		"so that no new event goes out under the source of a lost history): %v; check that Kafka is reachable and that this user may Read, Write and Create the topic; "+
		"trying again", e.topic, e.err)
}

func (e *lineageUnknown) Unwrap() error { return e.err }

// Retry has the stream give the connection up and try again.
func (e *lineageUnknown) Retry() bool { return true }

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
// publishedEvery while it streams and moves on, until ctx ends. Only a
// position read while the stream streams on one timeline throughout is
// written: after a connection is lost, a promoted standby's timeline must
// not be written with positions read on the old primary. A write that
// fails is a WARN (once until one succeeds): the record is for the next
// start, the stream does not wait on it.
func (l *lineage) watch(ctx context.Context, st *replication.Stream, at func() checkpoint.Published) {
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
		tl := st.Timeline()
		if !st.Connected() {
			continue
		}
		p := at()
		p.Timeline = tl
		if !st.Connected() || st.Timeline() != tl || p == last || p.End == 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := l.records.Write(wctx, sink.PublishedKey(l.stream), p.Encode())
		cancel()
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
	if !l.known {
		// The start could not read them (Kafka was away): a new epoch
		// must not take a number an earlier one has.
		cp, err := sink.ReadCheckpoint(ctx, l.admin, l.topic, l.stream, l.stream)
		if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("read the stream's history epochs before recording a new one: %w; start cdc-outbox again once the broker answers", err)
		}
		if l.epochs, err = checkpoint.DecodeEpochs(cp.Epochs); err != nil {
			return nil, err
		}
		l.known = true
	}
	es, got, changed := l.epochs.Begin(e)
	if changed {
		if err := l.records.Write(ctx, sink.EpochsKey(l.stream), es.Encode()); err != nil {
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
