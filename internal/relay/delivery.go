package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// Deliveries.
const (
	AtLeastOnce = "at-least-once"
	ExactlyOnce = "exactly-once"
)

// producer is the sink as the relay uses it: the pipeline's producer,
// which the Kafka health check pings.
type producer interface {
	pipeline.Producer
	sink.Pinger
}

// delivery is what differs between the two deliveries: the producer the
// pipeline hands records to, what is read and decided each time the stream
// takes the slot, and what runs beside the stream.
type delivery interface {
	producer() producer
	// holding runs when the stream has taken the slot and knows the
	// server's history h, before it reads anything (replication.Config
	// Holding).
	holding(ctx context.Context, h replication.History) error
	// beside adds to g what runs beside the stream.
	beside(g Group)
	// checkpoint is the Kafka checkpoint's position (exactly-once), 0
	// otherwise.
	checkpoint() pglogrepl.LSN
}

// transactions is the exactly-once producer (sink.Transactional): Kafka
// transactions of whole PostgreSQL transactions with a checkpoint record,
// committed by Run.
type transactions interface {
	producer
	pipeline.Transactional
	// Fence registers the transactional id: the instance before is fenced
	// and its open transaction aborted.
	Fence(ctx context.Context) error
	Checkpoint() pglogrepl.LSN
	SetCheckpoint(lsn pglogrepl.LSN)
	Run(ctx context.Context) error
	CommitNow()
}

// target is what a taking of the slot decides on: the pipeline.
type target interface {
	Verify(m checkpoint.Mark)
	SkipThrough(lsn pglogrepl.LSN)
	SetEpochs(es checkpoint.Epochs)
	Newest() pglogrepl.LSN
	Epoch() int
	HandedOn() pglogrepl.LSN
	Holds(lsn pglogrepl.LSN)
}

// atLeastOnce publishes with the idempotent producer; its recovery is the
// lineage alone: the epochs, and the published record that tells a start
// on a promoted standby (or a restored server) what Kafka holds past its
// WAL.
type atLeastOnce struct {
	sink    producer
	lineage *lineage
	pipe    target
	stream  *replication.Stream
}

func (d *atLeastOnce) producer() producer { return d.sink }

func (d *atLeastOnce) checkpoint() pglogrepl.LSN { return 0 }

// holding reads the lineage at every taking of the slot: whoever held it
// before may have found a lost history and recorded an epoch.
func (d *atLeastOnce) holding(ctx context.Context, h replication.History) error {
	if err := d.lineage.load(ctx); err != nil {
		return err
	}
	es, err := d.lineage.holding(h)
	d.pipe.SetEpochs(es)
	return err
}

func (d *atLeastOnce) beside(g Group) {
	loop(g, "published position", func(ctx context.Context) {
		d.lineage.watch(ctx, d.stream, func() checkpoint.Published {
			return checkpoint.Published{End: d.pipe.HandedOn(), Epoch: d.pipe.Epoch()}
		})
	})
}

// exactlyOnce writes whole PostgreSQL transactions in Kafka transactions
// with a checkpoint record; its recovery is the checkpoint, judged on the
// server's history, and the lineage read with it.
type exactlyOnce struct {
	txp     transactions
	store   Store
	lineage *lineage
	pipe    target
	obs     LineageObserver
	fail    func(error) // stops the stream with the committer's failure
	log     *slog.Logger
	topic   string
	// stream is the stream's identity (replication.StreamIdentity): the
	// checkpoint key and origin; id the transactional id.
	stream, id string
	// slot and legacyOrigin are the former default names: a checkpoint
	// keyed by the slot with the one outbox table's identity as origin.
	slot, legacyOrigin string
	held               bool
}

func (d *exactlyOnce) producer() producer { return d.txp }

func (d *exactlyOnce) checkpoint() pglogrepl.LSN { return d.txp.Checkpoint() }

