package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/metrics"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/tracing"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

func runCommand(args []string, stdout, stderr io.Writer) int {
	var c runConfig
	f := runFlags(&c)
	if code, ok := f.load(args, c.validate, stdout, stderr); !ok {
		return code
	}
	kafkaOpts, err := c.kafkaSecurityOpts()
	if err != nil {
		fmt.Fprintf(stderr, "cdc-outbox run: invalid configuration:\n%v\n", err)
		return 2
	}
	if c.CPUs > 0 {
		// One P: a goroutine woken on the data path (the producer, the
		// acknowledgements) runs when the reader yields instead of waking
		// a second thread (bench/results/cpu-per-event.md has the figures).
		runtime.GOMAXPROCS(c.CPUs)
	}
	log := newLogger(stderr, c.LogFormat, c.LogLevel)
	ctx, stop := signalContext(log)
	defer stop()
	if err := run(ctx, &c, kafkaOpts, log); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// A signal while starting: nothing was streamed, so nothing
			// is lost or left to drain.
			log.Info("stopped before streaming")
			return 0
		}
		log.Error("stopped with an error", "error", say(err))
		return 1
	}
	return 0
}

// run wires the data path: replication → pipeline (decoder, mapping) →
// sink, with the checkpoint deciding what the replication side confirms,
// and beside it the HTTP endpoint, the slot monitor and the Kafka health
// check, as one run group: the first part to fail stops them all, and so
// does ctx's end (a signal). kafkaOpts are the client's TLS and SASL
// options (kafkaSecurityOpts).
//
// Shutdown runs in this order. The stream stops reading, drains what is in
// flight (up to --shutdown-timeout) and sends its final position; run
// returns, and the group stops the rest, last started first: the slot
// monitor and the Kafka health check (they use the sink and the database),
// then the sink (records still buffered fail with kgo.ErrClientClosed,
// which the pipeline takes for a shutdown, not for bad events), the
// catalog's connection, and last the HTTP endpoint, so /metrics and /readyz
// answer until the end.
func run(ctx context.Context, c *runConfig, kafkaOpts []kgo.Opt, log *slog.Logger) (err error) {
	specs := c.outboxes()
	g := newGroup(ctx)
	defer func() {
		if failed := g.Stop(); failed != nil {
			err = failed // why everything stopped
		}
	}()
	ctx = g.Context()

	// The HTTP endpoint starts before the slot is known (so /healthz answers
	// during a long wait for the slot); the data path's parts are published
	// here once built, and metrics read 0 until then.
	var parts atomic.Pointer[dataPath]
	src := sources(&parts)
	// Ready is /readyz: the holder streaming, or a standby that can take
	// over at once (the server answered that another process holds the
	// slot, the table is published, Kafka answers). A standby counts as
	// ready so that a rolling update, which waits for each new pod to be
	// ready, proceeds while the old pod holds the slot; cdc_outbox_ready and
	// cdc_outbox_slot_holder stay 0 on it.
	src.Ready = func() (bool, string) {
		dp := parts.Load()
		var missing []string
		role := ""
		switch {
		case dp != nil && dp.stream.Connected():
			role = fmt.Sprintf("streaming: holds slot %s", c.Slot)
		case dp != nil && dp.stream.Standby():
			role = fmt.Sprintf("standby: slot %s is held by another process; this one takes over within seconds of its release", c.Slot)
		default:
			missing = append(missing, "not streaming from PostgreSQL (starting or reconnecting)")
		}
		if dp != nil && !dp.monitor.Published() {
			missing = append(missing, fmt.Sprintf("an outbox table (%s) is not in publication %s, or not wholly: inserts into it are not streamed", describeOutboxes(specs), c.Publication))
		}
		var kafkaUp bool
		var kafkaErr error // the last failure, explained in /readyz
		if dp != nil {
			kafkaUp, kafkaErr = dp.kafka.State()
		}
		switch {
		case kafkaUp:
		case kafkaErr != nil:
			missing = append(missing, "Kafka does not answer metadata requests: "+explain(kafkaErr))
		default:
			missing = append(missing, "Kafka does not answer metadata requests")
		}
		if len(missing) > 0 {
			return false, strings.Join(missing, "; ")
		}
		return true, role
	}
	v, rev := buildVersion()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, src, metrics.Build{Version: v, Revision: rev})
	if c.HTTPAddr != "" {
		h := m.Handler(reg)
		if c.Pprof {
			mux := http.NewServeMux()
			mux.Handle("/", h)
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
			h = mux
		}
		if err := serveHTTP(g, c.HTTPAddr, h, log); err != nil {
			return err
		}
	}

	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	prepared, err := replication.Prepare(setupCtx, c.PostgresURL, replication.Setup{
		Outboxes:          patternsOf(specs),
		Publication:       c.Publication,
		Slot:              c.Slot,
		CreatePublication: c.CreatePublication,
		CreateSlot:        c.CreateSlot,
		RecreateSlot:      c.RecreateSlot,
		Failover:          c.SlotFailover,
	}, log)
	cancel()
	if err != nil {
		return err
	}
	logPrepared(log, c.Slot, prepared)
	start := prepared.Start
	catalog, err := openCatalog(ctx, c, specs)
	if err != nil {
		return err
	}
	g.Close(catalog.Close)
	found := catalog.Outboxes()
	msgSource, err := messageSource(ctx, c, specs, found)
	if err != nil {
		return err
	}
	var tracer pipeline.Tracer // nil unless the OTEL_* variables ask for traces
	if tracing.Enabled(os.Getenv) {
		t, shutdown, err := tracing.New(ctx, tracing.Config{Version: version, Log: log})
		if err != nil {
			return err
		}
		// Closed after the sink, so the spans of the last acknowledgements
		// are exported.
		g.Close(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(sctx); err != nil {
				log.Warn("tracing: the last spans were not exported", "error", err)
			}
		})
		tracer = t
		log.Info("tracing: a span per event, exported over OTLP as the OTEL_* environment variables say")
	}

	tracker := checkpoint.New(start)
	sinkCfg := sink.Config{
		Brokers:     c.brokers(),
		Linger:      c.KafkaLinger,
		Compression: c.KafkaCompression,
		// Room for everything in flight plus dead-letter records, so
		// Produce never blocks the replication loop.
		MaxBufferedRecords: 2*c.MaxInflightEvents + 1000,
		MaxRecordBytes:     c.MaxRecordBytes,
		AutoCreateTopics:   c.KafkaAutoCreateTopics,
		Opts:               append([]kgo.Opt{kgo.WithHooks(m.Hooks()...)}, kafkaOpts...),
	}
	var (
		snk interface {
			pipeline.Producer
			sink.Pinger
		}
		txp *sink.Transactional
		eo  *exactlyOnce
	)
	// The stream, made below, says which timeline it streams from, and
	// the pipeline which history epoch: each Kafka checkpoint names them
	// (exactly-once).
	var (
		st *replication.Stream
		p  *pipeline.Pipeline
	)
	streamID, err := replication.StreamIdentity(ctx, c.PostgresURL, c.Slot)
	if err != nil {
		return fmt.Errorf("read the stream's identity (the Kafka checkpoint's key): %w", err)
	}
	admin := sink.Config{Brokers: c.brokers(), Opts: kafkaOpts}
	records, err := sink.NewStreamRecords(admin, c.CheckpointTopic)
	if err != nil {
		return err
	}
	g.Close(records.Close)
	lin := &lineage{admin: admin, topic: c.CheckpointTopic, records: records, stream: streamID,
		timeline: func() int32 { return st.Timeline() }, lost: m, log: log}
	if c.Delivery == deliveryExactlyOnce {
		if eo, err = newExactlyOnce(ctx, c, specs, sinkCfg, kafkaOpts, streamID, func() int32 { return st.Timeline() }, func() int { return p.Epoch() }, m, log); err != nil {
			return err
		}
		eo.lineage = lin
		txp = eo.txp
		g.Close(txp.Close)
		snk = txp
	} else {
		s, err := sink.New(sinkCfg, log)
		if err != nil {
			return err
		}
		g.Close(s.Close)
		snk = s
	}
	p, err = pipeline.New(pipeline.Config{
		Outboxes:          mappingsOf(specs),
		OnBadEvent:        c.OnBadEvent,
		DeadLetterTopic:   c.DeadLetterTopic,
		MessagePrefix:     c.MessagePrefix,
		MessageSource:     msgSource,
		MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes:  int64(c.MaxInflightBytes),
		MaxRecordBytes:    c.MaxRecordBytes,
		Explain:           explain,
		Tracer:            tracer,
		Lineage:           lin,
	}, tracker, catalog, snk, m, log)
	if err != nil {
		return err
	}
	if err := p.Known(found); err != nil {
		return err
	}
	if err := checkContracts(ctx, catalog, specs, found, log); err != nil {
		return err
	}
	if txp != nil {
		// The committer stops after the stream, which drains through it:
		// its context is not the group's, which a signal ends, but ends
		// when the group stops it, once run has returned. Its failure
		// (fenced, a refused record) stops the stream, whether it
		// streams, drains (Fail) or waits for the slot (the group).
		tctx, stop := context.WithCancel(context.WithoutCancel(g.Context()))
		g.Go("Kafka transactions", func() error {
			// On a signal, what is queued commits at once, not after
			// --transaction-interval: the stream's drain waits for it.
			defer context.AfterFunc(g.Context(), txp.CommitNow)()
			err := txp.Run(tctx)
			if err != nil {
				p.Fail(err)
			}
			return err
		}, stop)
	}

	rcfg := replication.Config{
		URL:               c.PostgresURL,
		Slot:              c.Slot,
		Publication:       c.Publication,
		StatusInterval:    c.StatusInterval,
		KeepaliveInterval: c.KeepaliveInterval,
		ReceiveTimeout:    c.ReceiveTimeout,
		ShutdownTimeout:   c.ShutdownTimeout,
	}
	if eo != nil {
		// Once per process: the transactional id is registered once, and
		// an instance that took the slot since fenced this one, which then
		// stops at its next commit.
		held := false
		rcfg.Holding = func(ctx context.Context) error {
			if held {
				return nil
			}
			held = true
			return eo.holding(ctx, p, st, m)
		}
	} else {
		// At every taking of the slot: whoever held it before may have
		// found a lost history and recorded an epoch.
		rcfg.Holding = func(ctx context.Context) error {
			if err := lin.load(ctx); err != nil {
				return err
			}
			es, err := lin.holding(st.History())
			p.SetEpochs(es)
			return err
		}
	}
	st = replication.New(rcfg, p, tracker, log)
	mcfg := replication.MonitorConfig{
		URL:         c.PostgresURL,
		Slot:        c.Slot,
		Publication: c.Publication,
		Interval:    c.SlotPollInterval,
	}
	for i, s := range specs {
		if s.Pattern.IsGlob() {
			for _, o := range found {
				if o.Entry == i {
					mcfg.Matched = append(mcfg.Matched, replication.OutboxTable{Entry: len(mcfg.Patterns),
						Table: replication.Table{Relation: replication.Relation{OID: o.OID, Name: pgname.Name{Schema: o.Schema, Relation: o.Name}}}})
				}
			}
			mcfg.Patterns = append(mcfg.Patterns, s.Pattern)
			continue
		}
		for _, o := range found {
			if o.Entry == i {
				mcfg.Outboxes = append(mcfg.Outboxes, replication.MonitorOutbox{Table: s.Pattern.Name(),
					Outbox: replication.Relation{OID: o.OID, Name: pgname.Name{Schema: o.Schema, Relation: o.Name}}})
			}
		}
	}
	monitor := replication.NewMonitor(mcfg, m, log)
	health := sink.NewHealth(snk, m, explain, log)
	parts.Store(&dataPath{ckpt: tracker, stream: st, pipe: p, monitor: monitor, kafka: health, txp: txp})

	loop(g, "Kafka health check", health.Run)
	if eo == nil {
		loop(g, "published position", func(ctx context.Context) {
			lin.watch(ctx, st, func() checkpoint.Published { return checkpoint.Published{End: p.HandedOn(), Epoch: p.Epoch()} })
		})
	}
	loop(g, "slot monitor", monitor.Run)

	if c.saslMechanism() == saslPlain && !c.KafkaTLS {
		log.Warn("--kafka-sasl-mechanism=plain without --kafka-tls sends the Kafka password unencrypted; add --kafka-tls unless the network is encrypted otherwise")
	}
	for _, o := range p.Outboxes() {
		log.Info("outbox table", "table", o.Table, "table_oid", o.OID, "source", o.Source)
	}
	if len(found) == 0 {
		log.Warn("no table matches the outboxes yet: tables that match are streamed once created and in the publication", "outboxes", describeOutboxes(specs))
	}
	attrs := []any{"delivery", c.Delivery, "slot", c.Slot, "start_lsn", start, "outboxes", describeOutboxes(specs), "tables", len(found)}
	if len(found) == 1 {
		// One outbox, as before: the table and its source on the line.
		o := p.Outboxes()[0]
		attrs = append(attrs, "table", o.Table, "table_oid", o.OID, "source", o.Source)
	}
	log.Info("starting", append(attrs, "brokers", c.KafkaBrokers, "kafka_tls", c.KafkaTLS, "kafka_sasl", c.saslMechanism())...)
	err = st.Run(ctx)
	// A lost history the running stream found is recorded before the
	// exit, so that the restart publishes the server's events in the new
	// epoch.
	if lerr := lin.stopped(err, p.Epoch()); lerr != nil {
		return errors.Join(err, lerr)
	}
	return err
}

