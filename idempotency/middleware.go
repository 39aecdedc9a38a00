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
	"github.com/jackc/pgx/v5/pgxpool"
)

// Header names the middleware reads and writes.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed" // "true" on a stored response served again
)

// Defaults for the zero fields of Options.
const (
	DefaultLease        = 10 * time.Second
	DefaultTTL          = 24 * time.Hour
	DefaultMaxBodyBytes = 1 << 20
)

// DefaultStoredHeaders are the response headers kept for replays.
var DefaultStoredHeaders = []string{"Content-Type", "Location"}

// Options configures the middleware. Only ClientID is required.
type Options struct {
	// ClientID returns the caller's identity, e.g. the authenticated
	// account or API key id (so run the middleware after authentication).
	// Keys are scoped by it: one client can neither collide with another's
	// key nor be served its response. Returning "" for every request puts
	// all clients in one scope. It must not contain a NUL byte.
	ClientID func(*http.Request) string

	// AllowMissingKey lets a mutating request without an Idempotency-Key
	// through without idempotency (it is not deduplicated) instead of
	// answering 400. The handler still runs in a transaction from Tx,
	// committed below 500 and rolled back otherwise, so it has one code
	// path either way.
	AllowMissingKey bool

	// Lease is how long a new claim holds its key against duplicates (409)
	// before a retry may take it over; default 10s. A live request keeps its
	// key past the lease anyway (its transaction locks the row), so the
	// lease only bounds how long a crashed request blocks retries, and sets
	// Retry-After. Keep it above the time from claim to BEGIN under load
	// (pool waits).
	Lease time.Duration

	// TTL is how long a key is remembered, from its claim; default 24h.
	// An expired key is a new key. Pass the same value to Cleanup.
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

	// Logger receives database errors and handler panics; default
	// slog.Default().
	Logger *slog.Logger
}

// Middleware is the idempotency middleware; build it with New and use Wrap.
type Middleware struct {
	store    store
	opts     Options
	stored   []string // canonical header names
	logger   *slog.Logger
	maxBody  int64
	clientID func(*http.Request) string
}

// New returns the middleware for pool, which must reach a database with
// the table of sql/idempotency.sql and the service's own tables: the
// handler's transaction is a transaction of this pool.
func New(pool *pgxpool.Pool, opts Options) (*Middleware, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", ErrOptions)
	}
	if opts.ClientID == nil {
		return nil, fmt.Errorf("%w: ClientID is nil; keys must be scoped by client (return \"\" for a single scope)", ErrOptions)
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.StoredHeaders == nil {
		opts.StoredHeaders = DefaultStoredHeaders
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch {
	case opts.Lease < time.Second:
		return nil, fmt.Errorf("%w: Lease is %v; it must be at least 1s", ErrOptions, opts.Lease)
	case opts.TTL <= opts.Lease:
		return nil, fmt.Errorf("%w: TTL (%v) must be longer than Lease (%v)", ErrOptions, opts.TTL, opts.Lease)
	case opts.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: MaxBodyBytes is %d", ErrOptions, opts.MaxBodyBytes)
	}
	m := &Middleware{
		store:    store{pool: pool, lease: opts.Lease, ttl: opts.TTL},
		opts:     opts,
		logger:   opts.Logger,
		maxBody:  opts.MaxBodyBytes,
		clientID: opts.ClientID,
	}
	for _, h := range opts.StoredHeaders {
		m.stored = append(m.stored, http.CanonicalHeaderKey(h))
	}
	return m, nil
}

type ctxKey struct{}

// reqState is what a handler can reach through its context.
type reqState struct {
	tx         pgx.Tx
	requestKey string
}

// Tx returns the transaction the middleware runs the handler in, or nil
// outside a mutating request (GET, HEAD, OPTIONS, TRACE, or no middleware).
// Write the business rows and the outbox event with it; they commit
// together with the stored response. Do not Commit or Rollback it
// (ErrTxManaged): respond 5xx to roll back, anything else commits. A 4xx
// commits too, so check input before writing, or write through a
// savepoint (tx.Begin) you can roll back.
func Tx(ctx context.Context) pgx.Tx {
	if s, ok := ctx.Value(ctxKey{}).(*reqState); ok {
		return s.tx
	}
	return nil
}

// RequestKey returns a stable id of this request's idempotency key, scoped
// by client (DeriveKey(clientID, key)), or "" when the request has none.
// Pass it to DeriveKey to get keys for calls to other services.
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
			if !m.opts.AllowMissingKey {
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
			body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, m.maxBody))
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

		c := &claim{client: m.clientID(r), key: key, hash: requestHash(r, body)}
		res, err := m.store.claim(r.Context(), c)
		if err != nil {
			m.logger.ErrorContext(r.Context(), "idempotency: claim failed", "key", key, "err", err)
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

// run runs h in a transaction and, with c (nil without a key), completes
// the key in it. The response reaches w only after the commit.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, h http.Handler, c *claim) {
	ctx := r.Context()
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
			m.logger.ErrorContext(ctx, "idempotency: release failed; the key is free when its lease ends", "key", c.key, "err", err)
		}
	}
	fail := func(msg string, err error) {
		m.logger.ErrorContext(ctx, msg, "err", err)
		release()
		http.Error(w, msgInternal, http.StatusInternalServerError)
	}

	tx, err := m.store.pool.BeginTx(ctx, m.opts.TxOptions)
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
		state.requestKey = DeriveKey(c.client, c.key)
	}

	rec := newRecorder()
	if p := serve(h, rec, r.WithContext(context.WithValue(ctx, ctxKey{}, state))); p != nil {
		rollback()
		release()
		if p.value == http.ErrAbortHandler {
			panic(p.value) // net/http's way to abort a response: keep it
		}
		m.logger.ErrorContext(ctx, "idempotency: handler panicked; its transaction rolled back", "panic", p.value, "stack", string(p.stack))
		http.Error(w, msgInternal, http.StatusInternalServerError)
		return
	}
	resp := rec.result()
	if resp.code >= 500 {
		rollback()
		release()
		write(w, resp)
		return
	}

	dctx, cancel := detached()
	defer cancel()
	if c != nil {
		if err := complete(dctx, tx, c, stored{code: resp.code, headers: keep(resp.headers, m.stored), body: resp.body}); err != nil {
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
