package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Header names the middleware reads and writes.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed" // "true" on a stored response served again
)

// Defaults for the zero fields of Config.
const (
	DefaultLease        = 10 * time.Second
	DefaultTTL          = 24 * time.Hour
	DefaultMaxBodyBytes = 1 << 20
)

// DefaultStoredHeaders are the response headers kept for replays.
var DefaultStoredHeaders = []string{"Content-Type", "Location"}

// DB is what the middleware needs of the database: a *pgxpool.Pool, or a
// wrapper of one. It must be safe for concurrent use (so not a single
// *pgx.Conn): requests claim keys and begin transactions on it at once.
// The claim runs on it outside any transaction, to be seen at once.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures the middleware. DB and ClientID are required; the zero
// value of every other field means its default.
type Config struct {
	// DB reaches the database with the table of sql/idempotency.sql and the
	// service's own tables: the handler's transaction (Tx) is a transaction
	// of DB, so the business rows, the outbox event and the stored
	// response commit together.
	DB DB

	// ClientID returns the caller's identity, e.g. the authenticated
	// account or API key id (so run the middleware after authentication).
	// Keys are scoped by it: one client can neither collide with another's
	// key nor be served its response. Returning "" for every request puts
	// all clients in one scope. It must not contain a NUL byte.
	ClientID func(*http.Request) string

	// AllowMissingKey lets a mutating request without an Idempotency-Key
	// through without idempotency (it is not deduplicated) instead of
	// answering 400. The handler still runs in a transaction from Tx, ended
	// by its status as with a key, so it has one code path either way;
	// RequestKey then returns a random key of its own for the request.
	AllowMissingKey bool

	// Lease is how long a new claim holds its key against duplicates (409)
	// before a retry may take it over; default 10s, at least 1s. A live
	// request keeps its key past the lease anyway (its transaction locks
	// the row), so the lease only bounds how long a crashed request blocks
	// retries, and sets Retry-After. Keep it above the time from claim to
	// BEGIN under load (pool waits).
	Lease time.Duration

	// TTL is how long a key is remembered, from its claim; default 24h,
	// longer than Lease. An expired key is a new key. Pass the same value
	// to Cleanup.
	TTL time.Duration

	// StoredHeaders are the response headers stored and replayed; nil means
	// DefaultStoredHeaders, an empty slice none. The first response carries
	// every header the handler set.
	StoredHeaders []string

	// MaxBodyBytes bounds the request body read to hash it; a larger body
	// gets 413. Default 1 MiB.
	MaxBodyBytes int64

	// TxOptions are the handler transaction's options (isolation level,
	// ...). A serialization failure at commit is a 500 and releases the
	// key, so the client's retry runs again.
	TxOptions pgx.TxOptions

	// Logger receives database errors and handler panics (the error under
	// the key "error"); default slog.Default().
	Logger *slog.Logger
}

// validate is the one place Config is checked. It fills in defaults and
// returns every problem at once.
func (cfg *Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if p, ok := cfg.DB.(*pgxpool.Pool); cfg.DB == nil || ok && p == nil {
		bad("DB", "is nil")
	}
	if cfg.ClientID == nil {
		bad("ClientID", "is nil")
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.StoredHeaders == nil {
		cfg.StoredHeaders = DefaultStoredHeaders
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Lease < time.Second {
		bad("Lease", "is %v, under 1s", cfg.Lease)
	}
	if cfg.TTL <= cfg.Lease {
		bad("TTL", "is %v, not longer than Lease (%v)", cfg.TTL, cfg.Lease)
	}
	if cfg.MaxBodyBytes < 0 {
		bad("MaxBodyBytes", "is negative (%d)", cfg.MaxBodyBytes)
	}
	return errors.Join(errs...)
}

// Middleware is the idempotency middleware; build it with New and use Wrap.
type Middleware struct {
	store  store
	cfg    Config
	stored []string // canonical header names
}

// New checks cfg and returns the middleware. Every problem with cfg is a
// *ConfigError; they are returned joined.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Middleware{
		store: store{db: cfg.DB, lease: cfg.Lease, ttl: cfg.TTL},
		cfg:   cfg,
	}
	for _, h := range cfg.StoredHeaders {
		m.stored = append(m.stored, http.CanonicalHeaderKey(h))
	}
	return m, nil
}

type ctxKey struct{}