// dataPath is what metrics read at scrape time.
type dataPath struct {
	ckpt    *checkpoint.Tracker
	stream  *replication.Stream
	pipe    *pipeline.Pipeline
	monitor *replication.Monitor
	kafka   *sink.Health
	txp     *sink.Transactional // nil in at-least-once delivery
}

// sources reads the data path's state for metrics; every value is zero
// until the data path exists.
func sources(parts *atomic.Pointer[dataPath]) metrics.Sources {
	read := func(fn func(*dataPath) float64) func() float64 {
		return func() float64 {
			if dp := parts.Load(); dp != nil {
				return fn(dp)
			}
			return 0
		}
	}
	return metrics.Sources{
		Confirmed:          read(func(dp *dataPath) float64 { return float64(dp.ckpt.Confirmed()) }),
		Received:           read(func(dp *dataPath) float64 { return float64(dp.stream.Received()) }),
		Transactions:       read(func(dp *dataPath) float64 { return float64(dp.ckpt.Transactions()) }),
		InFlight:           read(func(dp *dataPath) float64 { return float64(dp.pipe.InFlight()) }),
		InFlightBytes:      read(func(dp *dataPath) float64 { return float64(dp.pipe.InFlightBytes()) }),
		PostgresReconnects: read(func(dp *dataPath) float64 { return float64(dp.stream.Reconnects()) }),
		StatusUpdates:      read(func(dp *dataPath) float64 { return float64(dp.stream.StatusUpdates()) }),
		Checkpoint: read(func(dp *dataPath) float64 {
			if dp.txp == nil {
				return 0
			}
			return float64(dp.txp.Checkpoint())
		}),
		SkippedTransactions: read(func(dp *dataPath) float64 { return float64(dp.pipe.SkippedTransactions()) }),
		Epoch:               read(func(dp *dataPath) float64 { return float64(dp.pipe.Epoch()) }),
		Outboxes: func() []metrics.Outbox {
			dp := parts.Load()
			if dp == nil {
				return nil
			}
			var out []metrics.Outbox
			for _, o := range dp.pipe.Outboxes() {
				out = append(out, metrics.Outbox{Name: o.Table, Events: o.Events, Failed: o.Bad["failed"], DeadLettered: o.Bad["dead_lettered"], Last: o.Last})
			}
			return out
		},
		PostgresConnected: func() bool {
			dp := parts.Load()
			return dp != nil && dp.stream.Connected()
		},
		Oldest: func() (time.Time, bool) {
			if dp := parts.Load(); dp != nil {
				return dp.ckpt.Oldest()
			}
			return time.Time{}, false
		},
		Skipped: map[string]func() float64{
			decoder.SkipUpdate:      read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Update) }),
			decoder.SkipDelete:      read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Delete) }),
			decoder.SkipTruncate:    read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Truncate) }),
			decoder.SkipOtherTable:  read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().OtherTable) }),
			decoder.SkipOtherPrefix: read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().OtherPrefix) }),
		},
	}
}

