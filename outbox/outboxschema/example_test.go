package outboxschema_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/outbox"
	"github.com/cdc-outbox/cdc-outbox/outbox/outboxschema"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// Check the event against its subject's schema inside the transaction of
// the business write, and answer the caller by the outcome. (Compiled, not
// run: it needs a database and a registry; the tests run the same code.)
func ExampleWriter_Write() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/shop")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: "http://registry:8080/apis/ccompat/v7"})
	if err != nil {
		panic(err)
	}
	ow, err := outbox.New(outbox.Config{}) // the streamer's table and --topic
	if err != nil {
		panic(err)
	}
	w, err := outboxschema.New(ow, reg, outboxschema.Config{
		// The streamer's value format settings of this outbox.
		Schema: schema.Config{Format: schema.Avro, Strategy: schema.TopicName, Refresh: time.Minute},
	})
	if err != nil {
		panic(err)
	}

	status := http.StatusCreated
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay-42", 1200); err != nil {
			return err
		}
		_, err := w.Write(ctx, tx, outbox.Event{
			AggregateType: "payment", AggregateID: "pay-42", EventType: "PaymentCreated",
			Payload: json.RawMessage(`{"id": "pay-42", "amount": 1200}`),
		})
		return err // a refused event rolls the payment back too
	})
	switch {
	case errors.Is(err, outbox.ErrInvalidEvent):
		status = http.StatusUnprocessableEntity // the payload does not fit: the error says where
	case errors.Is(err, outboxschema.ErrRegistryUnavailable):
		status = http.StatusServiceUnavailable // the caller retries
	case err != nil:
		status = http.StatusInternalServerError
	}
	_ = status
}
