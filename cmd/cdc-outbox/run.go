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
	table := outboxTable(c.Table)
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
	src.Ready = func() (bool, string) {
		dp := parts.Load()
		var missing []string
		if dp == nil || !dp.stream.Connected() {
			missing = append(missing, "not streaming from PostgreSQL (starting, reconnecting, or another instance holds the slot)")
		}
		if dp != nil && !dp.monitor.Published() {
			missing = append(missing, fmt.Sprintf("table %s is not in publication %s, or not wholly: inserts into it are not streamed", table, c.Publication))
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
		return len(missing) == 0, strings.Join(missing, "; ")
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
		Table:             table,
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
	catalog, err := openCatalog(ctx, c)
	if err != nil {
		return err
	}
	g.Close(catalog.Close)

	source, err := resolveSource(ctx, c)
	if err != nil {
		return err
	}
	c.Mapping.Source = source
	var tracer pipeline.Tracer // nil unless the OTEL_* variables ask for traces
	if tracing.Enabled(os.Getenv) {
		t, shutdown, err := tracing.New(ctx, tracing.Config{Source: source, Version: version, Log: log})
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
	if c.Delivery == deliveryExactlyOnce {
		if eo, err = newExactlyOnce(ctx, c, sinkCfg, kafkaOpts, m, log); err != nil {
			return err
		}
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
	p, err := pipeline.New(pipeline.Config{
		Mapping:           c.Mapping,
		OnBadEvent:        c.OnBadEvent,
		DeadLetterTopic:   c.DeadLetterTopic,
		MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes:  int64(c.MaxInflightBytes),
		MaxRecordBytes:    c.MaxRecordBytes,
		Explain:           explain,
		Tracer:            tracer,
	}, tracker, catalog, snk, m, log)
	if err != nil {
		return err
	}
	if txp != nil {
		// The committer stops after the stream, which drains through it.
		// Its failure (fenced, a refused record) stops the stream, whether
		// it streams, drains (Fail) or waits for the slot (the group).
		tctx, stop := context.WithCancel(g.Context())
		g.Go("Kafka transactions", func() error {
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
		rcfg.Holding = func(ctx context.Context) error { return eo.holding(ctx, p) }
	}
	st := replication.New(rcfg, p, tracker, log)
	outbox := catalog.Outbox()
	monitor := replication.NewMonitor(replication.MonitorConfig{
		URL:         c.PostgresURL,
		Slot:        c.Slot,
		Publication: c.Publication,
		Table:       table,
		Outbox:      outbox,
		Interval:    c.SlotPollInterval,
	}, m, log)
	health := sink.NewHealth(snk, m, explain, log)
	parts.Store(&dataPath{ckpt: tracker, stream: st, pipe: p, monitor: monitor, kafka: health, txp: txp})

	loop(g, "Kafka health check", health.Run)
	loop(g, "slot monitor", monitor.Run)

	if c.saslMechanism() == saslPlain && !c.KafkaTLS {
		log.Warn("--kafka-sasl-mechanism=plain without --kafka-tls sends the Kafka password unencrypted; add --kafka-tls unless the network is encrypted otherwise")
	}
	log.Info("starting", "delivery", c.Delivery, "slot", c.Slot, "start_lsn", start, "table", outbox.Name.String(), "table_oid", outbox.OID, "source", source, "brokers", c.KafkaBrokers,
		"kafka_tls", c.KafkaTLS, "kafka_sasl", c.saslMechanism())
	return st.Run(ctx)
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
			decoder.SkipUpdate:     read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Update) }),
			decoder.SkipDelete:     read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Delete) }),
			decoder.SkipTruncate:   read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().Truncate) }),
			decoder.SkipOtherTable: read(func(dp *dataPath) float64 { return float64(dp.pipe.Skipped().OtherTable) }),
		},
	}
}