// exactlyOnce is the exactly-once producer and what it needs once the
// stream holds the slot.
type exactlyOnce struct {
	txp   *sink.Transactional
	c     *runConfig
	admin sink.Config // the checkpoint topic's clients: TLS and SASL, not the producer's metrics hooks
	// stream is the stream's identity (replication.StreamIdentity): the
	// checkpoint key and origin, and the default transactional id's core.
	stream string
	// legacyOrigin is the outbox table's identity, which checkpoints of
	// the former default names carry under the slot's name as key.
	legacyOrigin string
	lineage      *lineage // the stream's history epochs, read with the checkpoint
	log          *slog.Logger
}

// newExactlyOnce makes the exactly-once producer and creates the
// checkpoint topic when missing. Nothing is fenced yet: a standby waiting
// for the slot must not stop the instance that streams.
func newExactlyOnce(ctx context.Context, c *runConfig, specs []outboxSpec, cfg sink.Config, kafkaOpts []kgo.Opt, stream string, timeline func() int32, epoch func() int, obs sink.TxObserver, log *slog.Logger) (*exactlyOnce, error) {
	// The former default names keyed a checkpoint by the slot with the one
	// outbox table's identity as origin; a stream of a list or patterns
	// never wrote one.
	var (
		legacy string
		err    error
	)
	if len(specs) == 1 && !specs[0].Pattern.IsGlob() {
		if legacy, err = replication.TableIdentity(ctx, c.PostgresURL, specs[0].Pattern.Name()); err != nil && !errors.Is(err, replication.ErrNoTable) {
			return nil, fmt.Errorf("read the outbox table's identity for the former Kafka checkpoint: %w", err)
		}
	}
	txp, err := sink.NewTransactional(sink.TxConfig{
		Config:          cfg,
		TransactionalID: c.transactionalID(stream),
		CheckpointTopic: c.CheckpointTopic,
		CheckpointKey:   stream,
		Origin:          stream,
		Timeline:        timeline,
		Epoch:           epoch,
		Interval:        c.TransactionInterval,
		CommitRecords:   max(1, c.MaxInflightEvents/2),
		Admin:           sink.Config{Brokers: cfg.Brokers, Opts: kafkaOpts},
	}, obs, log)
	if err != nil {
		return nil, err
	}
	eo := &exactlyOnce{txp: txp, c: c, admin: sink.Config{Brokers: cfg.Brokers, Opts: kafkaOpts}, stream: stream, legacyOrigin: legacy, log: log}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := sink.EnsureCheckpointTopic(ctx, eo.admin, c.CheckpointTopic); err != nil {
		txp.Close()
		return nil, err
	}
	return eo, nil
}