// beside runs the committer. It stops after the stream, which drains
// through it: its context is not the group's, which a signal ends, but
// ends when the group stops it, once the stream has returned. Its failure
// (fenced, a refused record) stops the stream, whether it streams, drains
// or waits for the slot.
func (d *exactlyOnce) beside(g Group) {
	tctx, stop := context.WithCancel(context.WithoutCancel(g.Context()))
	g.Go("Kafka transactions", func() error {
		// On a signal, what is queued commits at once, not after the
		// transaction interval: the stream's drain waits for it.
		defer context.AfterFunc(g.Context(), d.txp.CommitNow)()
		err := d.txp.Run(tctx)
		if err != nil {
			d.fail(err)
		}
		return err
	}, stop)
}

// holding runs once per process, the first time the stream takes the
// slot: it registers the transactional id (fencing the instance before
// this one and aborting the Kafka transaction it left open; an instance
// that takes the slot later fences this one, which then stops at its next
// commit), then reads the stream's last committed checkpoint and has the
// pipeline skip the transactions before it that PostgreSQL sends again
// from the slot's older position, as far as the checkpoint is proven to be
// on the server's WAL history (checkpoint.Decide): up to the fork when the
// history forked after it, up to the checkpoint once its commit is met
// again (Pipeline.Verify), nothing when it cannot be verified.
func (d *exactlyOnce) holding(ctx context.Context, h replication.History) error {
	if d.held {
		return nil
	}
	d.held = true
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.txp.Fence(ctx); err != nil {
		return err
	}
	cp, err := d.store.Read(ctx, d.stream, d.stream)
	if err != nil {
		return err
	}
	// The epochs are this stream's, whichever checkpoint is read below.
	epochs, err := d.lineage.set(cp.Epochs)
	if err != nil {
		return err
	}
	d.pipe.SetEpochs(epochs)
	if !cp.Found && d.legacyOrigin != "" {
		// The first start after an upgrade from the former default names
		// (the slot's name as key, the table's identity as origin): that
		// checkpoint is this stream's until the first commit under the new
		// key, which then holds a higher position.
		if cp, err = d.store.Read(ctx, d.slot, d.legacyOrigin); err != nil {
			return err
		}
		if cp.Found {
			d.log.Info("exactly-once delivery: read the checkpoint written under the slot's name, the former default key; the next commit writes it under the stream's identity",
				"checkpoint_topic", d.topic, "former_key", d.slot, "key", d.stream, "checkpoint_lsn", cp.LSN)
		}
	}
	if !cp.Found {
		d.log.Info("exactly-once delivery: no checkpoint of this stream in Kafka yet", "transactional_id", d.id, "checkpoint_topic", d.topic, "checkpoint_key", d.stream)
		return nil
	}
	d.txp.SetCheckpoint(cp.LSN)
	return takeCheckpoint(cp, h, d.pipe, d.lineage, d.obs, d.log, "transactional_id", d.id, "checkpoint_topic", d.topic, "checkpoint_key", d.stream)
}

