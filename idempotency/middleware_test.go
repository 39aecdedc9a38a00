package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cdc-outbox/cdc-outbox/idempotency/internal/pgtest"
)

// setup returns a pool to a fresh database holding sql/idempotency.sql (run
// twice: it must be safe to), sql/publication.sql, and a business table.
func setup(t *testing.T, cfg func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	url := pgtest.Database(t)
	for _, f := range []string{"../sql/idempotency.sql", "../sql/idempotency.sql", "../sql/publication.sql"} {
		ddl, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, url, string(ddl))
	}
	pgtest.Exec(t, url, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 20
	if cfg != nil {
		cfg(pc)
	}
	pool, err := pgxpool.NewWithConfig(pgtest.Context(t), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// shop is the service under test: POST /orders creates an order and its
// outbox event in the middleware's transaction.
type shop struct {
	runs   atomic.Int64
	before func(r *http.Request) // hook at the start of each run
	after  func(w http.ResponseWriter, r *http.Request) bool
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.runs.Add(1)
	if s.before != nil {
		s.before(r)
	}
	ctx := r.Context()
	tx := Tx(ctx)
	if tx == nil {
		http.Error(w, "no transaction", http.StatusTeapot)
		return
	}
	var in struct{ Item string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" {
		http.Error(w, "want {\"item\": \"...\"}", http.StatusBadRequest)
		return
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, in.Item).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// The event, as package outbox writes it (not imported: this module
	// depends on pgx alone).
	payload, _ := json.Marshal(map[string]any{"id": id, "item": in.Item})
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'OrderCreated', $2)`,
		strconv.FormatInt(id, 10), string(payload)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if s.after != nil && s.after(w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.Header().Set("X-Served-At", time.Now().Format(time.RFC3339Nano)) // not stored
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%d,"key":%q}`, id, RequestKey(ctx))
}

func clientHeader(r *http.Request) string { return r.Header.Get("X-Client") }

func newServer(t *testing.T, pool *pgxpool.Pool, cfg Config, h http.Handler) (*httptest.Server, *Middleware) {
	t.Helper()
	if cfg.ClientID == nil {
		cfg.ClientID = clientHeader
	}
	cfg.DB = pool
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Wrap(h))
	t.Cleanup(srv.Close)
	return srv, m
}

type response struct {
	code   int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get(HeaderReplayed) == "true" }

