package consume_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
)

// A billing service creates an invoice for each PaymentCreated event. The
// invoice and the dedupe row commit in one transaction, so a redelivered
// event never creates a second invoice. (Needs a database and a broker, so
// it is compiled but not run; the tests run the same code.)
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
		Brokers: []string{"kafka-1:9092", "kafka-2:9092"},
		Group:   "billing",
		// Two services' events: each source has its own ids, and the
		// dedupe tells them apart.
		Topics:          []string{"outbox.event.payment", "outbox.event.refund"},
		DB:              pool,
		Handler:         bill,
		InstanceID:      os.Getenv("POD_NAME"), // e.g. billing-0: a restarted pod resumes at once
		MaxAttempts:     5,
		Backoff:         time.Second,
		OnFailure:       consume.DeadLetter,
		DeadLetterTopic: "billing.dead-letter",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Trim the dedupe table once a day; keep rows longer than any
	// redelivery can be late (here: the topics keep 7 days).
	go func() {
		for range time.Tick(24 * time.Hour) {
			if _, err := consume.Cleanup(ctx, pool, 14*24*time.Hour, 0); err != nil {
				log.Print(err)
			}
		}
	}()

	if err := c.Run(ctx); err != nil { // nil after SIGINT/SIGTERM
		log.Fatal(err)
	}
}

// Hooks see every outcome: here, dead letters are logged for an alert.
// (The consumeprom module counts every outcome in Prometheus instead.)
func ExampleHooksFunc() {
	logger := slog.Default()
	hooks := consume.HooksFunc(func(o consume.Observation) {
		if o.Outcome == consume.DeadLettered {
			logger.Error("event dead-lettered", "group", o.Group, "source", o.Source, "event_id", o.EventID, "error", o.Err)
		}
	})
	_ = consume.Config{Hooks: hooks} // with the other fields, as in the package example
}

// A record that cannot be processed stops Run with a *RecordError naming
// the event and where it is; its offset is not committed.
func ExampleRecordError() {
	err := &consume.RecordError{
		Group: "billing", Source: "payments", EventID: "42",
		Topic: "outbox.event.payment", Partition: 0, Offset: 17,
		Stage: consume.StageHandler, Attempts: 3, Err: fmt.Errorf("invoice rejected"),
	}
	fmt.Println(err)
	// Output:
	// consume: group billing: event 42 from payments (topic outbox.event.payment, partition 0, offset 17): handler failed after 3 attempts: invoice rejected
}
