package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// Headers cdc-outbox sets that the consumer dedupes by.
const (
	HeaderEventID = "id"     // the event id, unique within its source
	HeaderSource  = "source" // the outbox the event comes from (cdc-outbox --source); absent from older streamers
)

// Headers of a dead-letter record, besides all the original record's
// headers (HeaderEventID and HeaderSource among them). Key and value are
// the original's.
const (
	HeaderOriginalTopic     = "original_topic"     // where the record was consumed
	HeaderOriginalPartition = "original_partition" // decimal
	HeaderOriginalOffset    = "original_offset"    // decimal
	HeaderOriginalTimestamp = "original_timestamp" // RFC 3339, UTC
	HeaderConsumerGroup     = "consumer_group"     // the group that gave up on it
	HeaderError             = "error"              // the last error, at most 4 KiB
	HeaderAttempts          = "attempts"           // decimal; 0 for a record without id, which is never tried
)

const (
	// insertProcessed is the dedupe: a conflict means the group already
	// processed the event (same source, same id).
	insertProcessed = `INSERT INTO processed_events (consumer_group, source, event_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`
	// commitTimeout bounds an offset commit, including the last one after
	// Run's context was cancelled.
	commitTimeout = 30 * time.Second
	// txEndTimeout bounds a transaction's commit or rollback, which run
	// even after Run's context was cancelled.
	txEndTimeout = 10 * time.Second
	// maxErrorHeader bounds the error header of a dead-letter record.
	maxErrorHeader = 4096
)

// Consumer processes the records of a consumer group effectively once. Use
// it from one goroutine: New, Run once, Close.
type Consumer struct {
	cfg       Config
	cl        *kgo.Client
	hooks     Hooks
	log       *slog.Logger
	ran       atomic.Bool
	closeOnce sync.Once
}

// New checks cfg and creates the Kafka client, which starts joining the
// group in the background; records are fetched and processed only by Run.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var hooks Hooks = noHooks{}
	if cfg.Hooks != nil {
		hooks = cfg.Hooks
	}
	log := cfg.Logger.With("group", cfg.Group)
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(kslog.New(log.With("component", "kafka"))),
		// Records of aborted Kafka transactions are never handled: with
		// cdc-outbox's exactly-once delivery they are sent again in a
		// later transaction. Records written without transactions are read
		// as soon as they are (ExtraOpts may say otherwise).
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}
	opts = append(opts, cfg.ExtraOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		// Offsets are committed by Run, only after the database commit.
		kgo.DisableAutoCommit(),
		// See Run: no rebalance while a polled batch is being processed.
		kgo.BlockRebalanceOnPoll(),
	)
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("consume: Kafka client: %w", err)
	}
	if rt, ok := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); ok {
		if budget := retryBudget(cfg.Backoff, cfg.MaxAttempts); budget > rt/2 {
			log.Warn("a record that keeps failing is retried for longer than half the rebalance timeout; meanwhile the group cannot rebalance and this member may be removed from it (harmless, but slow): lower MaxAttempts or Backoff, or raise kgo.RebalanceTimeout",
				"retry_waits", budget, "rebalance_timeout", rt)
		}
	}
	return &Consumer{cfg: cfg, cl: cl, hooks: hooks, log: log}, nil
}

// Close leaves the group (unless InstanceID is set: a static member stays
// until its replacement joins or the session times out) and closes the
// Kafka client. Call it after Run has returned (cancel Run's context to
// stop it); it does not close the DB.
func (c *Consumer) Close() {
	c.closeOnce.Do(c.cl.Close)
}

