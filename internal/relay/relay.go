package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// Outbox is one configured outbox of a stream: a table or a pattern of
// table names, and how its rows become records. An empty Mapping.Source is
// each table's identity.
type Outbox struct {
	Pattern pgname.Pattern
	Mapping mapping.Config
	// OnBadEvent is the outbox's own bad-event policy; empty: the
	// stream's (Config.OnBadEvent).
	OnBadEvent string
	// Encoder writes its record values in a schema registry's format; nil
	// for the payload as it is.
	Encoder pipeline.Encoder
}

// Config is one stream: where it reads, what, how it publishes and
// recovers. The command fills it from its flags; its values are checked
// there, before anything connects.
type Config struct {
	PostgresURL string
	Slot        string
	Publication string
	// What the start may create or re-create (replication.Setup).
	CreatePublication, CreateSlot, RecreateSlot, SlotFailover bool

	// Outboxes, in order: a table two match is the first's.
	Outboxes []Outbox
	// MessagePrefix marks outbox messages (pg_logical_emit_message); empty:
	// none.
	MessagePrefix string

	OnBadEvent        string // pipeline.Fail or pipeline.DeadLetter
	DeadLetterTopic   string
	MaxInflightEvents int
	MaxInflightBytes  int64
	MaxRecordBytes    int

	StatusInterval, KeepaliveInterval, ReceiveTimeout, ShutdownTimeout time.Duration
	SlotPollInterval                                                   time.Duration

	// Delivery is AtLeastOnce or ExactlyOnce.
	Delivery string
	// Kafka is the producer's client configuration (its MaxBufferedRecords
	// is set here from the in-flight limit); Admin the clients of the
	// checkpoint topic (TLS and SASL, no metrics hooks).
	Kafka, Admin sink.Config
	// CheckpointTopic holds the stream's own records: the epochs and, in
	// at-least-once delivery, the published record; in exactly-once, the
	// checkpoints.
	CheckpointTopic string
	// TransactionalID is exactly-once's; empty: DefaultTransactionalID.
	TransactionalID     string
	TransactionInterval time.Duration

	// Explain renders an error with what to do (the command's advice),
	// where the stream speaks itself: a dead-letter record's error
	// header, the Kafka health check.
	Explain func(error) string
	// Tracer follows each event in a span (nil: none).
	Tracer pipeline.Tracer
	// StartAttrs end the stream's "starting" line (the command's: how it
	// reaches Kafka, TLS and SASL).
	StartAttrs []any

	// Shards splits the stream over this many slots (Shards, shards.go);
	// 0 or 1: one slot. Shard is the one a Relay streams, set by NewShards.
	Shards int
	Shard  shard.Shard
	// ShardObserver is the observer of the relay of the shard streaming
	// slot (NewShards); nil: each is told what its obs is.
	ShardObserver func(slot string) Observer
	// ShardKafkaOpts replace Kafka.Opts for the producers of the shards
	// after the first: without the hooks that register a client's
	// metrics, which a registry takes once.
	ShardKafkaOpts []kgo.Opt
}

// Observer is told what happens to the stream; metrics implement it.
type Observer interface {
	pipeline.Observer
	replication.SlotObserver
	sink.HealthObserver
	sink.TxObserver
}

// Group runs the stream's parts beside each other: the command's run group.
// Parts added later are stopped first.
type Group interface {
	// Go runs execute until interrupt makes it return; an error stops
	// every part.
	Go(name string, execute func() error, interrupt func())
	// Close adds a resource the parts added after it use, closed by stop.
	Close(stop func())
	// Context ends when the group stops.
	Context() context.Context
}

// Relay is one stream, assembled.
type Relay struct {
	cfg      Config
	obs      Observer
	log      *slog.Logger
	prepared replication.Prepared
	start    pglogrepl.LSN
	found    []decoder.Outbox
	identity string // replication.StreamIdentity: the records' key and origin
	store    *KafkaStore
	lineage  *lineage
	tracker  *checkpoint.Tracker
	pipe     *pipeline.Pipeline
	stream   *replication.Stream
	monitor  *replication.Monitor
	health   *sink.Health
	delivery delivery
}

// catalogTimeout bounds one catalog lookup from the replication loop, which
// sends no status update meanwhile: well below the default
// wal_sender_timeout (60 s).
const catalogTimeout = 10 * time.Second

