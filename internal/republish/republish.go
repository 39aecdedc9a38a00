// Package republish re-sends outbox rows from the table itself, as the
// stream would have sent them: the repair after a slot was lost (wal_status
// lost, dropped, or not carried over a failover) and the way to give a
// consumer history.
//
// It owns reading the table in keyset-paginated batches (so memory stays
// bounded whatever the table's size), in the order of the key, and knowing
// how far every row has been acknowledged, so an interrupted run can be
// started again from there. The rows are read in PostgreSQL's text output,
// in a session with the same settings as the replication connection
// (replication.TextFormats), which is what pgoutput sends; they go through
// the same mapping (internal/mapping) and the same bad-event policy as the
// stream, so a record is the one the stream would have produced: topic,
// key, value, headers (the source among them) and timestamp.
//
// It must never report a row as acknowledged before the broker
// acknowledged it and every row before it, and never skip a row silently:
// a row that cannot be published stops the run or goes to the dead-letter
// topic, as the bad-event policy says.
package republish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// Selection says which rows to re-send. Rows are read in the order of the
// id column, or, when Since or Until is set, of (created_at, id). The empty
// Selection is the whole table.
type Selection struct {
	// AfterID and UntilID bound the id (after: exclusive; until:
	// inclusive), as text; only an integer id column has an order that
	// follows the order rows were written in, so only that may be bounded.
	AfterID, UntilID string
	// Since (inclusive) and Until (exclusive) bound created_at.
	Since, Until time.Time
}

func (s Selection) byTime() bool { return !s.Since.IsZero() || !s.Until.IsZero() }

// Config says what to re-send and how.
type Config struct {
	URL   string
	Table pgname.Name
	// Mapping is the stream's, Source included (the command resolves its
	// default as run does).
	Mapping         mapping.Config
	OnBadEvent      string // pipeline.Fail or pipeline.DeadLetter
	DeadLetterTopic string
	MaxRecordBytes  int
	Select          Selection
	// BatchSize is the rows read per query; MaxInflight the records sent
	// and not yet acknowledged before reading waits.
	BatchSize   int
	MaxInflight int
	// Progress, if set, is called after each batch is read.
	Progress func(Summary)
	// Log, if set, is told of each dead-lettered row and replaced
	// timestamp, as the stream's log is.
	Log *slog.Logger
	// Explain renders a bad row's cause for its dead-letter record and the
	// log, as the stream's pipeline.Config.Explain does; nil renders
	// err.Error().
	Explain func(error) string
}

// Producer is the sink as republish sees it: franz-go's Produce, which
// calls promise once with the broker's answer, and Flush.
type Producer interface {
	Produce(r *kgo.Record, promise func(*kgo.Record, error))
	Flush(ctx context.Context) error
}

// Summary is what a run did.
type Summary struct {
	RowsRead     int64
	Acked        int64 // records acknowledged by the broker, dead letters included
	DeadLettered int64
	// TimestampsReplaced counts records whose created_at was too far ahead
	// for Kafka (pipeline.MaxTimestampAhead) and that carry the produce
	// time instead, as the stream's do.
	TimestampsReplaced int64
	// Resume is where an interrupted or failed run can start again: after
	// the last row that, with every row before it, was acknowledged (zero
	// when none was).
	Resume  Resume
	Elapsed time.Duration
}

// Resume is the selection that starts a run after a row: AfterID, the
// row's id, when rows go in the order of the id; Since, its created_at as
// PostgreSQL prints it, when they go in the order of (created_at, id),
// which includes that time again: a repeat, not a gap.
type Resume struct {
	AfterID string
	Since   string
}

// IsZero reports whether r resumes after no row.
func (r Resume) IsZero() bool { return r == Resume{} }