// holding runs once the stream holds the slot, before it reads: it
// registers the transactional id (fencing the instance before this one and
// aborting the Kafka transaction it left open), then reads the slot's last
// committed checkpoint and has p skip the transactions before it that
// PostgreSQL sends again from the slot's older position, as far as the
// checkpoint is proven to be on the WAL history of the server st streams
// from (checkpoint.Decide): up to the fork when the history forked after
// it, up to the checkpoint once its commit is met again (Pipeline.Verify),
// nothing when it cannot be verified.
func (eo *exactlyOnce) holding(ctx context.Context, p *pipeline.Pipeline, st *replication.Stream, lost interface{ LostHistory() }) error {
	c, log := eo.c, eo.log
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := eo.txp.Fence(ctx); err != nil {
		return err
	}
	id := c.transactionalID(eo.stream)
	cp, err := sink.ReadCheckpoint(ctx, eo.admin, c.CheckpointTopic, eo.stream, eo.stream)
	if err != nil {
		return err
	}
	// The epochs are this stream's, whichever checkpoint is read below.
	epochs, err := eo.lineage.set(cp.Epochs)
	if err != nil {
		return err
	}
	p.SetEpochs(epochs)
	if !cp.Found && eo.legacyOrigin != "" {
		// The first start after an upgrade from the former default names
		// (the slot's name as key, the table's identity as origin): that
		// checkpoint is this stream's until the first commit under the new
		// key, which then holds a higher position.
		if cp, err = sink.ReadCheckpoint(ctx, eo.admin, c.CheckpointTopic, c.Slot, eo.legacyOrigin); err != nil {
			return err
		}
		if cp.Found {
			log.Info("exactly-once delivery: read the checkpoint written under the slot's name, the former default key; the next commit writes it under the stream's identity",
				"checkpoint_topic", c.CheckpointTopic, "former_key", c.Slot, "key", eo.stream, "checkpoint_lsn", cp.LSN)
		}
	}
	if !cp.Found {
		log.Info("exactly-once delivery: no checkpoint of this stream in Kafka yet", "transactional_id", id, "checkpoint_topic", c.CheckpointTopic, "checkpoint_key", eo.stream)
		return nil
	}
	eo.txp.SetCheckpoint(cp.LSN)
	mark := checkpoint.Mark{End: cp.LSN, Timeline: cp.Commit.Timeline, Xid: cp.Commit.Xid, CommitTime: cp.Commit.CommitTime, Epoch: cp.Commit.Epoch, Named: cp.Commit.Named}
	h := st.History()
	trust := checkpoint.Decide(mark, h.Timeline, h.Ends, h.Flushed)
	attrs := []any{"transactional_id", id, "checkpoint_topic", c.CheckpointTopic, "checkpoint_key", eo.stream, "checkpoint_lsn", cp.LSN,
		"checkpoint_timeline", mark.Timeline, "timeline", h.Timeline, "stream_start_lsn", p.Newest(), "server_flushed_lsn", h.Flushed, "written_at", cp.At}
	switch {
	case trust.Verify:
		log.Info("exactly-once delivery: transactions up to the Kafka checkpoint are in Kafka and are skipped if PostgreSQL sends them again, "+
			"once the checkpoint's commit is met on this server's history", attrs...)
		p.Verify(mark)
	case trust.Lost:
		lost.LostHistory()
		log.Warn("lost history: the Kafka checkpoint lies on WAL this server never had: only the transactions up to the fork (if any) are skipped, "+
			"and the events Kafka holds of the WAL from there to the checkpoint are of a history the server does not have; it commits other transactions there, "+
			"and may hand out the same event ids again", append(attrs, "why", trust.Why, "lost_from_lsn", trust.LostFrom, "lost_to_lsn", cp.LSN, "skip_through_lsn", trust.Skip)...)
		p.SkipThrough(trust.Skip)
		// The server's events from the fork on (from the stream's start
		// when the histories part at an unknown place) are a new epoch.
		es, err := eo.lineage.Begin(checkpoint.Epoch{Timeline: h.Timeline, From: trust.LostFrom, LostEpoch: cp.Commit.Epoch,
			LostTimeline: mark.Timeline, LostFrom: trust.LostFrom, LostTo: cp.LSN, At: time.Now()})
		if err != nil {
			return err
		}
		p.SetEpochs(es)
	default:
		log.Warn("exactly-once delivery: the Kafka checkpoint cannot be verified on this server's WAL history: nothing is skipped, "+
			"so transactions Kafka holds may be published again", append(attrs, "why", trust.Why)...)
	}
	return nil
}