// New prepares the server (publication, slot), reads the outboxes and the
// stream's identity, and assembles the data path, adding its resources and
// the parts that run beside the stream to g (they start now; the stream
// starts with Run).
//
// A shard's relay (cfg.Shard) streams the shard's own publication and slot
// (shard.Shard.Name of the stream's), and in exactly-once delivery a given
// transactional id gets the shard's suffix: each shard has its own
// position, checkpoint (keyed by its slot) and producer.
func New(ctx context.Context, cfg Config, g Group, obs Observer, log *slog.Logger) (*Relay, error) {
	streamSlot, streamPublication := cfg.Slot, cfg.Publication
	cfg.Slot, cfg.Publication = cfg.Shard.Name(cfg.Slot), cfg.Shard.Name(cfg.Publication)
	if cfg.TransactionalID != "" && cfg.Shard.Split() {
		cfg.TransactionalID = fmt.Sprintf("%s-shard-%d-of-%d", cfg.TransactionalID, cfg.Shard.Index, cfg.Shard.Count)
	}
	r := &Relay{cfg: cfg, obs: obs, log: log}
	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	prepared, err := replication.Prepare(setupCtx, cfg.PostgresURL, replication.Setup{
		Outboxes:          r.patterns(),
		Publication:       cfg.Publication,
		Slot:              cfg.Slot,
		CreatePublication: cfg.CreatePublication,
		CreateSlot:        cfg.CreateSlot,
		RecreateSlot:      cfg.RecreateSlot,
		Failover:          cfg.SlotFailover,
		Shard:             cfg.Shard,
		StreamSlot:        streamSlot,
		StreamPublication: streamPublication,
		AggregateIDs:      r.aggregateIDs(),
	}, log)
	cancel()
	if err != nil {
		return nil, err
	}
	r.prepared = prepared
	r.start = prepared.Start
	catalog, err := r.openCatalog(ctx)
	if err != nil {
		return nil, err
	}
	g.Close(catalog.Close)
	r.found = catalog.Outboxes()
	msgSource, err := r.messageSource(ctx)
	if err != nil {
		return nil, err
	}
	if r.identity, err = replication.StreamIdentity(ctx, cfg.PostgresURL, cfg.Slot); err != nil {
		return nil, fmt.Errorf("read the stream's identity (the Kafka checkpoint's key): %w", err)
	}
	if r.store, err = NewKafkaStore(cfg.Admin, cfg.CheckpointTopic); err != nil {
		return nil, err
	}
	g.Close(r.store.Close)
	r.lineage = &lineage{store: r.store, topic: cfg.CheckpointTopic, stream: r.identity,
		timeline: func() int32 { return r.stream.Timeline() }, lost: obs, log: log}
	r.tracker = checkpoint.New(r.start)

	kafka := cfg.Kafka
	// Room for everything in flight plus dead-letter records, so Produce
	// never blocks the replication loop.
	kafka.MaxBufferedRecords = 2*cfg.MaxInflightEvents + 1000
	switch cfg.Delivery {
	case ExactlyOnce:
		eo, txp, err := newExactlyOnce(ctx, r, kafka)
		if err != nil {
			return nil, err
		}
		g.Close(txp.Close)
		r.delivery = eo
	default:
		s, err := sink.New(kafka, log)
		if err != nil {
			return nil, err
		}
		g.Close(s.Close)
		r.delivery = &atLeastOnce{sink: s, lineage: r.lineage}
	}
	r.pipe, err = pipeline.New(pipeline.Config{
		Outboxes:          r.mappings(),
		OnBadEvent:        cfg.OnBadEvent,
		OnBadEvents:       r.policies(),
		DeadLetterTopic:   cfg.DeadLetterTopic,
		MessagePrefix:     cfg.MessagePrefix,
		MessageSource:     msgSource,
		MaxInflightEvents: cfg.MaxInflightEvents,
		MaxInflightBytes:  cfg.MaxInflightBytes,
		MaxRecordBytes:    cfg.MaxRecordBytes,
		Explain:           cfg.Explain,
		Tracer:            cfg.Tracer,
		Lineage:           r.lineage,
		Encoders:          r.encoders(),
		Shard:             cfg.Shard,
	}, r.tracker, catalog, r.delivery.producer(), obs, log)
	if err != nil {
		return nil, err
	}
	if err := r.pipe.Known(r.found); err != nil {
		return nil, err
	}
	if err := r.checkContracts(ctx, catalog); err != nil {
		return nil, err
	}
	r.stream = replication.New(replication.Config{
		URL:               cfg.PostgresURL,
		Slot:              cfg.Slot,
		Publication:       cfg.Publication,
		StatusInterval:    cfg.StatusInterval,
		KeepaliveInterval: cfg.KeepaliveInterval,
		ReceiveTimeout:    cfg.ReceiveTimeout,
		ShutdownTimeout:   cfg.ShutdownTimeout,
		Holding:           func(ctx context.Context) error { return r.delivery.holding(ctx, r.stream.History()) },
	}, r.pipe, r.tracker, log)
	switch d := r.delivery.(type) {
	case *exactlyOnce:
		d.pipe, d.fail = r.pipe, r.pipe.Fail
	case *atLeastOnce:
		d.pipe, d.stream = r.pipe, r.stream
	}
	r.monitor = replication.NewMonitor(r.monitorConfig(), obs, log)
	r.health = sink.NewHealth(r.delivery.producer(), obs, cfg.Explain, log)

	r.delivery.beside(g)
	loop(g, "Kafka health check", r.health.Run)
	loop(g, "slot monitor", r.monitor.Run)
	return r, nil
}

