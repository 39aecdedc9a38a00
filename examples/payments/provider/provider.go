// Package provider is a fake card provider for the payments example: an
// http.Handler that charges cards into an in-memory map, and the Client the
// payments service calls it with.
//
// It behaves like a real provider's API in the one way the example is
// about: POST /charges needs an Idempotency-Key, and a repeated key gets the
// first answer again (the same charge, or the same decline) and never
// charges twice. That is what makes it safe for the payments service to
// call it inside a database transaction that may roll back: the retry of
// the whole request repeats the call with the same key (derived with
// idempotency.DeriveKey), and the provider does the work once.
//
//	POST /charges   {"account": "acct-1", "amount": 1200, "currency": "EUR", "reference": "pay_..."}
//	                201 the charge; 402 declined (amount above the limit);
//	                400 no key or a bad body; 422 the key was used for another request
//	GET  /charges   {"charges": n, "replays": n, "declines": n, "items": [...]}
package provider

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// HeaderKey and HeaderReplayed are the provider's idempotency headers (the
// same names as package idempotency's, as most providers use).
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// DefaultLimit is the largest amount (in minor units) New accepts before it
// declines, when given 0.
const DefaultLimit = 1_000_000

// ChargeRequest is the body of POST /charges.
type ChargeRequest struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`   // minor units, > 0
	Currency string `json:"currency"` // ISO 4217, e.g. "EUR"
	// Reference is the caller's id for what is paid (the payment id). It is
	// part of the request, so the caller must send the same one on a retry
	// (or get 422): the payments service derives its payment id from the
	// request's key for exactly that reason.
	Reference string `json:"reference"`
}

// Charge is a charge the provider made.
type Charge struct {
	ID        string    `json:"id"`
	Account   string    `json:"account"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Reference string    `json:"reference"`
	CreatedAt time.Time `json:"created_at"`
}

// Provider is the fake provider. Use New; it is safe for concurrent use.
type Provider struct {
	limit int64
	mux   *http.ServeMux

	mu       sync.Mutex
	byKey    map[string]*answer
	charges  []Charge
	replays  int
	declines int
}

// answer is what the provider replied to a key, kept to be replied again.
type answer struct {
	hash   [32]byte // of the request body: the same key with another body is refused
	status int
	body   []byte
}

// New returns a provider that declines amounts above limit (DefaultLimit
// when 0).
func New(limit int64) *Provider {
	if limit <= 0 {
		limit = DefaultLimit
	}
	p := &Provider{limit: limit, mux: http.NewServeMux(), byKey: map[string]*answer{}}
	p.mux.HandleFunc("POST /charges", p.charge)
	p.mux.HandleFunc("GET /charges", p.list)
	return p
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// Charges returns how many charges were made: declines and replays are not
// charges.
func (p *Provider) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// Replays returns how many requests repeated a key and got its first answer.
func (p *Provider) Replays() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replays
}

// List returns a copy of the charges made, oldest first.
func (p *Provider) List() []Charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Charge(nil), p.charges...)
}

func (p *Provider) charge(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.Header.Get(HeaderKey))
	if key == "" {
		reply(w, http.StatusBadRequest, errorBody("an Idempotency-Key header is required"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		reply(w, http.StatusBadRequest, errorBody("reading the body: "+err.Error()))
		return
	}
	hash := sha256.Sum256(body)

	// One lock around check, charge and record: two concurrent requests with
	// one key cannot both charge. (A real provider does this with a unique
	// key in its database.)
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.byKey[key]; ok {
		if a.hash != hash {
			reply(w, http.StatusUnprocessableEntity, errorBody("this Idempotency-Key was used for another request"))
			return
		}
		p.replays++
		w.Header().Set(HeaderReplayed, "true")
		reply(w, a.status, a.body)
		return
	}

	var req ChargeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		reply(w, http.StatusBadRequest, errorBody("bad body: "+err.Error()))
		return
	}
	if req.Account == "" || req.Amount <= 0 || len(req.Currency) != 3 {
		reply(w, http.StatusBadRequest, errorBody("account, amount > 0 and a 3-letter currency are required"))
		return
	}

	// Only answers that are final are remembered: a 400 above is about the
	// request, and a fixed request under the same key must still go through.
	a := &answer{hash: hash}
	if req.Amount > p.limit {
		p.declines++
		a.status, a.body = http.StatusPaymentRequired, errorBody(fmt.Sprintf("card declined: amount %d is above the limit %d", req.Amount, p.limit))
	} else {
		c := Charge{
			// Random, not a counter: a restarted fake provider must not
			// hand out the ids of charges it made before.
			ID:      "ch_" + strings.ToLower(rand.Text()[:16]),
			Account: req.Account, Amount: req.Amount, Currency: req.Currency, Reference: req.Reference,
			CreatedAt: time.Now().UTC(),
		}
		p.charges = append(p.charges, c)
		a.status = http.StatusCreated
		a.body, _ = json.Marshal(c)
	}
	p.byKey[key] = a
	reply(w, a.status, a.body)
}

func (p *Provider) list(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	out := struct {
		Charges  int      `json:"charges"`
		Replays  int      `json:"replays"`
		Declines int      `json:"declines"`
		Items    []Charge `json:"items"`
	}{len(p.charges), p.replays, p.declines, append([]Charge{}, p.charges...)}
	p.mu.Unlock()
	b, _ := json.Marshal(out)
	reply(w, http.StatusOK, b)
}

func errorBody(msg string) []byte {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return b
}

func reply(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// Client calls a provider over HTTP.
type Client struct {
	BaseURL string       // e.g. "http://127.0.0.1:8081"
	HTTP    *http.Client // nil means a client with a 10s timeout
}

// DeclinedError is a charge the provider refused for good (402): retrying
// it, with this key or another, will not help.
type DeclinedError struct{ Reason string }

func (e *DeclinedError) Error() string { return "provider declined the charge: " + e.Reason }

var defaultHTTP = &http.Client{Timeout: 10 * time.Second}

// Charge asks the provider to charge req under key. Call it again with the
// same key and request after any error but a *DeclinedError: the provider
// charges at most once per key, so a lost response is safe to retry.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Charge{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(HeaderKey, key)
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(hr)
	if err != nil {
		return Charge{}, fmt.Errorf("provider: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Charge{}, fmt.Errorf("provider: reading the response: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusOK:
		var ch Charge
		if err := json.Unmarshal(b, &ch); err != nil || ch.ID == "" {
			return Charge{}, fmt.Errorf("provider: unexpected charge %q: %v", b, err)
		}
		return ch, nil
	case resp.StatusCode == http.StatusPaymentRequired:
		var e struct{ Error string }
		_ = json.Unmarshal(b, &e)
		return Charge{}, &DeclinedError{Reason: e.Error}
	default:
		return Charge{}, fmt.Errorf("provider: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
}
