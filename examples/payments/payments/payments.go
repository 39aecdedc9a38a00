// Package payments is the HTTP API of the payments example: POST /payments
// creates a payment, charges the card at the provider and emits a
// PaymentCreated event, all effectively once per Idempotency-Key, however
// often the client retries.
//
// How the three libraries fit together in one request:
//
//   - idempotency (middleware) claims the key and runs the handler in a
//     transaction (idempotency.Tx) that also stores the response; a retry of
//     a completed request gets that response again (Idempotent-Replayed),
//     a refused one (4xx: a declined card) left nothing behind but its
//     stored answer, and a request that failed (5xx) rolled back
//     everything, so its retry starts from scratch.
//   - outbox.Write adds the PaymentCreated event to that same transaction:
//     the event exists if and only if the payment does; cdc-outbox streams
//     it to Kafka after the commit.
//   - the card provider cannot join our transaction, so it is called with
//     its own idempotency key, derived from ours (idempotency.DeriveKey): when
//     our transaction rolls back after the provider charged (our commit
//     failed, we crashed, the provider's answer was lost), the retry asks
//     again with the same key and gets the same charge instead of a second
//     one.
package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/examples/payments/provider"
	"github.com/cdc-outbox/cdc-outbox/idempotency"
	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// Aggregate type and event type of the events this service writes. The
// aggregate type picks the topic: outbox.event.payment under cdc-outbox's
// default --topic template.
const (
	AggregateType = "payment"
	EventCreated  = "PaymentCreated"
)

// Payment is a row of the payments table and what the API returns.
type Payment struct {
	ID        string    `json:"id"`
	Account   string    `json:"account"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	ChargeID  string    `json:"charge_id"`
	CreatedAt time.Time `json:"created_at"`
}

// Created is the payload of a PaymentCreated event (the Kafka record value).
type Created struct {
	PaymentID string    `json:"payment_id"`
	Account   string    `json:"account"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	CreatedAt time.Time `json:"created_at"`
}

// Config configures the handler.
type Config struct {
	// Pool reaches the database with the payments table (schema.sql), the
	// outbox table (sql/publication.sql) and idempotency_keys
	// (sql/idempotency.sql): they must share a database to share a
	// transaction.
	Pool *pgxpool.Pool
	// Provider is the card provider's client.
	Provider *provider.Client
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Messages writes the events without the outbox table, as
	// transactional logical decoding messages (outbox.Emit), which
	// cdc-outbox publishes as it publishes rows: less work per payment for
	// PostgreSQL, but no row to query or republish (docs/messages.md).
	Messages bool
}

type service struct {
	pool     *pgxpool.Pool
	provider *provider.Client
	log      *slog.Logger
	messages bool
}

