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

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/metrics"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/relay"
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
	if c.Shards > 1 && c.CPUs > 0 && c.CPUs < c.Shards {
		log.Info(fmt.Sprintf("--shards %d with --cpus %d: the shards share %d core(s) of this process; where %d cores are free for it, --cpus %d (or 0) gives each shard one (docs/sharding.md)",
			c.Shards, c.CPUs, c.CPUs, c.Shards, c.Shards))
	}
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
		case dp != nil && dp.connected():
			role = fmt.Sprintf("streaming: holds slot %s", dp.slots())
		case dp != nil && dp.standby():
			role = fmt.Sprintf("standby: slot %s is held by another process; this one takes over within seconds of its release", dp.slots())
		default:
			missing = append(missing, "not streaming from PostgreSQL (starting or reconnecting)")
		}
		if dp != nil && !dp.published() {
			missing = append(missing, fmt.Sprintf("an outbox table (%s) is not in publication %s, or not wholly: inserts into it are not streamed", describeOutboxes(specs), dp.publications()))
		}
		var kafkaUp bool
		var kafkaErr error // the last failure, explained in /readyz
		if dp != nil {
			kafkaUp, kafkaErr = dp.kafka()
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

	var tracer pipeline.Tracer // nil unless the OTEL_* variables ask for traces
	if tracing.Enabled(os.Getenv) {
		t, shutdown, err := tracing.New(ctx, tracing.Config{Version: version, Log: log})
		if err != nil {
			return err
		}
		// Closed after the sink, which the relay adds later, so the spans
		// of the last acknowledgements are exported.
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

	// The registry is asked nothing here but for --schema-register-file:
	// schemas are fetched as the events need them, and a registry down at
	// start is waited for like one that goes down later.
	if err := c.withEncoders(ctx, specs, m, log); err != nil {
		return err
	}
	rcfg := c.relayConfig(specs, kafkaOpts, m, tracer)
	var shardMetrics *metrics.Shards
	if c.Shards > 1 {
		shardMetrics = m.Shards(reg)
		rcfg.ShardObserver = func(slot string) relay.Observer { return shardMetrics.Shard(slot) }
	}
	sh, err := relay.NewShards(ctx, rcfg, g, m, log)
	if err != nil {
		return err
	}
	if shardMetrics != nil {
		for _, r := range sh.Relays() {
			p := r.Parts()
			shardMetrics.Lag(r.Slot(), func() float64 { return max(0, float64(p.Stream.Received())-float64(p.Checkpoint.Confirmed())) })
		}
	}
	for _, r := range sh.Relays() {
		logPrepared(log, r.Slot(), r.Prepared())
	}
	parts.Store(newDataPath(sh))
	if c.saslMechanism() == saslPlain && !c.KafkaTLS {
		log.Warn("--kafka-sasl-mechanism=plain without --kafka-tls sends the Kafka password unencrypted; add --kafka-tls unless the network is encrypted otherwise")
	}
	return sh.Run(ctx)
}

// relayConfig is the stream's configuration from the flags; kafkaOpts are
// the Kafka clients' TLS and SASL options (kafkaSecurityOpts), m's hooks
// the producer's metrics.
func (c *runConfig) relayConfig(specs []outboxSpec, kafkaOpts []kgo.Opt, m *metrics.Metrics, tracer pipeline.Tracer) relay.Config {
	return relay.Config{
		PostgresURL:       c.PostgresURL,
		Slot:              c.Slot,
		Publication:       c.Publication,
		CreatePublication: c.CreatePublication,
		CreateSlot:        c.CreateSlot,
		RecreateSlot:      c.RecreateSlot,
		SlotFailover:      c.SlotFailover,
		Outboxes:          specs,
		MessagePrefix:     c.MessagePrefix,
		OnBadEvent:        c.OnBadEvent,
		DeadLetterTopic:   c.DeadLetterTopic,
		MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes:  int64(c.MaxInflightBytes),
		MaxRecordBytes:    c.MaxRecordBytes,
		StatusInterval:    c.StatusInterval,
		KeepaliveInterval: c.KeepaliveInterval,
		ReceiveTimeout:    c.ReceiveTimeout,
		ShutdownTimeout:   c.ShutdownTimeout,
		SlotPollInterval:  c.SlotPollInterval,
		Delivery:          c.Delivery,
		Kafka: sink.Config{
			Brokers:          c.brokers(),
			Linger:           c.KafkaLinger,
			Compression:      c.KafkaCompression,
			MaxRecordBytes:   c.MaxRecordBytes,
			AutoCreateTopics: c.KafkaAutoCreateTopics,
			Opts:             append([]kgo.Opt{kgo.WithHooks(m.Hooks()...)}, kafkaOpts...),
		},
		Admin:               sink.Config{Brokers: c.brokers(), Opts: kafkaOpts},
		CheckpointTopic:     c.CheckpointTopic,
		TransactionalID:     c.TransactionalID,
		TransactionInterval: c.TransactionInterval,
		Explain:             explain,
		Tracer:              tracer,
		StartAttrs:          []any{"kafka_tls", c.KafkaTLS, "kafka_sasl", c.saslMechanism()},
		Shards:              c.Shards,
		ShardKafkaOpts:      append([]kgo.Opt{kgo.WithHooks(m.ShardHooks()...)}, kafkaOpts...),
	}
}

// sources reads the data path's state for metrics; every value is zero
// until the data path exists. A stream split in shards reads as its worst
// shard: the lowest confirmed position, the oldest transaction not yet
// confirmed; counts are the shards' sums.
func sources(parts *atomic.Pointer[dataPath]) metrics.Sources {
	read := func(fn func(*dataPath) float64) func() float64 {
		return func() float64 {
			if dp := parts.Load(); dp != nil {
				return fn(dp)
			}
			return 0
		}
	}
	sum := func(fn func(relay.Parts) float64) func() float64 {
		return read(func(dp *dataPath) float64 { return dp.sum(fn) })
	}
	return metrics.Sources{
		Confirmed:           read(func(dp *dataPath) float64 { return float64(dp.confirmed()) }),
		Received:            read(func(dp *dataPath) float64 { return float64(dp.received()) }),
		Transactions:        sum(func(p relay.Parts) float64 { return float64(p.Checkpoint.Transactions()) }),
		InFlight:            sum(func(p relay.Parts) float64 { return float64(p.Pipeline.InFlight()) }),
		InFlightBytes:       sum(func(p relay.Parts) float64 { return float64(p.Pipeline.InFlightBytes()) }),
		PostgresReconnects:  sum(func(p relay.Parts) float64 { return float64(p.Stream.Reconnects()) }),
		StatusUpdates:       sum(func(p relay.Parts) float64 { return float64(p.Stream.StatusUpdates()) }),
		Checkpoint:          read(func(dp *dataPath) float64 { return float64(dp.checkpoint()) }),
		SkippedTransactions: sum(func(p relay.Parts) float64 { return float64(p.Pipeline.SkippedTransactions()) }),
		Epoch:               read(func(dp *dataPath) float64 { return float64(dp.epoch()) }),
		Outboxes: func() []metrics.Outbox {
			dp := parts.Load()
			if dp == nil {
				return nil
			}
			return dp.outboxes()
		},
		PostgresConnected: func() bool {
			dp := parts.Load()
			return dp != nil && dp.connected()
		},
		Oldest: func() (time.Time, bool) {
			if dp := parts.Load(); dp != nil {
				return dp.oldest()
			}
			return time.Time{}, false
		},
		Skipped: map[string]func() float64{
			decoder.SkipUpdate:      sum(func(p relay.Parts) float64 { return float64(p.Pipeline.Skipped().Update) }),
			decoder.SkipDelete:      sum(func(p relay.Parts) float64 { return float64(p.Pipeline.Skipped().Delete) }),
			decoder.SkipTruncate:    sum(func(p relay.Parts) float64 { return float64(p.Pipeline.Skipped().Truncate) }),
			decoder.SkipOtherTable:  sum(func(p relay.Parts) float64 { return float64(p.Pipeline.Skipped().OtherTable) }),
			decoder.SkipOtherPrefix: sum(func(p relay.Parts) float64 { return float64(p.Pipeline.Skipped().OtherPrefix) }),
		},
	}
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
