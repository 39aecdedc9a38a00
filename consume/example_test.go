package consume_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
)

// A billing service creates an invoice for each PaymentCreated event. The
// invoice and the dedupe row commit in one transaction, so a redelivered
// event never creates a second invoice.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("BILLING_DATABASE_URL")) // holds processed_events (sql/processed_events.sql) and invoices
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	bill := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		var p struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		if err := json.Unmarshal(r.Value, &p); err != nil {
			return fmt.Errorf("payment %s: %w", r.Key, err) // retried, then dead-lettered
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (payment_id, amount, currency) VALUES ($1, $2, $3)`,
			string(r.Key), p.Amount, p.Currency)
		return err
	}

	c, err := consume.New(consume.Config{
		Brokers:         []string{"kafka-1:9092", "kafka-2:9092"},
		Group:           "billing",
		Topics:          []string{"outbox.event.payment"},
		Pool:            pool,
		Handler:         bill,
		MaxAttempts:     5,
		Backoff:         time.Second,
		OnFailure:       consume.DeadLetter,
		DeadLetterTopic: "billing.dead-letter",
		Registerer:      prometheus.DefaultRegisterer,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Trim the dedupe table once a day; keep rows longer than any
	// redelivery can be late (here: the topics keep 7 days).
	go func() {
		for range time.Tick(24 * time.Hour) {
			if _, err := consume.Cleanup(ctx, pool, 14*24*time.Hour, 1000); err != nil {
				log.Print(err)
			}
		}
	}()

	if err := c.Run(ctx); err != nil { // nil after SIGINT/SIGTERM
		log.Fatal(err)
	}
}
