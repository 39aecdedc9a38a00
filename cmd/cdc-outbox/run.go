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
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/metrics"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

func runCommand(args []string, stdout, stderr io.Writer) int {
	var c runConfig
	f := runFlags(&c)
	if err := f.parse(args, stdout); err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "cdc-outbox run: %v\n", err)
		return 2
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "cdc-outbox run: invalid configuration:\n%v\n", err)
		return 2
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
		log.Error("stopped with an error", "error", redact(err))
		return 1
	}
	return 0
}

// group runs background loops that live as long as the stream: each gets
// the group's context and is waited for when the group stops.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newGroup(parent context.Context) *group {
	ctx, cancel := context.WithCancel(parent)
	return &group{ctx: ctx, cancel: cancel}
}

func (g *group) goLoop(fn func(ctx context.Context)) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn(g.ctx)
	}()
}

func (g *group) stop() {
	g.cancel()
	g.wg.Wait()
}

// run wires the data path: replication → pipeline (decoder, mapping) →
// sink, with the checkpoint deciding what the replication side confirms,
// and beside it the HTTP endpoint, the slot poller and the Kafka pinger.
// kafkaOpts are the client's TLS and SASL options (kafkaSecurityOpts).
func run(ctx context.Context, c *runConfig, kafkaOpts []kgo.Opt, log *slog.Logger) error {
	table := outboxTable(c.Table)
	bg := newGroup(context.Background())
	defer bg.stop()

	// The HTTP endpoint starts before the slot is known (so /healthz answers
	// during a long wait for the slot); the data path's parts are published
	// here once built, and metrics read 0 until then.
	var parts atomic.Pointer[dataPath]
	var kafkaUp kafkaState
	var published atomic.Bool // the outbox table is in the publication, as last checked
	published.Store(true)
	src := sources(&parts)
	src.Ready = func() (bool, string) {
		dp := parts.Load()
		var missing []string
		if dp == nil || !dp.stream.Connected() {
			missing = append(missing, "not streaming from PostgreSQL (starting, reconnecting, or another instance holds the slot)")
		}
		if !published.Load() {
			missing = append(missing, fmt.Sprintf("table %s is not in publication %s, or not wholly: inserts into it are not streamed", table, c.Publication))
		}
		if up, reason := kafkaUp.state(); !up {
			missing = append(missing, "Kafka does not answer metadata requests"+reason)
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
		if err := serveHTTP(bg, c.HTTPAddr, h, log); err != nil {
			return err
		}
	}

	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	start, err := replication.Prepare(setupCtx, c.PostgresURL, replication.Setup{
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
	catalog, err := openCatalog(ctx, c)
	if err != nil {
		return err
	}
	defer catalog.Close()

	source, err := resolveSource(ctx, c)
	if err != nil {
		return err
	}
	c.Mapping.Source = source

	tracker := checkpoint.New(start)
	p, err := pipeline.New(pipeline.Config{
		Mapping:           c.Mapping,
		OnBadEvent:        c.OnBadEvent,
		DeadLetterTopic:   c.DeadLetterTopic,
		MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes:  int64(c.MaxInflightBytes),
		MaxRecordBytes:    c.MaxRecordBytes,
	}, tracker, catalog, log)
	if err != nil {
		return err
	}
	p.SetObserver(m)
	snk, err := sink.New(sink.Config{
		Brokers:     c.brokers(),
		Linger:      c.KafkaLinger,
		Compression: c.KafkaCompression,
		// Room for everything in flight plus dead-letter records, so
		// Produce never blocks the replication loop.
		MaxBufferedRecords: 2*c.MaxInflightEvents + 1000,
		MaxRecordBytes:     c.MaxRecordBytes,
		AutoCreateTopics:   c.KafkaAutoCreateTopics,
		Opts:               append([]kgo.Opt{kgo.WithHooks(m.Hooks()...)}, kafkaOpts...),
	}, log, p.Ack)
	if err != nil {
		return err
	}
	// The sink closes after the loops that use it (the Kafka pinger) and
	// after the stream, which drained it up to --shutdown-timeout: records
	// still buffered then fail with kgo.ErrClientClosed, which the pipeline
	// takes for a shutdown, not for bad events.
	defer func() {
		bg.stop()
		snk.Close()
	}()
	p.SetSink(snk)

	st := replication.New(replication.Config{
		URL:               c.PostgresURL,
		Slot:              c.Slot,
		Publication:       c.Publication,
		StatusInterval:    c.StatusInterval,
		KeepaliveInterval: c.KeepaliveInterval,
		ReceiveTimeout:    c.ReceiveTimeout,
		ShutdownTimeout:   c.ShutdownTimeout,
	}, p, tracker, log)
	parts.Store(&dataPath{ckpt: tracker, stream: st, pipe: p})

	bg.goLoop(func(ctx context.Context) { pingKafka(ctx, snk, &kafkaUp, m, log) })
	outbox := catalog.Outbox()
	bg.goLoop(func(ctx context.Context) { pollSlot(ctx, c, outbox, &published, m, log) })

	if c.saslMechanism() == saslPlain && !c.KafkaTLS {
		log.Warn("--kafka-sasl-mechanism=plain without --kafka-tls sends the Kafka password unencrypted; add --kafka-tls unless the network is encrypted otherwise")
	}
	log.Info("starting", "slot", c.Slot, "start_lsn", start, "table", outbox.Name.String(), "table_oid", outbox.OID, "source", source, "brokers", c.KafkaBrokers,
		"kafka_tls", c.KafkaTLS, "kafka_sasl", c.saslMechanism())
	return st.Run(ctx)
}

// dataPath is what metrics read at scrape time.
type dataPath struct {
	ckpt   *checkpoint.Tracker
	stream *replication.Stream
	pipe   *pipeline.Pipeline
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
		Skipped: func() decoder.SkipCounts {
			if dp := parts.Load(); dp != nil {
				return dp.pipe.Skipped()
			}
			return decoder.SkipCounts{}
		},
	}
}

// serveHTTP starts the metrics and health endpoint; a port that cannot be
// bound is an error at start, not a silent absence of metrics.
func serveHTTP(bg *group, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http-addr %s: %w (choose another address, or --http-addr='' to turn the endpoint off)", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	bg.goLoop(func(ctx context.Context) {
		go func() {
			<-ctx.Done()
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx)
		}()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http endpoint stopped", "error", err)
		}
	})
	return nil
}

