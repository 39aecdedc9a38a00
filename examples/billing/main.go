// Command billing is the example consumer: it reads the PaymentCreated
// events cdc-outbox publishes and creates one invoice per payment, exactly
// once, with package consume (see package billing for the handler and
// examples/README.md for the walk-through).
//
//	go run ./examples/billing --postgres-url "$BILLING_DB" --kafka-brokers 127.0.0.1:9092
//
// Every flag can also be set from the environment: BILLING_POSTGRES_URL,
// BILLING_KAFKA_BROKERS, BILLING_TOPIC, BILLING_GROUP, BILLING_INSTANCE_ID,
// BILLING_HTTP_ADDR. The database needs sql/processed_events.sql and
// examples/billing/schema.sql.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeprom"
	"github.com/cdc-outbox/cdc-outbox/examples/billing/billing"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func run() error {
	postgresURL := flag.String("postgres-url", envOr("BILLING_POSTGRES_URL", ""), "PostgreSQL URL of billing's database (env BILLING_POSTGRES_URL)")
	brokers := flag.String("kafka-brokers", envOr("BILLING_KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka bootstrap brokers, comma-separated (env BILLING_KAFKA_BROKERS)")
	topic := flag.String("topic", envOr("BILLING_TOPIC", "outbox.event.payment"), "topic of the payment events: cdc-outbox's --topic for aggregate type payment (env BILLING_TOPIC)")
	group := flag.String("group", envOr("BILLING_GROUP", "billing"), "consumer group, also the dedupe scope in processed_events; keep it stable (env BILLING_GROUP)")
	instanceID := flag.String("instance-id", envOr("BILLING_INSTANCE_ID", ""), "static group membership id, stable across restarts of this instance and unique among instances, e.g. the pod name: a restarted instance then resumes at once instead of waiting for the group to time the old one out (env BILLING_INSTANCE_ID)")
	httpAddr := flag.String("http-addr", envOr("BILLING_HTTP_ADDR", ""), "address to serve /metrics on, e.g. 127.0.0.1:9091; empty: none (env BILLING_HTTP_ADDR)")
	flag.Parse()
	if *postgresURL == "" {
		return errors.New("--postgres-url (or BILLING_POSTGRES_URL) is required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, *postgresURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	metrics, err := consumeprom.New(reg)
	if err != nil {
		return err
	}
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return err
		}
		log.Info("serving /metrics", "addr", ln.Addr().String())
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}

	c, err := consume.New(consume.Config{
		Brokers: strings.Split(*brokers, ","),
		Group:   *group,
		Topics:  []string{*topic},
		DB:      pool,
		Handler: billing.Handle,
		// Without it, a consumer that died without leaving the group (kill
		// -9, OOM, node loss) keeps its partitions until its session times
		// out (45s by default): its replacement waits that long.
		InstanceID: *instanceID,
		Hooks:      metrics,
		Logger:     log,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	// Run returns nil after SIGINT/SIGTERM, having committed the offsets of
	// everything it processed. A crash skips that commit: the next run gets
	// those records again and skips them as duplicates.
	return c.Run(ctx)
}