// exactlyOnce is the exactly-once producer and what it needs once the
// stream holds the slot.
type exactlyOnce struct {
	txp    *sink.Transactional
	c      *runConfig
	admin  sink.Config // the checkpoint topic's clients: TLS and SASL, not the producer's metrics hooks
	origin string      // the outbox table's identity
	log    *slog.Logger
}

// newExactlyOnce makes the exactly-once producer and creates the
// checkpoint topic when missing. Nothing is fenced yet: a standby waiting
// for the slot must not stop the instance that streams.
func newExactlyOnce(ctx context.Context, c *runConfig, cfg sink.Config, kafkaOpts []kgo.Opt, obs sink.TxObserver, log *slog.Logger) (*exactlyOnce, error) {
	origin, err := replication.TableIdentity(ctx, c.PostgresURL, outboxTable(c.Table))
	if err != nil {
		return nil, fmt.Errorf("read the outbox table's identity for the Kafka checkpoint: %w", err)
	}
	txp, err := sink.NewTransactional(sink.TxConfig{
		Config:          cfg,
		TransactionalID: c.transactionalID(),
		CheckpointTopic: c.CheckpointTopic,
		CheckpointKey:   c.Slot,
		Origin:          origin,
		Interval:        c.TransactionInterval,
		CommitRecords:   max(1, c.MaxInflightEvents/2),
	}, obs, log)
	if err != nil {
		return nil, err
	}
	eo := &exactlyOnce{txp: txp, c: c, admin: sink.Config{Brokers: cfg.Brokers, Opts: kafkaOpts}, origin: origin, log: log}
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
// committed checkpoint and has p skip every transaction at or before it,
// which PostgreSQL sends again from the slot's older position.
func (eo *exactlyOnce) holding(ctx context.Context, p *pipeline.Pipeline) error {
	c, log := eo.c, eo.log
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := eo.txp.Fence(ctx); err != nil {
		return err
	}
	cp, err := sink.ReadCheckpoint(ctx, eo.admin, c.CheckpointTopic, c.Slot)
	if err != nil {
		return err
	}
	if cp.Found && cp.Origin != eo.origin {
		log.Warn("exactly-once delivery: the Kafka checkpoint of this slot is of another outbox table, database or cluster (a restore, pg_upgrade, or another server with a slot of the same name), "+
			"whose LSNs mean nothing here: it is ignored, and nothing is skipped", "checkpoint_topic", c.CheckpointTopic, "checkpoint_lsn", cp.LSN,
			"checkpoint_origin", cp.Origin, "origin", eo.origin)
		cp = sink.Checkpoint{}
	}
	if cp.Found {
		log.Info("exactly-once delivery: transactions up to the Kafka checkpoint are in Kafka and are skipped if PostgreSQL sends them again",
			"transactional_id", c.transactionalID(), "checkpoint_topic", c.CheckpointTopic, "checkpoint_lsn", cp.LSN, "written_at", cp.At)
	} else {
		log.Info("exactly-once delivery: no checkpoint for the slot in Kafka yet", "transactional_id", c.transactionalID(), "checkpoint_topic", c.CheckpointTopic)
	}
	eo.txp.SetCheckpoint(cp.LSN)
	p.SkipThrough(cp.LSN)
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

// catalogTimeout bounds one catalog lookup from the replication loop, which
// sends no status update meanwhile: well below the default
// wal_sender_timeout (60 s).
const catalogTimeout = 10 * time.Second

// openCatalog finds the outbox table for the stream, which asks the
// catalog what each relation it describes is: the outbox is the table
// --table names now, and from then on that table whatever its name.
func openCatalog(ctx context.Context, c *runConfig) (*replication.Catalog, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return replication.OpenCatalog(ctx, replication.CatalogConfig{
		URL:         c.PostgresURL,
		Table:       outboxTable(c.Table),
		Publication: c.Publication,
		Required:    []string{c.Mapping.IDColumn, c.Mapping.AggregateTypeColumn, c.Mapping.AggregateIDColumn, c.Mapping.EventTypeColumn, c.Mapping.PayloadColumn},
		Timeout:     catalogTimeout,
	})
}
