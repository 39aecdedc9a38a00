package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// aggregates is how many distinct aggregate ids (Kafka keys) the events
// spread over.
const aggregates = 10000

// backlogProcedure writes a backlog inside the server: a client-side loop
// would measure the network round trip, not the readers, and would take
// minutes for a million single-row transactions. COMMIT inside a procedure
// makes every perTx rows one transaction, exactly as separate client
// transactions would appear in the WAL. The payload is about 200 bytes of
// JSON and the headers column carries a traceparent, like the steady
// writers' events.
const backlogProcedure = `
CREATE OR REPLACE PROCEDURE bench_backlog(n int, per_tx int, agg_type text, aggs int)
LANGUAGE plpgsql AS $$
DECLARE
    agg text;
BEGIN
    FOR i IN 1..n LOOP
        agg := 'agg-' || lpad((i % aggs)::text, 5, '0');
        INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
        VALUES (agg_type, agg, 'OrderUpdated',
                format('{"order": "%s", "seq": %s, "amount": %s.%s, "currency": "EUR", "customer": "customer-%s", "status": "confirmed", "note": "%s"}',
                       agg, i, i % 100000, lpad((i % 100)::text, 2, '0'), lpad((i % 7919)::text, 6, '0'), repeat('x', 40))::jsonb,
                format('{"traceparent": "00-%s-%s-01"}', md5(i::text), left(md5(agg), 16))::jsonb);
        IF i % per_tx = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
    COMMIT;
END
$$`

// writeBacklog commits n events in transactions of perTx rows, as fast as
// the server can. synchronous_commit=off: the backlog's write speed is not
// what is measured, and a WAL flush per commit would only slow setup.
func writeBacklog(ctx context.Context, url string, n, perTx int, aggType string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	// Literal arguments and no parameters: pgx then uses the simple query
	// protocol, in which a CALL may COMMIT (it runs outside any transaction
	// block).
	_, err = conn.Exec(ctx, fmt.Sprintf("CALL bench_backlog(%d, %d, %s, %d)",
		n, perTx, quoteLiteral(aggType), aggregates))
	return err
}

// currentLSN is the end of the WAL inserted so far. Not pg_current_wal_lsn():
// that is the write position, which after asynchronous commits can still be
// behind the backlog's last records.
func currentLSN(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.LSN, error) {
	var s string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

// pacedResult is what a paced load achieved.
type pacedResult struct {
	written int64
	elapsed time.Duration
	errors  int64
	lastErr error
}

func (r pacedResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.written) / r.elapsed.Seconds()
}

// writePaced commits single-row transactions at rate events per second for
// d. A pacer hands out one token per event as time passes (checked every
// millisecond) and workers on a pool turn tokens into INSERTs, so the
// offered rate holds even when single commits vary in duration. When the
// workers fall behind, tokens queue up to a second's worth and the pacer
// waits: the achieved rate, not the requested one, is what gets reported.
// written, if not nil, is increased as events commit (for progress lines).
func writePaced(ctx context.Context, pool *pgxpool.Pool, rate int, d time.Duration, aggType string, written *atomic.Int64) pacedResult {
	return writePacedWith(ctx, pool, rate, d, written, func(ctx context.Context, rng *rand.Rand) error { return insertEvent(ctx, pool, rng, aggType) })
}

// writePacedWith is writePaced with insert committing each event.
func writePacedWith(ctx context.Context, pool *pgxpool.Pool, rate int, d time.Duration, written *atomic.Int64, insert func(context.Context, *rand.Rand) error) pacedResult {
	if written == nil {
		written = new(atomic.Int64)
	}
	base := written.Load()
	tokens := make(chan struct{}, max(rate, 1))
	workers := min(int(pool.Config().MaxConns), max(rate/250, 4))
	var wg sync.WaitGroup
	var res pacedResult
	var errs atomic.Int64
	var errOnce sync.Once
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for range tokens {
				if err := insert(ctx, rng); err != nil {
					errs.Add(1)
					errOnce.Do(func() { res.lastErr = err })
					if ctx.Err() != nil {
						return
					}
					continue
				}
				written.Add(1)
			}
		}()
	}

	tick := time.NewTicker(time.Millisecond)
	sent := 0
pace:
	for {
		select {
		case <-ctx.Done():
			break pace
		case now := <-tick.C:
			el := now.Sub(start)
			if el >= d {
				el = d
			}
			due := int(el.Seconds() * float64(rate))
			for sent < due {
				select {
				case tokens <- struct{}{}:
					sent++
					continue
				default:
				}
				break // queue full: the workers are behind; retry next tick
			}
			if el >= d {
				break pace
			}
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	res.elapsed = time.Since(start)
	res.written = written.Load() - base
	res.errors = errs.Load()
	return res
}

// insertEvent commits one event (autocommit: one row per transaction).
func insertEvent(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand, aggType string) error {
	agg := rng.IntN(aggregates)
	aggID := "agg-" + pad(agg, 5)
	seq := rng.Int64N(1 << 40)
	payload := fmt.Sprintf(`{"order": "%s", "seq": %d, "amount": %d.%02d, "currency": "EUR", "customer": "customer-%s", "status": "confirmed", "note": "%s"}`,
		aggID, seq, rng.IntN(100000), rng.IntN(100), pad(rng.IntN(7919), 6), padding)
	headers := fmt.Sprintf(`{"traceparent": "00-%016x%016x-%016x-01"}`, rng.Uint64(), rng.Uint64(), rng.Uint64())
	_, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, $2, 'OrderUpdated', $3, $4)`, aggType, aggID, payload, headers)
	return err
}

// padding brings the payload to about 200 bytes.
var padding = strings.Repeat("x", 40)

func pad(n, width int) string {
	s := strconv.Itoa(n)
	for len(s) < width {
		s = "0" + s
	}
	return s
}

// quoteLiteral quotes a string as an SQL literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
