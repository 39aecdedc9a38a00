package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// Write the event in the transaction of the business write: both commit or
// neither does. (Needs a database, so it is compiled but not run; the tests
// run the same code.)
func ExampleWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/shop")
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay-42", 1200); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"amount": 1200, "currency": "EUR"})
		id, err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "payment",        // topic outbox.event.payment
			AggregateID:   "pay-42",         // Kafka key
			EventType:     "PaymentCreated", // header event_type
			Payload:       payload,
			Headers:       outbox.WithTraceparent(ctx, nil),
		})
		fmt.Println("event id", id) // the "id" header consumers dedupe by, e.g. "17"
		return err
	})
	if err != nil {
		panic(err)
	}
}

// The same with database/sql and a Writer for another table that deletes
// each row right after inserting it, so the table stays empty.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost/shop") // driver from github.com/jackc/pgx/v5/stdlib
	if err != nil {
		panic(err)
	}
	defer db.Close()
	w, err := outbox.New(outbox.Config{Table: "billing.events", DeleteAfterInsert: true})
	if err != nil {
		panic(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `UPDATE invoices SET paid = true WHERE id = $1`, "inv-9"); err != nil {
		panic(err)
	}
	if _, err := w.WriteSQL(ctx, tx, outbox.Event{
		AggregateType: "invoice", AggregateID: "inv-9", EventType: "InvoicePaid",
		Payload: json.RawMessage(`{"invoice":"inv-9"}`),
	}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
}

// An event the streamer could not publish is refused before anything is
// written: its aggregate type would make a topic Kafka does not accept.
// Write runs the same checks; Validate needs no database.
func ExampleValidate() {
	e := outbox.Event{
		AggregateType: "payments/eu",
		AggregateID:   "pay-42",
		EventType:     "PaymentCreated",
		Payload:       json.RawMessage(`{"amount": 1200}`),
	}
	err := outbox.Validate(e)
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent))
	fmt.Println(err)

	e.AggregateType = "payment.eu"
	fmt.Println(outbox.Validate(e))
	// Output:
	// true
	// outbox: invalid event: topic "outbox.event.payments/eu" contains '/'; Kafka topic names allow only a-z, A-Z, 0-9, '.', '_' and '-'
	// <nil>
}

// New checks the whole Config at once; each problem is a *ConfigError.
func ExampleNew() {
	_, err := outbox.New(outbox.Config{
		Table: "app.events.v2",
		Topic: "{tenant}.{aggregate_type}",
	})
	fmt.Println(err)
	var ce *outbox.ConfigError
	if errors.As(err, &ce) {
		fmt.Println("first problem:", ce.Field)
	}
	// Output:
	// outbox: Config.Table: "app.events.v2": invalid name syntax: 3 dot-separated parts; give table or schema.table (quote a part that contains a dot: "my.schema".outbox)
	// outbox: Config.Topic: placeholder {tenant} is none of the columns Write sets (aggregate_type, aggregate_id, event_type)
	// first problem: Table
}

// Middleware puts the request's traceparent into the context; the event
// then carries it to the consumer.
func ExampleWithTraceparent() {
	mw := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := outbox.ContextWithTraceparent(r.Context(), r.Header.Get("traceparent"))
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	_ = mw

	ctx := outbox.ContextWithTraceparent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	fmt.Println(outbox.WithTraceparent(ctx, map[string]string{"tenant": "acme"}))
	// A malformed traceparent is ignored, not stored.
	ctx = outbox.ContextWithTraceparent(context.Background(), "00-XYZ")
	fmt.Println(outbox.WithTraceparent(ctx, nil) == nil)
	// Output:
	// map[tenant:acme traceparent:00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01]
	// true
}

func ExampleValidateTraceparent() {
	fmt.Println(outbox.ValidateTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	fmt.Println(outbox.ValidateTraceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"))
	// Output:
	// <nil>
	// outbox: invalid traceparent "00-00000000000000000000000000000000-00f067aa0ba902b7-01": trace id is all zeros
}