// reqState is what a handler can reach through its context.
type reqState struct {
	tx                pgx.Tx
	requestKey        string
	commitClientError bool
}

// Tx returns the transaction the middleware runs the handler in, or nil
// outside a mutating request (GET, HEAD, OPTIONS, TRACE, or no middleware).
// Write the business rows and the outbox event with it. Do not Commit or
// Rollback it (ErrTxManaged); the response's status decides:
//
//   - 2xx and 3xx: the writes commit together with the stored response.
//   - 4xx: the writes roll back, and the response is stored on its own, so
//     a retry gets it again: a refused request changes nothing, wherever
//     the handler found the problem. CommitClientError makes a 4xx commit
//     like a 2xx. 408, 425 and 429 ask the client to try again later: they
//     roll back and free the key, like a 5xx.
//   - 5xx (or a panic): the writes roll back and the key is freed, so the
//     client's retry runs the handler again.
func Tx(ctx context.Context) pgx.Tx {
	if s, ok := ctx.Value(ctxKey{}).(*reqState); ok {
		return s.tx
	}
	return nil
}

// CommitClientError makes a 4xx response of this request commit the
// handler's writes, as a 2xx does, for the rare handler whose refusal is
// itself a change to keep (a failed attempt counted, a request recorded as
// rejected). Outside a request of the middleware it does nothing.
func CommitClientError(ctx context.Context) {
	if s, ok := ctx.Value(ctxKey{}).(*reqState); ok {
		s.commitClientError = true
	}
}

// RequestKey returns a key that identifies this request, for DeriveKey to
// derive the keys of calls to other services. With an Idempotency-Key it is
// stable across the client's retries: derived from the client id and the
// key as DeriveKey(clientID, key) would be. Without one
// (AllowMissingKey) it is random, generated once per request: a request
// without a key is never a retry, so its calls must never look like
// retries of another request's. Outside a mutating request of the
// middleware it is "", which DeriveKey refuses.
func RequestKey(ctx context.Context) string {
	if s, ok := ctx.Value(ctxKey{}).(*reqState); ok {
		return s.requestKey
	}
	return ""
}

// managedTx is the handler's view of the transaction: everything but
// Commit and Rollback, which belong to the middleware.
type managedTx struct{ pgx.Tx }

func (managedTx) Commit(context.Context) error   { return ErrTxManaged }
func (managedTx) Rollback(context.Context) error { return ErrTxManaged }

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace
}

// Wrap returns h behind the middleware. See the package documentation for
// what happens to each request.
func (m *Middleware) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if safeMethod(r.Method) {
			h.ServeHTTP(w, r)
			return
		}
		values := r.Header.Values(HeaderKey)
		if len(values) == 0 {
			if !m.cfg.AllowMissingKey {
				http.Error(w, msgMissingKey, http.StatusBadRequest)
				return
			}
			m.run(w, r, h, nil)
			return
		}
		key, ok := parseKey(values)
		if !ok {
			http.Error(w, msgBadKey, http.StatusBadRequest)
			return
		}
		var body []byte
		var err error
		if r.Body != nil {
			body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, msgBodyTooLarge, http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))

		c := &claim{client: m.cfg.ClientID(r), key: key, hash: requestHash(r, body)}
		res, err := m.store.claim(r.Context(), c)
		if err != nil {
			m.cfg.Logger.ErrorContext(r.Context(), "idempotency: claim failed", "key", key, "error", err)
			http.Error(w, msgInternal, http.StatusInternalServerError)
			return
		}
		switch res.outcome {
		case replay:
			resp := res.resp
			if resp.headers == nil {
				resp.headers = http.Header{}
			}
			resp.headers.Set(HeaderReplayed, "true")
			write(w, resp)
		case mismatch:
			http.Error(w, msgMismatch, http.StatusUnprocessableEntity)
		case inProgress:
			inProgressResponse(w, res.retryAfter)
		case claimed:
			m.run(w, r, h, c)
		}
	})
}

func inProgressResponse(w http.ResponseWriter, retryAfter int) {
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	http.Error(w, msgInProgress, http.StatusConflict)
}

// retryLater are the 4xx statuses that ask the client to come back rather
// than state an outcome: stored, they would answer every retry for the
// key's whole TTL.
func retryLater(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooEarly || code == http.StatusTooManyRequests
}

