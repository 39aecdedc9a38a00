package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/idempotency"
)

// A service wraps its mutating routes. The handler writes the business row
// and its outbox event (outbox.Write in a real service) with
// idempotency.Tx; the middleware commits them together with the stored
// response. (Needs a database and a listener, so it is compiled but not
// run; the tests run the same code.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/shop") // with sql/idempotency.sql applied
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.Config{
		DB: pool,
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
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO payments (amount) VALUES ($1) RETURNING id`, in.Amount).Scan(&id); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: rolled back, key released
			return
		}
		payload, _ := json.Marshal(map[string]any{"id": id, "amount": in.Amount})
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'PaymentCreated', $2)`,
			fmt.Sprint(id), string(payload)); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		// The provider dedupes by this key: our retry is a safe retry of theirs.
		chargeKey := idempotency.DeriveKey(idempotency.RequestKey(ctx), "charge")
		if declined := charge(ctx, chargeKey, in.Amount); declined {
			// A 4xx rolls back the payment and its event; the 402 is stored.
			http.Error(w, "card declined", http.StatusPaymentRequired)
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
			if n, err := idempotency.Cleanup(ctx, pool, idempotency.DefaultTTL, 0); err != nil {
				log.Print(err)
			} else {
				log.Printf("deleted %d expired idempotency keys", n)
			}
		}
	}()
	log.Fatal(http.ListenAndServe(":8080", mux))
}

// charge stands for a payment provider's client.
func charge(ctx context.Context, key string, amount int) (declined bool) { return amount > 1_000_000 }

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

// New reports every problem with the Config at once.
func ExampleNew() {
	_, err := idempotency.New(idempotency.Config{Lease: 500 * time.Millisecond})
	fmt.Println(err)
	// Output:
	// idempotency: Config.DB: is nil
	// idempotency: Config.ClientID: is nil
	// idempotency: Config.Lease: is 500ms, under 1s
}

// A handler whose refusal is a change to keep: the failed attempt counts
// even though the answer is a 4xx.
func ExampleCommitClientError() {
	login := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx := idempotency.Tx(ctx)
		if _, err := tx.Exec(ctx, `UPDATE accounts SET failed_logins = failed_logins + 1 WHERE id = $1`, r.FormValue("account")); err != nil {
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		idempotency.CommitClientError(ctx) // keep the count with the 401
		http.Error(w, "wrong password", http.StatusUnauthorized)
	}
	_ = login
}