// Run polls and processes records until ctx is cancelled (it then commits
// the offsets of what was processed and returns nil) or a record stops it
// under the Stop policy (a *RecordError; the offsets of the records
// processed before it are committed, its own is not). Other errors: the
// processed_events table is missing or has no unique key on
// (consumer_group, source, event_id) (apply sql/processed_events.sql,
// which also upgrades an older table), the client was closed, or Kafka
// refused access (grant the consumer READ on the topics and the group).
// Run may be called once per Consumer (ErrRunTwice).
//
// Rebalances: the client is created with kgo.BlockRebalanceOnPoll, so the
// group cannot take partitions away between a poll and the AllowRebalance
// that follows the offset commit of that poll's records. Every record a
// batch finished is therefore committed while this member still owns its
// partition, by this member, before any other member can start on it; no
// OnPartitionsRevoked bookkeeping is needed, and a commit can never rewind
// another member's. The price is that a rebalance waits for the batch in
// hand (MaxPollRecords records, with retries): if that outlasts the
// group's rebalance timeout the member is removed, its commit fails
// (counted, logged) and the next owner gets those records again; their
// processed_events rows make it skip them. A record whose transaction had
// not committed is simply processed by the next owner.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	if err := c.checkTable(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.log.Info("consuming", "topics", c.cfg.Topics, "on_failure", c.cfg.OnFailure.String(),
		"dead_letter_topic", c.cfg.DeadLetterTopic, "max_attempts", c.cfg.MaxAttempts)
	for {
		fetches := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			return errors.New("consume: client closed during Run")
		}
		if ctx.Err() != nil {
			// Records polled together with the cancellation are neither
			// processed nor committed: the next consumer gets them.
			c.cl.AllowRebalance()
			return nil
		}
		if err := c.fetchErrors(fetches); err != nil {
			c.cl.AllowRebalance()
			return err
		}
		done, err := c.process(ctx, fetches)
		c.commit(ctx, done)
		c.cl.AllowRebalance()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return nil
			}
			return err
		}
	}
}

// fetchErrors logs the errors franz-go reports with a poll (it retries
// what can be retried itself) and returns those no retry will fix.
func (c *Consumer) fetchErrors(fetches kgo.Fetches) error {
	var fatal error
	fetches.EachError(func(topic string, partition int32, err error) {
		switch {
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed):
			if fatal == nil {
				fatal = fmt.Errorf("consume: fetch topic %s partition %d: %w", topic, partition, err)
			}
		default:
			c.log.Warn("fetch error; the Kafka client retries", "topic", topic, "partition", partition, "error", err)
		}
	})
	return fatal
}

// process handles a poll's records, partition after partition and in
// offset order within one, and returns the last finished record of each
// partition it touched. It stops at the first record it cannot finish:
// nothing after that record may be committed.
func (c *Consumer) process(ctx context.Context, fetches kgo.Fetches) ([]*kgo.Record, error) {
	var parts []kgo.FetchTopicPartition
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			parts = append(parts, p)
		}
	})
	var done []*kgo.Record
	for _, p := range parts {
		var last *kgo.Record
		for _, r := range p.Records {
			if err := c.handle(ctx, r); err != nil {
				if last != nil {
					done = append(done, last)
				}
				return done, err
			}
			last = r
		}
		done = append(done, last)
	}
	return done, nil
}

// commit commits the offsets after done's records, even when ctx is
// cancelled: their transactions have committed. A failure is logged and
// counted, not returned: it only means redeliveries, which dedupe absorbs,
// and retrying it later could rewind the commit of a member that owns the
// partition by then.
func (c *Consumer) commit(ctx context.Context, done []*kgo.Record) {
	if len(done) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := c.cl.CommitRecords(cctx, done...); err != nil {
		c.hooks.Observe(Observation{Outcome: CommitFailed, Group: c.cfg.Group, Err: err})
		c.log.Warn("offset commit failed; those records will be redelivered and skipped as duplicates", "error", err)
		return
	}
	if c.log.Enabled(ctx, slog.LevelDebug) {
		for _, r := range done {
			c.log.Debug("offset committed", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset+1)
		}
	}
}

// dedupeKey identifies an event: its source and its id.
type dedupeKey struct{ source, id string }