// loop adds to g a loop that runs until told to stop and never fails.
func loop(g *group, name string, run func(ctx context.Context)) {
	ctx, stop := context.WithCancel(g.Context())
	g.Go(name, func() error { run(ctx); return nil }, stop)
}

// serveHTTP starts the metrics and health endpoint; a port that cannot be
// bound is an error at start, not a silent absence of metrics. An endpoint
// that stops serving fails the group: the daemon stops rather than run
// without metrics and readiness.
func serveHTTP(g *group, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w (choose another address, or --http-addr='' to turn the endpoint off)", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	g.Go("http endpoint", func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return nil
}

// logPrepared says what Prepare did to the slot that skips changes: the
// operator asked for it with --recreate-slot, and must know what it cost.
func logPrepared(log *slog.Logger, slot string, p replication.Prepared) {
	if p.DroppedLost {
		log.Warn("dropped the replication slot that lost its WAL (--recreate-slot): outbox events committed after its last confirmed position "+
			"and before the new slot are not streamed", "slot", slot, "confirmed_lsn", p.LostConfirmed)
	}
	if p.Slot == replication.SlotRecreated {
		log.Warn("re-created the replication slot (--recreate-slot): changes committed before it are not streamed", "slot", slot, "lsn", p.Start)
	}
}