// takeCheckpoint applies what the Kafka checkpoint cp lets the stream
// skip on a server whose history is h (checkpoint.Decide) to p, and
// records the lost history it may reveal. attrs name the checkpoint in the
// log.
func takeCheckpoint(cp sink.Checkpoint, h replication.History, p target, lin *lineage, obs LineageObserver, log *slog.Logger, attrs ...any) error {
	mark := checkpoint.Mark{End: cp.LSN, Timeline: cp.Commit.Timeline, Xid: cp.Commit.Xid, CommitTime: cp.Commit.CommitTime, Epoch: cp.Commit.Epoch, Named: cp.Commit.Named}
	trust := checkpoint.Decide(mark, h.Timeline, h.Ends, h.Flushed)
	lin.mu.Lock()
	recorded := lin.epochs.Lost(mark)
	lin.mu.Unlock()
	if trust.Verify && recorded {
		// A restore lost it, and the server has written that far again.
		trust = checkpoint.Trust{Why: "a history epoch records the checkpoint's history as lost at its position"}
	}
	attrs = append(attrs, "checkpoint_lsn", cp.LSN, "checkpoint_timeline", mark.Timeline, "timeline", h.Timeline,
		"stream_start_lsn", p.Newest(), "server_flushed_lsn", h.Flushed, "written_at", cp.At)
	switch {
	case trust.Verify:
		log.Info("exactly-once delivery: transactions up to the Kafka checkpoint are in Kafka and are skipped if PostgreSQL sends them again, "+
			"once the checkpoint's commit is met on this server's history", attrs...)
		p.Verify(mark)
	case trust.Lost:
		obs.LostHistory()
		log.Warn("lost history: the Kafka checkpoint lies on WAL this server never had: only the transactions up to the fork (if any) are skipped, "+
			"and the events Kafka holds of the WAL from there to the checkpoint are of a history the server does not have; it commits other transactions there, "+
			"and may hand out the same event ids again", append(attrs, "why", trust.Why, "lost_from_lsn", trust.LostFrom, "lost_to_lsn", cp.LSN, "skip_through_lsn", trust.Skip)...)
		p.SkipThrough(trust.Skip)
		// The server's events from the fork on (from the stream's start
		// when the histories part at an unknown place) are a new epoch.
		es, err := lin.Begin(checkpoint.Epoch{Timeline: h.Timeline, From: trust.LostFrom, LostEpoch: cp.Commit.Epoch,
			LostTimeline: mark.Timeline, LostFrom: trust.LostFrom, LostTo: cp.LSN, At: time.Now()})
		if err != nil {
			return err
		}
		p.SetEpochs(es)
	default:
		log.Warn("exactly-once delivery: the Kafka checkpoint cannot be verified on this server's WAL history: nothing is skipped, "+
			"so transactions Kafka holds may be published again", append(attrs, "why", trust.Why)...)
		// Kafka holds events up to it all the same: a server found later
		// with less WAL lost them (Judge).
		p.Holds(cp.LSN)
	}
	return nil
}

// newExactlyOnce makes the exactly-once producer and creates the
// checkpoint topic when missing. Nothing is fenced yet: a standby waiting
// for the slot must not stop the instance that streams.
func newExactlyOnce(ctx context.Context, r *Relay, cfg sink.Config) (*exactlyOnce, *sink.Transactional, error) {
	c := r.cfg
	// The former default names keyed a checkpoint by the slot with the one
	// outbox table's identity as origin; a stream of a list or patterns
	// never wrote one.
	var legacy string
	if len(c.Outboxes) == 1 && !c.Outboxes[0].Pattern.IsGlob() {
		var err error
		if legacy, err = replication.TableIdentity(ctx, c.PostgresURL, c.Outboxes[0].Pattern.Name()); err != nil && !errors.Is(err, replication.ErrNoTable) {
			return nil, nil, fmt.Errorf("read the outbox table's identity for the former Kafka checkpoint: %w", err)
		}
	}
	id := c.TransactionalID
	if id == "" {
		id = DefaultTransactionalID(r.identity)
	}
	txp, err := sink.NewTransactional(sink.TxConfig{
		Config:          cfg,
		TransactionalID: id,
		CheckpointTopic: c.CheckpointTopic,
		CheckpointKey:   r.identity,
		Origin:          r.identity,
		Timeline:        func() int32 { return r.stream.Timeline() },
		Epoch:           func() int { return r.pipe.Epoch() },
		Interval:        c.TransactionInterval,
		CommitRecords:   max(1, c.MaxInflightEvents/2),
		Admin:           c.Admin,
	}, r.obs, r.log)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := sink.EnsureCheckpointTopic(ctx, c.Admin, c.CheckpointTopic); err != nil {
		txp.Close()
		return nil, nil, err
	}
	return &exactlyOnce{txp: txp, store: r.store, lineage: r.lineage, obs: r.obs, log: r.log, topic: c.CheckpointTopic,
		stream: r.identity, id: id, slot: c.Slot, legacyOrigin: legacy}, txp, nil
}

// DefaultTransactionalID is the transactional id of the stream whose
// identity is stream (replication.StreamIdentity, "<system identifier>/
// <database OID>/<slot>"), unless one is given: one stream, one writer, so
// an instance that takes the slot over, on the same server or on a
// promoted standby, fences the one before it, while streams of other
// clusters or databases that keep the default slot name on one Kafka
// cluster never fence each other. The prefix stays "cdc-outbox-", which a
// prefixed ACL can grant.
func DefaultTransactionalID(stream string) string {
	return "cdc-outbox-" + strings.ReplaceAll(stream, "/", "-")
}