// handle finishes one record: processed, skipped as a duplicate, or
// dead-lettered (nil), or not (an error; ctx's error when cancelled).
func (c *Consumer) handle(ctx context.Context, r *kgo.Record) error {
	ev, ok := eventKey(r)
	if !ok {
		return c.giveUp(ctx, r, ev, StageEventID, 0, ErrMissingEventID)
	}
	for attempt := 1; ; attempt++ {
		stage, err := c.attempt(ctx, ev, r)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err() // stopping is not a failure of the record
		}
		c.hooks.Observe(Observation{Outcome: Failed, Group: c.cfg.Group, Record: r, Source: ev.source, EventID: ev.id,
			Stage: stage, Attempt: attempt, Err: err})
		c.log.Warn("processing failed", "source", ev.source, "event_id", ev.id, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
			"stage", string(stage), "attempt", attempt, "max_attempts", c.cfg.MaxAttempts, "error", err)
		if attempt >= c.cfg.MaxAttempts {
			if stage == StageDatabase || errors.Is(err, ErrUnavailable) {
				// An outage, of the database or of something the handler
				// needs, must not dead-letter healthy events.
				return c.recordError(r, ev, stage, attempt, err)
			}
			return c.giveUp(ctx, r, ev, stage, attempt, err)
		}
		if err := sleep(ctx, backoff(c.cfg.Backoff, attempt)); err != nil {
			return err
		}
	}
}

// attempt is one transaction: dedupe row, handler, commit. It returns the
// stage that failed.
func (c *Consumer) attempt(ctx context.Context, ev dedupeKey, r *kgo.Record) (Stage, error) {
	tx, err := c.cfg.DB.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return StageDatabase, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		// A no-op after Commit. Not bound to ctx, so that a cancelled
		// context still ends the transaction cleanly.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txEndTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	tag, err := tx.Exec(ctx, insertProcessed, c.cfg.Group, ev.source, ev.id)
	if err != nil {
		return StageDatabase, fmt.Errorf("insert into processed_events: %w", err)
	}
	if tag.RowsAffected() == 0 {
		c.hooks.Observe(Observation{Outcome: Duplicate, Group: c.cfg.Group, Record: r, Source: ev.source, EventID: ev.id})
		c.log.Debug("duplicate skipped", "source", ev.source, "event_id", ev.id, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
		return "", nil
	}
	if err := c.cfg.Handler(ctx, tx, r); err != nil {
		return StageHandler, err
	}
	// The work is done: finish it even if ctx is cancelled now, rather than
	// leave the commit's outcome unknown (the record would be redelivered
	// and, had it committed, skipped).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txEndTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return StageDatabase, fmt.Errorf("commit: %w", err)
	}
	c.hooks.Observe(Observation{Outcome: Processed, Group: c.cfg.Group, Record: r, Source: ev.source, EventID: ev.id})
	return "", nil
}

// giveUp applies OnFailure to a record that cannot be processed.
func (c *Consumer) giveUp(ctx context.Context, r *kgo.Record, ev dedupeKey, stage Stage, attempts int, cause error) error {
	if c.cfg.OnFailure != DeadLetter {
		return c.recordError(r, ev, stage, attempts, cause)
	}
	dl := deadLetter(r, c.cfg.DeadLetterTopic, c.cfg.Group, attempts, cause)
	if err := c.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.recordError(r, ev, StageDeadLetter, attempts,
			fmt.Errorf("publish to dead-letter topic %s: %w (the record had failed with: %v)", c.cfg.DeadLetterTopic, err, cause))
	}
	// Recorded as processed once the broker has the dead-letter record, so
	// that a redelivery is skipped as a duplicate instead of being tried and
	// dead-lettered again. A crash before this insert can dead-letter the
	// record twice (same id header): the dead-letter topic is at least once.
	// A record without a usable id or source (StageEventID) is not recorded:
	// under whatever key it were, it could pass for another event.
	if stage != StageEventID {
		tag, err := c.cfg.DB.Exec(ctx, insertProcessed, c.cfg.Group, ev.source, ev.id)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return c.recordError(r, ev, StageDeadLetter, attempts,
				fmt.Errorf("the record is in dead-letter topic %s, but recording it in processed_events failed: %w", c.cfg.DeadLetterTopic, err))
		}
		if tag.RowsAffected() == 0 {
			c.log.Warn("dead-lettered an event that another member processed meanwhile (during a rebalance); the dead-letter record is redundant",
				"source", ev.source, "event_id", ev.id, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
		}
	}
	c.hooks.Observe(Observation{Outcome: DeadLettered, Group: c.cfg.Group, Record: r, Source: ev.source, EventID: ev.id,
		Stage: stage, Attempt: attempts, Err: cause})
	c.log.Warn("record sent to the dead-letter topic", "source", ev.source, "event_id", ev.id, "topic", r.Topic, "partition", r.Partition,
		"offset", r.Offset, "dead_letter_topic", c.cfg.DeadLetterTopic, "stage", string(stage), "attempts", attempts, "error", cause)
	return nil
}

