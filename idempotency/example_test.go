package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/idempotency"
	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// A service wraps its mutating routes. The handler writes the business row
// and the outbox event with idempotency.Tx; the middleware commits them
// together with the stored response. (Needs a database and a listener, so
// it is compiled but not run; the tests run the same code.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/shop") // with sql/idempotency.sql applied
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(pool, idempotency.Options{
		// After authentication: the caller's account scopes its keys.
		ClientID: func(r *http.Request) string { return r.Header.Get("X-Account-Id") },
	})
	if err != nil {
		log.Fatal(err)
	}

	createPayment := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx := idempotency.Tx(ctx)
		var in struct{ Amount int }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
			http.Error(w, "want {\"amount\": n > 0}", http.StatusBadRequest) // stored: a retry gets it too
			return
		}
		// The provider dedupes by this key: our retry is a safe retry of theirs.
		providerKey := idempotency.DeriveKey(idempotency.RequestKey(ctx), "charge")
		_ = providerKey // provider.Charge(ctx, in.Amount, providerKey); on failure respond 502: all rolls back

		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO payments (amount) VALUES ($1) RETURNING id`, in.Amount).Scan(&id); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: rolled back, key released
			return
		}
		payload, _ := json.Marshal(map[string]any{"id": id, "amount": in.Amount})
		if _, err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "payment", AggregateID: strconv.FormatInt(id, 10), EventType: "PaymentCreated",
			Payload: payload, Headers: outbox.WithTraceparent(ctx, nil),
		}); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
		w.WriteHeader(http.StatusCreated)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Wrap(http.HandlerFunc(createPayment)))

	// Forget keys after their TTL.
	go func() {
		for range time.Tick(time.Hour) {
			if n, err := idempotency.Cleanup(ctx, pool, idempotency.DefaultTTL, 1000); err != nil {
				log.Print(err)
			} else {
				log.Printf("deleted %d expired idempotency keys", n)
			}
		}
	}()
	log.Fatal(http.ListenAndServe(":8080", mux))
}

func ExampleDeriveKey() {
	// The same request key and purpose always give the same key...
	fmt.Println(idempotency.DeriveKey("order-7", "charge"))
	fmt.Println(idempotency.DeriveKey("order-7", "charge"))
	// ...another purpose another one.
	fmt.Println(idempotency.DeriveKey("order-7", "refund"))
	// Output:
	// 60ad3136-0807-8dff-9af5-4df446cc7b4b
	// 60ad3136-0807-8dff-9af5-4df446cc7b4b
	// 0f814485-5ab0-8f68-9742-40621b15de5c
}
