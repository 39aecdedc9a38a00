// Command payments is the example payment service: POST /payments creates a
// payment, charges the card at the provider and writes a PaymentCreated
// event to the outbox, effectively once per Idempotency-Key. See
// examples/README.md for the walk-through and package payments for how.
//
//	go run ./examples/payments --postgres-url "$PAYMENTS_DB" --provider-url http://127.0.0.1:8081
//
// Every flag can also be set from the environment: PAYMENTS_POSTGRES_URL,
// PAYMENTS_LISTEN, PAYMENTS_PROVIDER_URL. The database needs
// sql/publication.sql, sql/idempotency.sql and examples/payments/schema.sql.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/examples/payments/payments"
	"github.com/cdc-outbox/cdc-outbox/examples/payments/provider"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
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
	postgresURL := flag.String("postgres-url", envOr("PAYMENTS_POSTGRES_URL", ""), "PostgreSQL URL of the payments database (env PAYMENTS_POSTGRES_URL)")
	listen := flag.String("listen", envOr("PAYMENTS_LISTEN", "127.0.0.1:8000"), "address to serve the API on (env PAYMENTS_LISTEN)")
	providerURL := flag.String("provider-url", envOr("PAYMENTS_PROVIDER_URL", "http://127.0.0.1:8081"), "base URL of the card provider, e.g. examples/payments/fakeprovider (env PAYMENTS_PROVIDER_URL)")
	outboxKind := flag.String("outbox", envOr("PAYMENTS_OUTBOX", "table"), "how events are written: table (outbox.Write, a row of the outbox table) "+
		"or message (outbox.Emit, a logical decoding message, no table) (env PAYMENTS_OUTBOX)")
	flag.Parse()
	if *outboxKind != "table" && *outboxKind != "message" {
		return fmt.Errorf("--outbox %q: use table or message", *outboxKind)
	}
	if *postgresURL == "" {
		return errors.New("--postgres-url (or PAYMENTS_POSTGRES_URL) is required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := pgxpool.New(ctx, *postgresURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	h, err := payments.NewHandler(payments.Config{
		Pool:     pool,
		Provider: &provider.Client{BaseURL: *providerURL},
		Logger:   log,
		Messages: *outboxKind == "message",
	})
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("serving POST /payments and GET /payments/{id}", "addr", *listen, "provider", *providerURL)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Let requests in flight finish: each one either commits with its
	// stored response or rolls back, and the client's retry copes with both.
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