// kafkaState is whether the broker answered the last metadata request, and
// if not, why.
type kafkaState struct {
	mu           sync.Mutex
	isUp, wasUp  bool
	everAnswered bool
	why          string // the last failure with advice; "" while up
}

// state is whether the broker answered and, when not, ": " and why, for
// /readyz.
func (k *kafkaState) state() (up bool, reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.isUp || k.why == "" {
		return k.isUp, ""
	}
	return false, ": " + k.why
}

// pingKafka asks the broker for metadata every few seconds: readiness and
// cdc_outbox_connected{target="kafka"} come from the answer. A failure is
// logged when Kafka stops answering, at the first attempt, and whenever the
// reason changes: a wrong password or certificate never heals by itself,
// so the operator must hear of it at start, not only from /readyz.
func pingKafka(ctx context.Context, snk *sink.Sink, k *kafkaState, m *metrics.Metrics, log *slog.Logger) {
	const every = 5 * time.Second
	first := true
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		err := snk.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		k.wasUp, k.isUp = k.isUp, err == nil
		m.Kafka(k.isUp, k.wasUp, k.everAnswered)
		why, advice := "", sink.Advice(err)
		if err != nil {
			why = err.Error()
			if advice != "" {
				why += "; " + advice
			}
		}
		news := err != nil && (first || k.wasUp || why != k.why)
		switch {
		case news && advice != "":
			log.Error("Kafka refuses the connection; events wait in flight and nothing past them is confirmed", "error", why)
		case news:
			log.Warn("Kafka does not answer; events wait in flight and nothing past them is confirmed", "error", why)
		case err == nil && !k.wasUp && k.everAnswered:
			log.Info("Kafka answers again")
		}
		k.why = why
		k.everAnswered = k.everAnswered || k.isUp
		k.mu.Unlock()
		first = false
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
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

// pollSlot reads the slot's state on a normal connection every
// --slot-poll-interval: retained WAL, active, wal_status. The database's
// view is the one that matters when the streamer itself is stuck. It also
// checks that the publication still publishes the whole outbox, comparing
// relations: a table dropped and created again silently leaves it, and a
// partition or inheritance child the publication misses is never sent.
func pollSlot(ctx context.Context, c *runConfig, outbox replication.Relation, published *atomic.Bool, m *metrics.Metrics, log *slog.Logger) {
	table := outboxTable(c.Table)
	var conn *pgx.Conn
	var walStatus string // as last read
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = replication.ConnectPrimary(qctx, c.PostgresURL)
			if err != nil {
				conn = nil
			}
		}
		if err == nil {
			var info replication.SlotInfo
			info, err = replication.ReadSlot(qctx, conn, c.Slot)
			if err == nil {
				if info.Invalidated() {
					// Whatever the reason (17+: invalidation_reason; 16:
					// conflicting), the slot can no longer stream: as
					// good as lost, which 16+ also says in wal_status.
					info.WALStatus = "lost"
				}
				m.Slot(info.Active, info.RetainedBytes, info.WALStatus)
				m.SlotFailover(info.Failover, info.StandbysStreaming)
				logWALStatus(log, walStatus, info)
				walStatus = info.WALStatus
			} else if errors.Is(err, replication.ErrSlotMissing) {
				m.Slot(false, 0, "")
			}
		}
		if err == nil {
			var problem string
			if problem, err = replication.CheckPublication(qctx, conn, c.Publication, outbox, table); err == nil {
				published.Store(problem == "")
				if problem != "" {
					log.Error("the outbox table is not in the publication, or not wholly: inserts into what is missing are not streamed. "+
						"Was it dropped and created again, or a partition added by hand? Fix it as the problem says, then re-publish the rows inserted meanwhile (cdc-outbox republish)",
						"problem", problem, "table", table.String(), "publication", c.Publication)
				}
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("could not read the replication slot's state", "slot", c.Slot, "error", redact(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.SlotPollInterval):
		}
	}
}

// logWALStatus says when the slot's wal_status changes, at the level the
// new state deserves. unreserved and lost are errors: the first is the last
// moment to act before PostgreSQL removes WAL the slot needs, the second
// means it did (streaming then stops with ErrWALLost at the latest when the
// walsender is ended and the stream reconnects).
func logWALStatus(log *slog.Logger, prev string, info replication.SlotInfo) {
	if info.WALStatus == prev {
		return
	}
	attrs := []any{"slot", info.Name, "wal_status", info.WALStatus, "previous", prev, "retained_wal_bytes", info.RetainedBytes}
	if reason := info.Reason(); reason != "" {
		attrs = append(attrs, "invalidation_reason", reason)
	}
	switch info.WALStatus {
	case "extended":
		log.Warn("the slot holds more WAL than max_wal_size: cdc-outbox is behind (is Kafka slow or refusing?)", attrs...)
	case "unreserved":
		log.Error("the slot holds more WAL than max_slot_wal_keep_size allows: the next checkpoint removes WAL it still needs, "+
			"and its events would never reach Kafka through it. Let cdc-outbox catch up (Kafka?) or raise max_slot_wal_keep_size now", attrs...)
	case "lost":
		what, _ := replication.Invalidation(info.Reason())
		log.Error("the slot is invalidated: "+what+". The events it had not streamed will not reach Kafka through this slot; "+
			"cdc-outbox stops when the stream ends. Start with --recreate-slot, then re-publish them from the outbox table with cdc-outbox republish", attrs...)
	case "reserved":
		if prev == "extended" || prev == "unreserved" {
			log.Info("the slot's WAL is within max_wal_size again", attrs...)
		}
	}
}