// checkContracts warns of each outbox table found at start that lacks a
// required column: its rows are bad events until it has them. (A table that
// appears later is checked when the stream first describes it.)
func checkContracts(ctx context.Context, catalog *replication.Catalog, specs []outboxSpec, found []decoder.Outbox, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, o := range found {
		required := catalogOutboxes(specs)[o.Entry].Required
		missing, err := catalog.MissingColumns(ctx, o.OID, required)
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			log.Warn("an outbox table lacks required columns: each of its rows is a bad event until they are there (see the column flags or the configuration file's outboxes list)",
				"table", o.Table(), "missing", missing)
		}
	}
	return nil
}

// catalogTimeout bounds one catalog lookup from the replication loop, which
// sends no status update meanwhile: well below the default
// wal_sender_timeout (60 s).
const catalogTimeout = 10 * time.Second

// openCatalog finds the outbox table for the stream, which asks the
// catalog what each relation it describes is: the outbox is the table
// --table names now, and from then on that table whatever its name.
func openCatalog(ctx context.Context, c *runConfig, specs []outboxSpec) (*replication.Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return replication.OpenCatalog(ctx, replication.CatalogConfig{
		URL:         c.PostgresURL,
		Outboxes:    catalogOutboxes(specs),
		Publication: c.Publication,
		Timeout:     catalogTimeout,
	})
}