// Sentinel errors; the errors returned wrap them with the facts.
var (
	// ErrBadEvent: a row could not be published, under the fail policy.
	ErrBadEvent = errors.New("bad event")
	// ErrRefused: the broker refused a record for good.
	ErrRefused = errors.New("the broker refused a record")
	// ErrNotOrdered: a selection by id on an id column whose order is not
	// the order rows were written in.
	ErrNotOrdered = errors.New("the id column is not an integer")
	// ErrNoCreatedAt: a selection by time without a created_at column.
	ErrNoCreatedAt = errors.New("the outbox table has no created_at column")
	// ErrNoIDColumn: the table lacks the id column.
	ErrNoIDColumn = errors.New("the outbox table has no id column")
)

// BadEventError is a row that could not be published under the fail
// policy: the run stops before it, and the resume point stays before it.
type BadEventError struct {
	EventID string // "(no id)" when the row has none
	// Err is why: a *mapping.BadEventError or a *pipeline.TooLargeError.
	Err error
}

func (e *BadEventError) Error() string {
	return fmt.Sprintf("%v %s: %v", ErrBadEvent, e.EventID, e.Err)
}

func (e *BadEventError) Unwrap() []error { return []error{ErrBadEvent, e.Err} }

// Republisher re-sends rows. Use it once: New, then Run.
type Republisher struct {
	cfg     Config
	mapper  *mapping.Mapper
	sink    Producer
	promise func(*kgo.Record, error) // ack, made once
	explain func(error) string

	room chan struct{} // one token per record in flight

	mu      sync.Mutex
	batches []*batch // read and not yet wholly acknowledged, oldest first
	sum     Summary
	failed  error
}

// batch is one query's rows, for knowing how far everything is acked.
type batch struct {
	pending int // records not yet acknowledged
	read    bool
	resume  Resume // Summary.Resume once it is wholly acknowledged
}

// pending is one record's way back to its batch.
type pending struct {
	context.Context
	b    *batch
	id   string
	dead bool
}

// New checks cfg and returns a republisher that produces to sink.
func New(cfg Config, sink Producer) (*Republisher, error) {
	m, err := mapping.New(cfg.Mapping)
	if err != nil {
		return nil, err
	}
	if cfg.OnBadEvent != pipeline.Fail && (cfg.OnBadEvent != pipeline.DeadLetter || cfg.DeadLetterTopic == "") {
		return nil, fmt.Errorf("bad-event policy %q: use %s, or %s with a dead-letter topic", cfg.OnBadEvent, pipeline.Fail, pipeline.DeadLetter)
	}
	if cfg.BatchSize <= 0 || cfg.MaxInflight <= 0 || cfg.MaxRecordBytes <= 0 {
		return nil, errors.New("republish: BatchSize, MaxInflight and MaxRecordBytes must be positive")
	}
	r := &Republisher{cfg: cfg, mapper: m, sink: sink, room: make(chan struct{}, cfg.MaxInflight), explain: cfg.Explain}
	r.promise = r.ack
	if r.explain == nil {
		r.explain = func(err error) string { return err.Error() }
	}
	return r, nil
}

// column is one column of the outbox table.
type column struct {
	name    string
	typeOID uint32
}