// NewHandler returns the API:
//
//	POST /payments        {"account": "acct-1", "amount": 1200, "currency": "EUR"}, with an Idempotency-Key
//	GET  /payments/{id}
func NewHandler(cfg Config) (http.Handler, error) {
	if cfg.Pool == nil || cfg.Provider == nil {
		return nil, errors.New("payments: Pool and Provider are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &service{pool: cfg.Pool, provider: cfg.Provider, log: cfg.Logger, messages: cfg.Messages}
	mw, err := idempotency.New(idempotency.Config{
		DB: cfg.Pool,
		// One scope for every caller, since the example has no
		// authentication. A real service returns the authenticated client
		// here, so that one client's key can never replay another's
		// response.
		ClientID: func(*http.Request) string { return "" },
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Wrap(http.HandlerFunc(s.create)))
	mux.HandleFunc("GET /payments/{id}", s.get)
	return mux, nil
}

type createRequest struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func (in createRequest) validate() error {
	switch {
	case in.Account == "" || len(in.Account) > 100:
		return errors.New("account is required (at most 100 characters)")
	case in.Amount <= 0:
		return errors.New("amount must be a positive number of minor units (cents)")
	case !isCurrency(in.Currency):
		return errors.New(`currency must be three capital letters, e.g. "EUR"`)
	}
	return nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// create runs inside the idempotency middleware: once per key to
// completion. A 2xx commits its writes with the stored answer; a 4xx rolls
// its writes back and stores the answer, so a declined payment leaves no
// payment and no event; a 5xx rolls everything back and frees the key for
// the client's retry.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var in createRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		respondError(w, http.StatusBadRequest, "bad JSON body: "+err.Error())
		return
	}
	if err := in.validate(); err != nil {
		// Stored with the key: a retry of the same body gets the same 400.
		respondError(w, http.StatusBadRequest, err.Error())
		return
	}

	tx := idempotency.Tx(ctx)
	if tx == nil {
		// Only without the middleware: a bug here.
		respondError(w, http.StatusInternalServerError, "no idempotency transaction")
		return
	}
	key := idempotency.RequestKey(ctx)
	// The payment id is derived from the request's key rather than random,
	// so a retry after a rollback inserts the same payment and sends the
	// provider the same reference: the same request, which the provider
	// must see under the same key (it refuses a key reused for a different
	// request).
	p := Payment{
		ID:      "pay_" + idempotency.DeriveKey(key, "payment"),
		Account: in.Account, Amount: in.Amount, Currency: in.Currency,
	}

	err := tx.QueryRow(ctx, `INSERT INTO payments (id, account, amount, currency) VALUES ($1, $2, $3, $4)
		RETURNING created_at`, p.ID, p.Account, p.Amount, p.Currency).Scan(&p.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// The id is derived from the key, so this is the key again after
		// it expired (idempotency.Config.TTL) and was forgotten. Refuse
		// it, as the middleware refuses a reused key (422).
		respondError(w, http.StatusUnprocessableEntity, "this Idempotency-Key already created payment "+p.ID)
		return
	}
	if err != nil {
		s.fail(w, "insert payment", err)
		return
	}
	payload, err := json.Marshal(Created{PaymentID: p.ID, Account: p.Account, Amount: p.Amount, Currency: p.Currency, CreatedAt: p.CreatedAt})
	if err != nil {
		s.fail(w, "encode event", err)
		return
	}
	// In the same transaction: the event commits with the payment or not at
	// all. Its id (the Kafka header "id") is what consumers dedupe by.
	// Written as a row or as a message, it becomes the same record.
	write := outbox.Write
	if s.messages {
		write = outbox.Emit
	}
	if _, err := write(ctx, tx, outbox.Event{
		AggregateType: AggregateType,
		AggregateID:   p.ID, // the record key: a payment's events stay in order
		EventType:     EventCreated,
		Payload:       payload,
		Headers:       outbox.WithTraceparent(ctx, nil),
	}); err != nil {
		s.fail(w, "write outbox event", err)
		return
	}

	// Charge last, once everything of ours that can fail has been written:
	// a failing insert never reaches the card. It is still before the
	// commit, so no payment commits without its charge; and a charge whose
	// payment rolls back is not lost but found again by the retry, under
	// the same derived key.
	ch, err := s.provider.Charge(ctx, idempotency.DeriveKey(key, "charge"), provider.ChargeRequest{
		Account: p.Account, Amount: p.Amount, Currency: p.Currency, Reference: p.ID,
	})
	var declined *provider.DeclinedError
	if errors.As(err, &declined) {
		// A 4xx: the middleware rolls back the payment and its event, and
		// stores the decline under the key, so a retry gets the same
		// answer (the provider would answer it the same way anyway).
		respondError(w, http.StatusPaymentRequired, declined.Reason)
		return
	}
	if err != nil {
		// 502: the middleware rolls back the payment and its event and
		// frees the key. The client retries with the same key; if the
		// provider did charge, it returns that charge.
		s.log.WarnContext(ctx, "charge failed; rolled back, the client may retry", "payment_id", p.ID, "error", err)
		respondError(w, http.StatusBadGateway, "the card provider did not answer; retry with the same Idempotency-Key")
		return
	}
	p.ChargeID = ch.ID
	if _, err := tx.Exec(ctx, `UPDATE payments SET charge_id = $1 WHERE id = $2`, ch.ID, p.ID); err != nil {
		s.fail(w, "record charge", err)
		return
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	respondJSON(w, http.StatusCreated, p)
}

func (s *service) get(w http.ResponseWriter, r *http.Request) {
	var p Payment
	err := s.pool.QueryRow(r.Context(), `SELECT id, account, amount, currency, coalesce(charge_id, ''), created_at
		FROM payments WHERE id = $1`, r.PathValue("id")).Scan(&p.ID, &p.Account, &p.Amount, &p.Currency, &p.ChargeID, &p.CreatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		respondError(w, http.StatusNotFound, "no such payment")
	case err != nil:
		s.fail(w, "read payment", err)
	default:
		respondJSON(w, http.StatusOK, p)
	}
}

// fail answers 500, which makes the middleware roll back the request's
// transaction and free its key.
func (s *service) fail(w http.ResponseWriter, what string, err error) {
	s.log.Error("payments: "+what, "error", err)
	respondError(w, http.StatusInternalServerError, fmt.Sprintf("internal error (%s); retry with the same Idempotency-Key", what))
}

func respondJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func respondError(w http.ResponseWriter, status int, msg string) {
	respondJSON(w, status, map[string]string{"error": msg})
}