// run runs h in a transaction and, with c (nil without a key), completes
// the key. The response reaches w only after what it reports has
// committed.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, h http.Handler, c *claim) {
	ctx := r.Context()
	log := m.cfg.Logger
	// Cleanup, completion and commit use a context the client cannot
	// cancel: once the handler has done its work, committing it and its
	// response is what makes a retry safe, whether or not this client is
	// still there to read it.
	detached := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	}
	release := func() {
		if c == nil {
			return
		}
		dctx, cancel := detached()
		defer cancel()
		if err := m.store.release(dctx, c); err != nil {
			// The lease expires anyway.
			log.ErrorContext(ctx, "idempotency: release failed; the key is free when its lease ends", "key", c.key, "error", err)
		}
	}
	fail := func(msg string, err error) {
		log.ErrorContext(ctx, msg, "error", err)
		release()
		http.Error(w, msgInternal, http.StatusInternalServerError)
	}

	tx, err := m.cfg.DB.BeginTx(ctx, m.cfg.TxOptions)
	if err != nil {
		fail("idempotency: begin transaction", err)
		return
	}
	rollback := func() {
		dctx, cancel := detached()
		defer cancel()
		_ = tx.Rollback(dctx)
	}
	state := &reqState{tx: managedTx{tx}}
	if c != nil {
		owned, err := lock(ctx, tx, c)
		if err != nil {
			rollback()
			fail("idempotency: lock key", err)
			return
		}
		if !owned {
			// Our claim was taken over before we locked it (we stalled past
			// the lease), or a takeover attempt holds the row right now:
			// someone else may run the request, so we must not. Releasing
			// is a no-op if the claim is no longer ours, and frees the key
			// at once if it still is.
			rollback()
			release()
			inProgressResponse(w, 1)
			return
		}
		state.requestKey = deriveKey(c.client, c.key)
	} else {
		state.requestKey = newToken()
	}

	rec := newRecorder()
	if p := serve(h, rec, r.WithContext(context.WithValue(ctx, ctxKey{}, state))); p != nil {
		rollback()
		release()
		if p.value == http.ErrAbortHandler {
			panic(p.value) // net/http's way to abort a response: keep it
		}
		log.ErrorContext(ctx, "idempotency: handler panicked; its transaction rolled back", "panic", p.value, "stack", string(p.stack))
		http.Error(w, msgInternal, http.StatusInternalServerError)
		return
	}
	resp := rec.result()
	dctx, cancel := detached()
	defer cancel()
	switch {
	case resp.code >= 500 || retryLater(resp.code):
		rollback()
		release()
		write(w, resp)
		return
	case resp.code >= 400 && !state.commitClientError:
		// A refusal: nothing the handler wrote stays, the answer does.
		rollback()
		if c != nil {
			ours, err := complete(dctx, m.cfg.DB, c, m.toStore(resp))
			if err != nil {
				fail("idempotency: store response", err)
				return
			}
			if !ours {
				// Taken over since the rollback released the row (only
				// possible past the lease): the key is another attempt's
				// now, and this answer simply is not stored.
				log.WarnContext(ctx, "idempotency: claim taken over before the response was stored", "key", c.key)
			}
		}
		write(w, resp)
		return
	}

	if c != nil {
		ours, err := complete(dctx, tx, c, m.toStore(resp))
		if err == nil && !ours {
			// Impossible while tx holds the row lock; refuse to commit anyway.
			err = fmt.Errorf("claim on key %q lost", c.key)
		}
		if err != nil {
			rollback()
			fail("idempotency: complete key", err)
			return
		}
	}
	if err := tx.Commit(dctx); err != nil {
		// Maybe committed after all (connection lost during COMMIT): then
		// the key is completed, release leaves it, and a retry gets the
		// stored response. Otherwise the retry runs again.
		fail("idempotency: commit", err)
		return
	}
	write(w, resp)
}

// toStore is the part of resp a replay serves: status, the configured
// headers and the body.
func (m *Middleware) toStore(resp stored) stored {
	return stored{code: resp.code, headers: keep(resp.headers, m.stored), body: resp.body}
}

type panicked struct {
	value any
	stack []byte
}

// serve runs h, turning a panic into a value so the transaction can be
// rolled back before anything else happens.
func serve(h http.Handler, w http.ResponseWriter, r *http.Request) (p *panicked) {
	defer func() {
		if v := recover(); v != nil {
			p = &panicked{value: v, stack: debug.Stack()}
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}