// Run reads and re-sends the selected rows until done, a bad row under
// fail, a refusal, or ctx's end; then it waits for what is in flight
// (flushCtx bounds that wait) and returns the summary with the error.
func (r *Republisher) Run(ctx, flushCtx context.Context) (Summary, error) {
	began := time.Now()
	err := r.read(ctx)
	if ferr := r.sink.Flush(flushCtx); ferr != nil && err == nil {
		err = fmt.Errorf("waiting for the broker to acknowledge what was sent: %w", ferr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed != nil {
		err = r.failed
	}
	r.sum.Elapsed = time.Since(began)
	return r.sum, err
}

func (r *Republisher) read(ctx context.Context) error {
	cfg, err := pgx.ParseConfig(r.cfg.URL)
	if err != nil {
		return err
	}
	replication.TextFormats(cfg.RuntimeParams)
	cfg.RuntimeParams["application_name"] = "cdc-outbox republish"
	conn, err := connectPrimary(ctx, cfg)
	if err != nil {
		return replication.NewConnectError(r.cfg.URL, err)
	}
	defer conn.Close(context.Background())

	t, err := replication.FindTable(ctx, conn, r.cfg.Table)
	if err != nil {
		return err
	}
	cols, err := tableColumns(ctx, conn, t.OID)
	if err != nil {
		return err
	}
	q, err := r.plan(t.Name, cols)
	if err != nil {
		return err
	}
	var cursor []string // the last row's key values, text
	for {
		params := q.params(cursor)
		b := &batch{}
		r.mu.Lock()
		r.batches = append(r.batches, b)
		r.mu.Unlock()
		n, last, err := r.batch(ctx, conn, q, q.page(cursor), params, b)
		r.mu.Lock()
		b.read = true
		if last != nil {
			b.resume = q.resume(last)
		}
		r.advance()
		sum := r.sum
		r.mu.Unlock()
		if err != nil {
			return err
		}
		if r.cfg.Progress != nil {
			r.cfg.Progress(sum)
		}
		if n < r.cfg.BatchSize {
			return nil
		}
		cursor = last
	}
}

// batch reads one page and sends its rows; it returns the rows read and
// the key of the last row sent (nil when none was): a row that stopped the
// run is read but not sent, and must not count as done.
func (r *Republisher) batch(ctx context.Context, conn *pgx.Conn, q *query, sql string, params [][]byte, b *batch) (int, []string, error) {
	// Text results for every column (nil formats): the type's output, as
	// pgoutput sends it.
	rr := conn.PgConn().ExecParams(ctx, sql, params, nil, nil, nil)
	vals := make([]mapping.Column, len(q.wanted))
	n := 0
	var last []string
	for rr.NextRow() {
		if err := r.wait(ctx); err != nil {
			rr.Close()
			return n, last, err
		}
		row := rr.Values()
		for i, at := range q.wanted {
			c := &vals[i]
			*c = mapping.Column{Missing: at < 0}
			if at >= 0 {
				c.TypeOID = q.types[i]
				c.Data = row[at]
				c.Null = row[at] == nil
			}
		}
		n++
		r.mu.Lock()
		r.sum.RowsRead++
		r.mu.Unlock()
		if err := r.send(vals, q, row, b); err != nil {
			<-r.room // the token taken for it
			rr.Close()
			return n, last, err
		}
		last = make([]string, len(q.keyAt))
		for i, k := range q.keyAt {
			last[i] = string(row[k])
		}
	}
	if _, err := rr.Close(); err != nil {
		return n, last, fmt.Errorf("read %s: %w", q.table, err)
	}
	return n, last, nil
}

// wait takes a token of room in flight, or returns the reason to stop.
func (r *Republisher) wait(ctx context.Context) error {
	select {
	case r.room <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// send maps and produces one row, or applies the bad-event policy.
func (r *Republisher) send(vals []mapping.Column, q *query, row [][]byte, b *batch) error {
	pd := &pending{Context: context.Background(), b: b, id: r.mapper.EventID(vals)}
	rec := &kgo.Record{}
	err := r.mapper.Map(vals, rec)
	if ts := rec.Timestamp; err == nil && ts.After(time.Now().Add(pipeline.MaxTimestampAhead)) {
		// As the stream does: Kafka would refuse it (INVALID_TIMESTAMP).
		rec.Timestamp = time.Time{}
		r.mu.Lock()
		r.sum.TimestampsReplaced++
		r.mu.Unlock()
		if r.cfg.Log != nil {
			r.cfg.Log.Warn("created_at is too far ahead for Kafka, which refuses timestamps more than an hour ahead by default: the record carries the produce time instead",
				"event_id", pd.id, "created_at", ts, "max_ahead", pipeline.MaxTimestampAhead.String())
		}
	}
	if err == nil {
		if size := pipeline.RecordSize(rec); size > int64(r.cfg.MaxRecordBytes) {
			err = &pipeline.TooLargeError{Size: size, Limit: r.cfg.MaxRecordBytes}
		}
	} else if !errors.As(err, new(*mapping.BadEventError)) {
		return err
	}
	if err != nil {
		id := pd.id
		if id == "" {
			id = "(no id)"
		}
		if r.cfg.OnBadEvent == pipeline.Fail {
			return &BadEventError{EventID: id, Err: err}
		}
		reason := pipeline.DeadLetterReason(pd.id, err, r.explain)
		dl := pipeline.DeadLetterRecord(r.cfg.DeadLetterTopic, pd.id, "", q.table.Schema+"."+q.table.Relation, r.mapper.Source(), reason,
			r.cfg.MaxRecordBytes, func(limit int) []byte { return pipeline.RowJSON(q.all, row, limit) })
		rec = &dl
		pd.dead = true
		if r.cfg.Log != nil {
			r.cfg.Log.Warn("bad event sent to the dead-letter topic", "event_id", id, "topic", r.cfg.DeadLetterTopic, "error", reason)
		}
	}
	r.mu.Lock()
	b.pending++
	r.mu.Unlock()
	rec.Context = pd
	r.sink.Produce(rec, r.promise)
	return nil
}

// ack is the promise of every record: the broker's answer. A record the broker refused
// (too large for the topic, a timestamp out of its range, no permission)
// stops the run under either policy: its batch never completes, so the
// resume point stays before it. Its room is given back all the same, so
// that a reader waiting for room sees the failure.
func (r *Republisher) ack(rec *kgo.Record, err error) {
	pd := rec.Context.(*pending)
	defer func() { <-r.room }()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		// kgo.ErrClientClosed: closed after an interrupt, unacknowledged,
		// which the resume point already says.
		if r.failed == nil && !errors.Is(err, kgo.ErrClientClosed) {
			r.failed = fmt.Errorf("%w: event %s: %w", ErrRefused, pd.id, &pipeline.RefusedError{Topic: rec.Topic, Err: err})
		}
		return
	}
	r.sum.Acked++
	if pd.dead {
		r.sum.DeadLettered++
	}
	pd.b.pending--
	r.advance()
}

// advance moves Resume past every batch that is read and wholly
// acknowledged, oldest first. Called with mu held.
func (r *Republisher) advance() {
	for len(r.batches) > 0 {
		b := r.batches[0]
		if !b.read || b.pending > 0 {
			return
		}
		if !b.resume.IsZero() {
			r.sum.Resume = b.resume
		}
		r.batches = r.batches[1:]
	}
}

// tableColumns lists the table's columns with their type OIDs, which
// pgoutput sends in its Relation message.
func tableColumns(ctx context.Context, conn *pgx.Conn, oid uint32) ([]column, error) {
	rows, _ := conn.Query(ctx, `SELECT attname::text, atttypid FROM pg_attribute
		WHERE attrelid = $1::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	cols, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (column, error) {
		var c column
		err := row.Scan(&c.name, &c.typeOID)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the columns of the outbox table: %w", err)
	}
	return cols, nil
}

// connectPrimary is replication.ConnectPrimary with a parsed config.
func connectPrimary(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	cfg.ValidateConnect = replication.RequirePrimary(cfg.ValidateConnect)
	return pgx.ConnectConfig(ctx, cfg)
}

// Integer type OIDs: ids of these types are assigned in the order rows are
// written (a sequence or identity), which a selection by id relies on.
var integerTypes = map[uint32]bool{20: true, 21: true, 23: true, 1700: true}

// quoteList quotes column names for a select list.
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgname.Quote(n)
	}
	return strings.Join(q, ", ")
}