// Run streams until ctx ends (a clean stop: nil) or the stream fails. A
// lost history the running stream found (a failover past the fork, a
// server restored under it) is recorded before Run returns, so that the
// restart publishes the server's events in the new epoch.
func (r *Relay) Run(ctx context.Context) error {
	for _, o := range r.pipe.Outboxes() {
		r.log.Info("outbox table", "table", o.Table, "table_oid", o.OID, "source", o.Source)
	}
	if len(r.found) == 0 {
		r.log.Warn("no table matches the outboxes yet: tables that match are streamed once created and in the publication", "outboxes", Describe(r.cfg.Outboxes))
	}
	attrs := []any{"delivery", r.cfg.Delivery, "slot", r.cfg.Slot, "publication", r.cfg.Publication, "start_lsn", r.start, "outboxes", Describe(r.cfg.Outboxes), "tables", len(r.found)}
	if len(r.found) == 1 {
		// One outbox, as before: the table and its source on the line.
		o := r.pipe.Outboxes()[0]
		attrs = append(attrs, "table", o.Table, "table_oid", o.OID, "source", o.Source)
	}
	attrs = append(attrs, "brokers", strings.Join(r.cfg.Kafka.Brokers, ","))
	r.log.Info("starting", append(attrs, r.cfg.StartAttrs...)...)
	err := r.stream.Run(ctx)
	if lerr := r.lineage.stopped(err, r.pipe.Epoch()); lerr != nil {
		return errors.Join(err, lerr)
	}
	return err
}

// Parts are the stream's parts, for metrics and readiness.
type Parts struct {
	Checkpoint *checkpoint.Tracker
	Stream     *replication.Stream
	Pipeline   *pipeline.Pipeline
	Monitor    *replication.Monitor
	Kafka      *sink.Health
}

// Parts returns the stream's parts.
func (r *Relay) Parts() Parts {
	return Parts{Checkpoint: r.tracker, Stream: r.stream, Pipeline: r.pipe, Monitor: r.monitor, Kafka: r.health}
}

// Prepared is what the start did to the publication and the slot.
func (r *Relay) Prepared() replication.Prepared { return r.prepared }

// KafkaCheckpoint is the position of the Kafka checkpoint in exactly-once
// delivery, 0 otherwise.
func (r *Relay) KafkaCheckpoint() pglogrepl.LSN { return r.delivery.checkpoint() }

// loop adds to g a loop that runs until told to stop and never fails.
func loop(g Group, name string, run func(ctx context.Context)) {
	ctx, stop := context.WithCancel(g.Context())
	g.Go(name, func() error { run(ctx); return nil }, stop)
}

// Describe is the outboxes for the log: "svc_a.outbox, tenant_*.outbox".
func Describe(outboxes []Outbox) string {
	var names []string
	for _, o := range outboxes {
		names = append(names, o.Pattern.String())
	}
	return strings.Join(names, ", ")
}

func (r *Relay) patterns() []pgname.Pattern {
	out := make([]pgname.Pattern, len(r.cfg.Outboxes))
	for i, o := range r.cfg.Outboxes {
		out[i] = o.Pattern
	}
	return out
}

// aggregateIDs are each outbox's aggregate id column, which a shard's row
// filter hashes.
func (r *Relay) aggregateIDs() []string {
	out := make([]string, len(r.cfg.Outboxes))
	for i, o := range r.cfg.Outboxes {
		out[i] = o.Mapping.AggregateIDColumn
	}
	return out
}

func (r *Relay) mappings() []mapping.Config {
	out := make([]mapping.Config, len(r.cfg.Outboxes))
	for i, o := range r.cfg.Outboxes {
		out[i] = o.Mapping
	}
	return out
}

func (r *Relay) policies() []string {
	out := make([]string, len(r.cfg.Outboxes))
	for i, o := range r.cfg.Outboxes {
		out[i] = o.OnBadEvent
	}
	return out
}