// do sends a request; key "" sends none. A header "X-Client" names the client.
func do(t *testing.T, srv *httptest.Server, method, path, key, client, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(HeaderKey, key)
	}
	req.Header.Set("X-Client", client)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{res.StatusCode, res.Header, string(b)}
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(pgtest.Context(t), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// work counts the business rows and the outbox rows, which must always
// match: they commit or roll back together.
func work(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	orders := count(t, pool, `SELECT count(*) FROM orders`)
	events := count(t, pool, `SELECT count(*) FROM outbox`)
	if orders != events {
		t.Fatalf("%d orders but %d outbox events", orders, events)
	}
	return orders
}

func keyStatus(t *testing.T, pool *pgxpool.Pool, client, key string) string {
	t.Helper()
	var s string
	err := pool.QueryRow(pgtest.Context(t), `SELECT status FROM idempotency_keys WHERE client_id = $1 AND key = $2`, client, key).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFirstRequestThenReplay(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, _ := newServer(t, pool, Config{}, app)

	first := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
	if first.code != http.StatusCreated || first.replayed() || first.header.Get("Location") != "/orders/1" ||
		first.header.Get("X-Served-At") == "" || first.header.Get("Content-Type") != "application/json" {
		t.Fatalf("first response: %+v", first)
	}
	if want := `{"id":1,"key":"` + DeriveKey("acme", "k1") + `"}`; first.body != want {
		t.Errorf("body %s, want %s (RequestKey = DeriveKey(client, key))", first.body, want)
	}
	if s := keyStatus(t, pool, "acme", "k1"); s != "completed" {
		t.Errorf("key status %s after the response, want completed", s)
	}

	for range 3 {
		again := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
		if again.code != first.code || again.body != first.body || !again.replayed() ||
			again.header.Get("Location") != "/orders/1" || again.header.Get("Content-Type") != "application/json" ||
			again.header.Get("X-Served-At") != "" {
			t.Errorf("replay: %+v; want the stored status, Content-Type, Location and body, and %s: true", again, HeaderReplayed)
		}
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 1 || n != 1 {
		t.Errorf("handler ran %d times, %d orders; want 1 and 1", runs, n)
	}

	// The same key from another client is another request.
	other := do(t, srv, "POST", "/orders", "k1", "globex", `{"item":"pen"}`)
	if other.code != http.StatusCreated || other.replayed() || other.header.Get("Location") != "/orders/2" {
		t.Errorf("other client, same key: %+v", other)
	}
}

func TestSameKeyOtherRequest(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, _ := newServer(t, pool, Config{}, app)

	if r := do(t, srv, "POST", "/orders?src=web", "k1", "acme", `{"item":"book"}`); r.code != http.StatusCreated {
		t.Fatalf("first: %+v", r)
	}
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/orders?src=web", `{"item":"lamp"}`},  // body
		{"POST", "/orders?src=app", `{"item":"book"}`},  // query
		{"POST", "/orders2?src=web", `{"item":"book"}`}, // path
		{"PUT", "/orders?src=web", `{"item":"book"}`},   // method
	} {
		r := do(t, srv, tc.method, tc.path, "k1", "acme", tc.body)
		if r.code != http.StatusUnprocessableEntity || !strings.Contains(r.body, "different request") || strings.Contains(r.body, `"id"`) {
			t.Errorf("%s %s %s with a used key: %d %q; want 422 and never the stored response", tc.method, tc.path, tc.body, r.code, r.body)
		}
	}
	if runs := app.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
}

func TestKeyRequired(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, _ := newServer(t, pool, Config{MaxBodyBytes: 64}, app)

	for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		r := do(t, srv, method, "/orders", "", "acme", `{"item":"book"}`)
		if r.code != http.StatusBadRequest || !strings.Contains(r.body, "Idempotency-Key") {
			t.Errorf("%s without a key: %d %q, want 400 naming the header", method, r.code, r.body)
		}
	}
	if r := do(t, srv, "POST", "/orders", strings.Repeat("k", 256), "acme", `{"item":"book"}`); r.code != http.StatusBadRequest {
		t.Errorf("256-byte key: %d, want 400", r.code)
	}
	if r := do(t, srv, "POST", "/orders", "k-big", "acme", `{"item":"`+strings.Repeat("x", 100)+`"}`); r.code != http.StatusRequestEntityTooLarge {
		t.Errorf("body over MaxBodyBytes: %d, want 413", r.code)
	}
	// Safe methods pass through, without a transaction.
	for _, method := range []string{"GET", "HEAD", "OPTIONS"} {
		if r := do(t, srv, method, "/orders", "", "acme", ""); r.code != http.StatusTeapot {
			t.Errorf("%s: %d, want the handler's 418 (it runs, with no transaction)", method, r.code)
		}
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 3 || n != 0 {
		t.Errorf("handler ran %d times, %d orders; want 3 (the safe methods) and 0", runs, n)
	}

	// AllowMissingKey: passed through without idempotency, still in a
	// transaction.
	lax, _ := newServer(t, pool, Config{AllowMissingKey: true}, app)
	for range 2 {
		if r := do(t, lax, "POST", "/orders", "", "acme", `{"item":"book"}`); r.code != http.StatusCreated || r.replayed() {
			t.Errorf("AllowMissingKey, no key: %+v, want 201 each time", r)
		}
	}
	if n := work(t, pool); n != 2 {
		t.Errorf("%d orders, want 2: without a key nothing is deduplicated", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM idempotency_keys`); n != 0 {
		t.Errorf("%d keys stored for requests without a key", n)
	}
}

// Fifty identical requests at once: the handler runs once, exactly one
// client gets the fresh 201, every other one a 409 or the replay.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{before: func(*http.Request) { time.Sleep(200 * time.Millisecond) }}
	srv, _ := newServer(t, pool, Config{}, app)
	srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 50

	const n = 50
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		resps = make([]response, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			resps[i] = do(t, srv, "POST", "/orders", "same", "acme", `{"item":"book"}`)
		})
	}
	close(start)
	wg.Wait()

	var fresh, replays, conflicts int
	for _, r := range resps {
		switch {
		case r.code == http.StatusCreated && !r.replayed():
			fresh++
		case r.code == http.StatusCreated:
			replays++
			if r.body != `{"id":1,"key":"`+DeriveKey("acme", "same")+`"}` {
				t.Errorf("replay body %q", r.body)
			}
		case r.code == http.StatusConflict:
			conflicts++
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > int(DefaultLease/time.Second) {
				t.Errorf("409 Retry-After %q, want 1..%d seconds", r.header.Get("Retry-After"), int(DefaultLease/time.Second))
			}
		default:
			t.Errorf("unexpected response %d %q", r.code, r.body)
		}
	}
	t.Logf("%d fresh, %d replays, %d conflicts", fresh, replays, conflicts)
	if fresh != 1 || fresh+replays+conflicts != n || conflicts == 0 {
		t.Errorf("%d fresh 201, %d replays, %d 409; want exactly 1 fresh and the rest 409 or replays (some 409s, as the handler takes 200ms)", fresh, replays, conflicts)
	}
	if runs, orders := app.runs.Load(), work(t, pool); runs != 1 || orders != 1 {
		t.Errorf("handler ran %d times, %d orders; want 1 and 1", runs, orders)
	}
}

// A panic rolls back the business row and the outbox event and releases
// the key: the retry runs, and the work happens once.
func TestPanicRollsBack(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	var panicked atomic.Bool
	app := &shop{after: func(http.ResponseWriter, *http.Request) bool {
		if panicked.CompareAndSwap(false, true) {
			panic("boom after the insert")
		}
		return false
	}}
	srv, _ := newServer(t, pool, Config{}, app)

	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`); r.code != http.StatusInternalServerError {
		t.Fatalf("panicking handler: %+v, want 500", r)
	}
	if n, s := work(t, pool), keyStatus(t, pool, "acme", "k1"); n != 0 || s != "absent" {
		t.Fatalf("after the panic: %d orders, key %s; want 0 and absent (released)", n, s)
	}
	r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
	if r.code != http.StatusCreated || r.replayed() {
		t.Fatalf("retry after the panic: %+v, want a fresh 201", r)
	}
	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`); !r.replayed() {
		t.Errorf("second retry: %+v, want the replay", r)
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 2 || n != 1 {
		t.Errorf("handler ran %d times, %d orders; want 2 (one panicked) and 1", runs, n)
	}
}

// A 5xx response rolls back and is passed on, not stored: the key is free
// for the retry.
func TestServerErrorRollsBack(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	app := &shop{after: func(w http.ResponseWriter, _ *http.Request) bool {
		if fail.Load() {
			http.Error(w, "provider down", http.StatusServiceUnavailable)
			return true
		}
		return false
	}}
	srv, _ := newServer(t, pool, Config{}, app)

	if r := do(t, srv, "POST", "/orders", "k5", "acme", `{"item":"book"}`); r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "provider down") {
		t.Fatalf("5xx: %+v, want the handler's 503", r)
	}
	if n, s := work(t, pool), keyStatus(t, pool, "acme", "k5"); n != 0 || s != "absent" {
		t.Fatalf("after a 503: %d orders, key %s; want 0 and absent", n, s)
	}
	fail.Store(false)
	if r := do(t, srv, "POST", "/orders", "k5", "acme", `{"item":"book"}`); r.code != http.StatusCreated || r.replayed() {
		t.Fatalf("retry after a 503: %+v, want a fresh 201", r)
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 2 || n != 1 {
		t.Errorf("handler ran %d times, %d orders; want 2 and 1", runs, n)
	}
}

// TestClientErrorRollsBack: a 4xx after the handler wrote its rows (the
// payment declined once the payment row and its event were written) rolls
// them back, and the 4xx is stored and replayed; CommitClientError keeps
// them; 408, 425 and 429 free the key like a 5xx.
func TestClientErrorRollsBack(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{after: func(w http.ResponseWriter, r *http.Request) bool {
		code, _ := strconv.Atoi(r.Header.Get("X-Answer"))
		if code == 0 {
			return false
		}
		if r.Header.Get("X-Commit") != "" {
			CommitClientError(r.Context())
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"refused":%d}`, code)
		return true
	}}
	srv, _ := newServer(t, pool, Config{}, app)
	send := func(key string, headers ...string) response {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(HeaderKey, key)
		req.Header.Set("X-Client", "acme")
		for i := 0; i < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return response{res.StatusCode, res.Header, string(b)}
	}

	// 402 after the writes: rolled back, stored, replayed without running.
	first := send("k402", "X-Answer", "402")
	if first.code != http.StatusPaymentRequired || first.body != `{"refused":402}` {
		t.Fatalf("402: %+v", first)
	}
	if n, s := work(t, pool), keyStatus(t, pool, "acme", "k402"); n != 0 || s != "completed" {
		t.Fatalf("after a 402: %d orders, key %s; want 0 (rolled back) and completed (the answer stored)", n, s)
	}
	again := send("k402") // the handler would now succeed: it must not run
	if again.code != http.StatusPaymentRequired || !again.replayed() || again.body != first.body || again.header.Get("Content-Type") != "application/json" {
		t.Errorf("retry of the 402: %+v, want the stored 402", again)
	}
	if runs := app.runs.Load(); runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}

	// CommitClientError: the 409 commits its writes, and is stored.
	if r := send("k409", "X-Answer", "409", "X-Commit", "1"); r.code != http.StatusConflict {
		t.Fatalf("409 with CommitClientError: %+v", r)
	}
	if n, s := work(t, pool), keyStatus(t, pool, "acme", "k409"); n != 1 || s != "completed" {
		t.Errorf("after a committed 409: %d orders, key %s; want 1 and completed", n, s)
	}
	if r := send("k409"); r.code != http.StatusConflict || !r.replayed() {
		t.Errorf("retry of the committed 409: %+v, want the replay", r)
	}

	// 408, 425, 429: come back later, so nothing is stored.
	for _, code := range []string{"408", "425", "429"} {
		key := "k" + code
		if r := send(key, "X-Answer", code); r.code != mustAtoi(code) || r.replayed() {
			t.Fatalf("%s: %+v", code, r)
		}
		if s := keyStatus(t, pool, "acme", key); s != "absent" {
			t.Errorf("after a %s: key %s, want absent (freed)", code, s)
		}
		if r := send(key); r.code != http.StatusCreated || r.replayed() {
			t.Errorf("retry after a %s: %+v, want a fresh 201", code, r)
		}
	}
	if n := work(t, pool); n != 4 {
		t.Errorf("%d orders, want 4 (the committed 409 and three retries)", n)
	}

	// A 4xx before any write (bad JSON) is stored the same way.
	bad := do(t, srv, "POST", "/orders", "k400", "acme", `{"nope":1}`)
	badAgain := do(t, srv, "POST", "/orders", "k400", "acme", `{"nope":1}`)
	if bad.code != http.StatusBadRequest || badAgain.code != http.StatusBadRequest || !badAgain.replayed() || badAgain.body != bad.body ||
		badAgain.header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("400: first %+v, retry %+v; want the 400 stored and replayed", bad, badAgain)
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestOneScope: a ClientID that returns "" for every request (one scope
// for all clients) works, and its requests get RequestKeys of their own.
func TestOneScope(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, _ := newServer(t, pool, Config{ClientID: func(*http.Request) string { return "" }}, app)
	first := do(t, srv, "POST", "/orders", "k1", "", `{"item":"book"}`)
	again := do(t, srv, "POST", "/orders", "k1", "", `{"item":"book"}`)
	other := do(t, srv, "POST", "/orders", "k2", "", `{"item":"book"}`)
	if first.code != http.StatusCreated || !again.replayed() || other.code != http.StatusCreated || other.replayed() {
		t.Fatalf("first %+v, again %+v, other key %+v", first, again, other)
	}
	if first.body == other.body || !strings.Contains(first.body, `"key":"`+deriveKey("", "k1")+`"`) {
		t.Errorf("bodies %s and %s: want each key's own RequestKey", first.body, other.body)
	}
}

// TestRequestKeyWithoutKey: under AllowMissingKey, each keyless request
// gets a RequestKey of its own, the same for the whole request, so keys
// derived from it never make two requests' provider calls look like one.
func TestRequestKeyWithoutKey(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	var mu sync.Mutex
	var derived []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k1, k2 := RequestKey(r.Context()), RequestKey(r.Context())
		if k1 == "" || k1 != k2 {
			http.Error(w, fmt.Sprintf("RequestKey %q then %q", k1, k2), http.StatusTeapot)
			return
		}
		mu.Lock()
		derived = append(derived, DeriveKey(k1, "charge"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv, _ := newServer(t, pool, Config{AllowMissingKey: true}, h)
	for range 3 {
		if r := do(t, srv, "POST", "/charges", "", "acme", `{"amount":1}`); r.code != http.StatusNoContent {
			t.Fatalf("keyless request: %+v", r)
		}
	}
	if r := do(t, srv, "POST", "/charges", "k1", "acme", `{"amount":1}`); r.code != http.StatusNoContent {
		t.Fatalf("request with a key: %+v", r)
	}
	slices.Sort(derived)
	if len(slices.Compact(slices.Clone(derived))) != 4 {
		t.Errorf("derived keys %q: want 4 different ones", derived)
	}
	if !slices.Contains(derived, DeriveKey(DeriveKey("acme", "k1"), "charge")) { // the keyed request's
		t.Errorf("derived keys %q lack the keyed request's stable one", derived)
	}
}

// A claim whose owner died (it claimed, then crashed: its transaction is
// gone, its claim is not) holds the key until the lease ends; then a retry
// takes it over and runs.
func TestExpiredLeaseIsTakenOver(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, m := newServer(t, pool, Config{}, app)
	ctx := pgtest.Context(t)

	body := `{"item":"book"}`
	req := httptest.NewRequest("POST", "/orders", nil)
	dead := &claim{client: "acme", key: "k1", hash: requestHash(req, []byte(body))}
	if res, err := m.store.claim(ctx, dead); err != nil || res.outcome != claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}

	r := do(t, srv, "POST", "/orders", "k1", "acme", body)
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); r.code != http.StatusConflict || ra < 5 || ra > 10 {
		t.Fatalf("during the dead claim's lease: %d, Retry-After %q; want 409 and about the 10s lease", r.code, r.header.Get("Retry-After"))
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"other"}`); r.code != http.StatusUnprocessableEntity {
		t.Errorf("expired lease, other body: %d, want 422 (the key stays bound to its request)", r.code)
	}
	if r := do(t, srv, "POST", "/orders", "k1", "acme", body); r.code != http.StatusCreated || r.replayed() {
		t.Fatalf("after the lease: %+v, want a fresh 201", r)
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 1 || n != 1 {
		t.Errorf("handler ran %d times, %d orders; want 1 and 1", runs, n)
	}

	// The dead owner, should it come back, can no longer lock or complete.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if owned, err := lock(ctx, tx, dead); owned || err != nil {
		t.Errorf("lock by the old owner: %v, %v; want false", owned, err)
	}
}

// A live owner keeps its key past its lease: its transaction locks the row,
// so a duplicate gets 409 and the handler never runs twice.
func TestLiveOwnerPastLease(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	app := &shop{before: func(r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			close(entered)
			<-release
		}
	}}
	srv, _ := newServer(t, pool, Config{Lease: time.Second}, app)

	slow := make(chan response)
	go func() {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set(HeaderKey, "k1")
		req.Header.Set("X-Client", "acme")
		req.Header.Set("X-Slow", "1")
		res, err := srv.Client().Do(req)
		if err != nil {
			slow <- response{code: -1, body: err.Error()}
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		slow <- response{res.StatusCode, res.Header, string(b)}
	}()
	<-entered
	// Wait out the lease (an UPDATE of locked_until would wait for the
	// owner's row lock: that lock is the point).
	for deadline := time.Now().Add(60 * time.Second); count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE locked_until < now()`) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the owner's lease did not run out within 60 s of its start")
		}
	}
	r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
	if r.code != http.StatusConflict || r.header.Get("Retry-After") != "1" {
		t.Errorf("duplicate while the owner runs past its lease: %d Retry-After %q, want 409 and 1", r.code, r.header.Get("Retry-After"))
	}
	close(release)
	if first := <-slow; first.code != http.StatusCreated {
		t.Fatalf("slow owner: %+v", first)
	}
	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`); !r.replayed() {
		t.Errorf("after the owner finished: %+v, want the replay", r)
	}
	if runs, n := app.runs.Load(), work(t, pool); runs != 1 || n != 1 {
		t.Errorf("handler ran %d times, %d orders; want 1 and 1", runs, n)
	}
}

// After the TTL a key is new again, whatever it was used for.
func TestExpiredKeyIsNew(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	app := &shop{}
	srv, _ := newServer(t, pool, Config{TTL: time.Hour}, app)
	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`); r.code != http.StatusCreated {
		t.Fatal(r)
	}
	if _, err := pool.Exec(pgtest.Context(t), `UPDATE idempotency_keys SET created_at = now() - interval '61 minutes'`); err != nil {
		t.Fatal(err)
	}
	if r := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"lamp"}`); r.code != http.StatusCreated || r.replayed() {
		t.Errorf("expired key, new body: %+v, want a fresh 201", r)
	}
	if n := work(t, pool); n != 2 {
		t.Errorf("%d orders, want 2", n)
	}
}

func TestStoredHeadersOption(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Order-Version", "3")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte("queued"))
	})
	srv, _ := newServer(t, pool, Config{StoredHeaders: []string{"x-order-version"}}, h)
	first := do(t, srv, "POST", "/orders", "k1", "acme", "")
	again := do(t, srv, "POST", "/orders", "k1", "acme", "")
	if first.header.Get("Location") == "" || again.code != http.StatusAccepted || again.body != "queued" ||
		again.header.Get("X-Order-Version") != "3" || again.header.Get("Location") != "" {
		t.Errorf("first %+v, replay %+v; want only X-Order-Version stored", first, again)
	}
}

func TestTxIsManaged(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	var commitErr, rollbackErr, nestedErr error
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := Tx(r.Context())
		commitErr, rollbackErr = tx.Commit(r.Context()), tx.Rollback(r.Context())
		// A savepoint is the handler's own to roll back.
		nestedErr = pgx.BeginFunc(r.Context(), tx, func(sp pgx.Tx) error {
			_, err := sp.Exec(r.Context(), `INSERT INTO orders (item) VALUES ('tentative')`)
			if err == nil {
				err = errors.New("changed my mind")
			}
			return err
		})
		w.WriteHeader(http.StatusNoContent)
	})
	srv, _ := newServer(t, pool, Config{}, h)
	if r := do(t, srv, "DELETE", "/orders/1", "k1", "acme", ""); r.code != http.StatusNoContent {
		t.Fatal(r)
	}
	if !errors.Is(commitErr, ErrTxManaged) || !errors.Is(rollbackErr, ErrTxManaged) || nestedErr == nil {
		t.Errorf("Commit %v, Rollback %v, savepoint %v", commitErr, rollbackErr, nestedErr)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Errorf("%d orders: the savepoint's insert should be rolled back", n)
	}
	if s := keyStatus(t, pool, "acme", "k1"); s != "completed" {
		t.Errorf("key %s, want completed", s)
	}
}

// Every statement works in pgx's simple protocol too (as behind PgBouncer).
func TestSimpleProtocol(t *testing.T) {
	t.Parallel()
	pool := setup(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	app := &shop{}
	srv, m := newServer(t, pool, Config{}, app)
	first := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
	again := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"book"}`)
	other := do(t, srv, "POST", "/orders", "k1", "acme", `{"item":"lamp"}`)
	if first.code != http.StatusCreated || !again.replayed() || again.body != first.body ||
		again.header.Get("Location") != "/orders/1" || other.code != http.StatusUnprocessableEntity {
		t.Errorf("first %+v, again %+v, other %+v", first, again, other)
	}
	// takeover and release
	dead := &claim{client: "acme", key: "k2", hash: requestHash(httptest.NewRequest("POST", "/orders", nil), []byte(`{"item":"x"}`))}
	ctx := pgtest.Context(t)
	if res, err := m.store.claim(ctx, dead); err != nil || res.outcome != claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE key = 'k2'`); err != nil {
		t.Fatal(err)
	}
	if r := do(t, srv, "POST", "/orders", "k2", "acme", `{"item":"x"}`); r.code != http.StatusCreated {
		t.Errorf("takeover: %+v", r)
	}
	if n, err := Cleanup(ctx, pool, time.Hour, 10); n != 0 || err != nil {
		t.Errorf("Cleanup: %d, %v", n, err)
	}
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	ctx := pgtest.Context(t)
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (client_id, key, request_hash, status, claim_token, locked_until, response_code, created_at)
		SELECT 'acme', 'old-' || i, '\x00'::bytea, 'completed', gen_random_uuid(), NULL::timestamptz, 201, now() - interval '25 hours' - i * interval '1 minute'
		FROM generate_series(1, 5) i
		UNION ALL
		SELECT 'acme', 'new-' || i, '\x00', 'completed', gen_random_uuid(), NULL::timestamptz, 201, now() - interval '23 hours'
		FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	// A key still locked by a running request is skipped, however old.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE key = 'old-3' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	n, err := Cleanup(ctx, pool, 24*time.Hour, 2)
	if err != nil || n != 4 {
		t.Errorf("Cleanup = %d, %v; want 4 (5 expired, one locked)", n, err)
	}
	_ = tx.Rollback(ctx)
	if n, err := Cleanup(ctx, pool, 24*time.Hour, 0); err != nil || n != 1 {
		t.Errorf("second Cleanup = %d, %v; want the 1 that was locked", n, err)
	}
	if left := count(t, pool, `SELECT count(*) FROM idempotency_keys WHERE key LIKE 'new-%'`); left != 3 ||
		count(t, pool, `SELECT count(*) FROM idempotency_keys`) != 3 {
		t.Errorf("%d fresh keys left, want all 3 and nothing else", left)
	}
	for _, bad := range []struct {
		older time.Duration
		batch int
		want  string
	}{{0, 10, "olderThan"}, {time.Hour, -1, "batchSize"}} {
		if _, err := Cleanup(ctx, pool, bad.older, bad.batch); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Cleanup(%v, %d) = %v, want an error about %s", bad.older, bad.batch, err, bad.want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := setup(t, nil)
	for _, tc := range []struct {
		cfg    Config
		fields string
	}{
		{Config{}, "DB,ClientID"},
		{Config{DB: (*pgxpool.Pool)(nil), ClientID: clientHeader}, "DB"},
		{Config{DB: pool, ClientID: clientHeader, Lease: time.Millisecond}, "Lease"},
		{Config{DB: pool, ClientID: clientHeader, Lease: time.Hour, TTL: time.Minute}, "TTL"},
		{Config{DB: pool, ClientID: clientHeader, MaxBodyBytes: -1}, "MaxBodyBytes"},
		{Config{ClientID: clientHeader, Lease: -time.Second, MaxBodyBytes: -1}, "DB,Lease,MaxBodyBytes"},
	} {
		_, err := New(tc.cfg)
		var fields []string
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				var ce *ConfigError
				if errors.As(e, &ce) {
					fields = append(fields, ce.Field)
				}
			}
		}
		if strings.Join(fields, ",") != tc.fields {
			t.Errorf("New(%+v) = %v; want *ConfigErrors for %s", tc.cfg, err, tc.fields)
		}
	}
}