func (c *Consumer) recordError(r *kgo.Record, ev dedupeKey, stage Stage, attempts int, cause error) error {
	return &RecordError{
		Group: c.cfg.Group, Source: ev.source, EventID: ev.id,
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Stage: stage, Attempts: attempts, Err: cause,
	}
}

// deadLetter builds the dead-letter record of r: r's key, value and
// headers, plus where it came from and why it failed.
func deadLetter(r *kgo.Record, topic, group string, attempts int, cause error) *kgo.Record {
	msg := cause.Error()
	if len(msg) > maxErrorHeader {
		msg = msg[:maxErrorHeader]
	}
	h := make([]kgo.RecordHeader, 0, len(r.Headers)+7)
	h = append(h, r.Headers...)
	h = append(h,
		kgo.RecordHeader{Key: HeaderOriginalTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderOriginalPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOriginalOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
		kgo.RecordHeader{Key: HeaderOriginalTimestamp, Value: []byte(r.Timestamp.UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: HeaderConsumerGroup, Value: []byte(group)},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
	)
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: h}
}

// eventKey returns the record's source and id headers; ok is false when
// the id is missing or empty, or when either header appears several times
// with different values: the record could then be mistaken for another
// event. A record without a source header (from a streamer that sets none)
// has source "". A CloudEvents record is identified by its id and source
// attributes instead (cloudevents.go).
func eventKey(r *kgo.Record) (ev dedupeKey, ok bool) {
	if ev, ce, ok := cloudEventKey(r); ce {
		return ev, ok
	}
	id, idOK := header(r, HeaderEventID)
	source, sourceOK := header(r, HeaderSource)
	ev = dedupeKey{source: source, id: id}
	return ev, idOK && sourceOK && id != ""
}

// header returns the value of the header key ("" when absent); ok is false
// when several headers named key disagree.
func header(r *kgo.Record, key string) (v string, ok bool) {
	found := false
	for _, h := range r.Headers {
		if h.Key != key {
			continue
		}
		if found && string(h.Value) != v {
			return "", false
		}
		v, found = string(h.Value), true
	}
	return v, true
}

// checkTable makes sure processed_events exists and has a unique key on
// (consumer_group, source, event_id): without one, ON CONFLICT DO NOTHING
// never conflicts and every duplicate would be processed again, silently.
// A table from before sources (keyed on consumer_group and event_id) would
// fail every insert, so it is named as such.
func (c *Consumer) checkTable(ctx context.Context) error {
	var exists, hasSource bool
	var keys int
	err := c.cfg.DB.QueryRow(ctx, `
		SELECT to_regclass('processed_events') IS NOT NULL,
		       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('processed_events') AND attname = 'source' AND NOT attisdropped),
		       (SELECT count(*) FROM pg_index i
		        WHERE i.indrelid = to_regclass('processed_events')
		          AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
		          AND i.indnatts = 3
		          AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text) FROM pg_attribute a
		               WHERE a.attrelid = i.indrelid AND a.attnum IN (i.indkey[0], i.indkey[1], i.indkey[2]))
		              = ARRAY['consumer_group', 'event_id', 'source'])`).Scan(&exists, &hasSource, &keys)
	switch {
	case err != nil:
		return fmt.Errorf("consume: check table processed_events: %w", err)
	case !exists:
		return errors.New("consume: table processed_events does not exist")
	case !hasSource:
		return errors.New("consume: table processed_events has no source column (created before sources)")
	case keys == 0:
		return errors.New("consume: table processed_events has no unique key on (consumer_group, source, event_id)")
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