// encoders are the outboxes' value encoders, nil when none has one.
func (r *Relay) encoders() []pipeline.Encoder {
	var out []pipeline.Encoder
	for i, o := range r.cfg.Outboxes {
		if o.Encoder != nil && out == nil {
			out = make([]pipeline.Encoder, len(r.cfg.Outboxes))
		}
		if out != nil {
			out[i] = o.Encoder
		}
	}
	return out
}

// catalogOutboxes are the outboxes as the catalog matches tables to them.
func (r *Relay) catalogOutboxes() []replication.CatalogOutbox {
	out := make([]replication.CatalogOutbox, len(r.cfg.Outboxes))
	for i, o := range r.cfg.Outboxes {
		m := o.Mapping
		out[i] = replication.CatalogOutbox{Pattern: o.Pattern,
			Required: []string{m.IDColumn, m.AggregateTypeColumn, m.AggregateIDColumn, m.EventTypeColumn, m.PayloadColumn}}
	}
	return out
}

// openCatalog finds the outbox tables for the stream, which asks the
// catalog what each relation it describes is: an outbox is a table its
// entry names now, and from then on that table whatever its name.
func (r *Relay) openCatalog(ctx context.Context) (*replication.Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return replication.OpenCatalog(ctx, replication.CatalogConfig{
		URL:         r.cfg.PostgresURL,
		Outboxes:    r.catalogOutboxes(),
		Publication: r.cfg.Publication,
		Timeout:     catalogTimeout,
	})
}

// messageSource is the source header of the events that come as outbox
// messages, which no table holds: the first outbox's source when it is
// given; for a stream of one table, that table's default (a service that
// moves from rows to messages keeps its source, and the messages' ids,
// UUIDs, never meet the table's); for a list or patterns, of no table in
// particular, "<system identifier>/<database OID>/<message prefix>".
func (r *Relay) messageSource(ctx context.Context) (string, error) {
	outboxes := r.cfg.Outboxes
	if s := outboxes[0].Mapping.Source; s != "" {
		return s, nil
	}
	if len(outboxes) == 1 && !outboxes[0].Pattern.IsGlob() {
		for _, o := range r.found {
			if o.Entry == 0 {
				return o.Identity, nil
			}
		}
	}
	source, err := replication.StreamIdentity(ctx, r.cfg.PostgresURL, r.cfg.MessagePrefix)
	if err != nil {
		return "", fmt.Errorf("derive the outbox messages' source: %w", err)
	}
	return source, nil
}

// checkContracts warns of each outbox table found at start that lacks a
// required column: its rows are bad events until it has them. (A table that
// appears later is checked when the stream first describes it.)
func (r *Relay) checkContracts(ctx context.Context, catalog *replication.Catalog) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	required := r.catalogOutboxes()
	for _, o := range r.found {
		missing, err := catalog.MissingColumns(ctx, o.OID, required[o.Entry].Required)
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			r.log.Warn("an outbox table lacks required columns: each of its rows is a bad event until they are there (see the column flags or the configuration file's outboxes list)",
				"table", o.Table(), "missing", missing)
		}
	}
	return nil
}

// monitorConfig is the slot monitor's: the tables each pattern matched at
// start (so that one dropped before the monitor's first read is still
// reported) and each named table's relation.
func (r *Relay) monitorConfig() replication.MonitorConfig {
	mcfg := replication.MonitorConfig{
		URL:         r.cfg.PostgresURL,
		Slot:        r.cfg.Slot,
		Publication: r.cfg.Publication,
		Interval:    r.cfg.SlotPollInterval,
	}
	for i, s := range r.cfg.Outboxes {
		if s.Pattern.IsGlob() {
			for _, o := range r.found {
				if o.Entry == i {
					mcfg.Matched = append(mcfg.Matched, replication.OutboxTable{Entry: len(mcfg.Patterns),
						Table: replication.Table{Relation: replication.Relation{OID: o.OID, Name: pgname.Name{Schema: o.Schema, Relation: o.Name}}}})
				}
			}
			mcfg.Patterns = append(mcfg.Patterns, s.Pattern)
			continue
		}
		for _, o := range r.found {
			if o.Entry == i {
				mcfg.Outboxes = append(mcfg.Outboxes, replication.MonitorOutbox{Table: s.Pattern.Name(),
					Outbox: replication.Relation{OID: o.OID, Name: pgname.Name{Schema: o.Schema, Relation: o.Name}}})
			}
		}
	}
	return mcfg
}

// Slot is the slot the relay streams: the stream's, or its shard's.
func (r *Relay) Slot() string { return r.cfg.Slot }

// Publication is the publication the relay streams: the stream's, or its
// shard's.
func (r *Relay) Publication() string { return r.cfg.Publication }
