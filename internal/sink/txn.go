package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// TxConfig configures a Transactional producer.
type TxConfig struct {
	Config
	// TransactionalID names the producer to the broker's transaction
	// coordinator. A new client with the same id fences the old one: the
	// old one can no longer commit, and its open transaction is aborted.
	TransactionalID string
	// CheckpointTopic is the compacted topic of checkpoint records;
	// CheckpointKey (the slot) is their key.
	CheckpointTopic string
	CheckpointKey   string
	// Origin is the outbox table's identity, written in every checkpoint.
	Origin string
	// Timeline is the timeline of the server streamed from, written in
	// every checkpoint with the commit it follows; nil writes none. It is
	// called from the goroutine that calls Boundary.
	Timeline func() int32
	// Epoch is the history epoch (checkpoint.Epoch) of the transactions
	// the stream hands on, written in every checkpoint; nil writes 0. It
	// is called from the goroutine that calls Boundary.
	Epoch func() int
	// Interval is the least time between two commits, unless CommitRecords
	// records wait: then the next commit starts at once.
	Interval      time.Duration
	CommitRecords int
	// Admin is what reads the checkpoint topic when a commit's outcome is
	// unknown (the broker went away while it was asked): the brokers and
	// TLS and SASL options, without the producer's hooks.
	Admin Config
}

// TxObserver is told what happens to Kafka transactions; metrics implement
// it.
type TxObserver interface {
	// TxCommitted: a transaction of records records and a checkpoint
	// committed; took is from its beginning to the broker's answer to the
	// commit.
	TxCommitted(records int, took time.Duration)
	// TxAborted: a transaction was aborted, or its outcome is unknown.
	TxAborted()
}

// Transactional is the exactly-once producer. Records produced between two
// Boundary calls are the records of whole PostgreSQL transactions; at most
// every Interval, Run writes the records up to the last boundary, plus a
// checkpoint record holding that boundary's LSN, in one Kafka transaction,
// and calls each record's promise only once the transaction committed. So a
// promise's nil says the record is visible to read_committed consumers, and
// a position confirmed on the strength of it is recorded in Kafka too.
//
// Produce, Boundary and Discard are called from the replication goroutine
// and never wait on the broker; Run, the one goroutine that talks to it,
// takes what they queued.
type Transactional struct {
	cl  *kgo.Client
	cfg TxConfig
	obs TxObserver
	log *slog.Logger

	mu    sync.Mutex
	queue TxQueue
	kick  chan struct{}

	committed atomic.Uint64 // the checkpoint LSN of the last commit
}

// NewTransactional creates the exactly-once producer. It does not contact
// the broker: Fence does.
func NewTransactional(cfg TxConfig, obs TxObserver, log *slog.Logger) (*Transactional, error) {
	if cfg.TransactionalID == "" || cfg.CheckpointTopic == "" || cfg.CheckpointKey == "" {
		return nil, errors.New("a transactional producer needs a transactional id, a checkpoint topic and a checkpoint key")
	}
	opts, err := producerOpts(cfg.Config, log)
	if err != nil {
		return nil, err
	}
	// franz-go logs every transaction's beginning and end at info: a few
	// lines every Interval. Those stay at debug.
	opts = append(opts, kgo.TransactionalID(cfg.TransactionalID), kgo.WithLogger(quieter{kslog.New(log.With("component", "kafka"))}))
	cl, err := kgo.NewClient(append(opts, cfg.Opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	if cfg.Admin.Brokers == nil {
		cfg.Admin = Config{Brokers: cfg.Brokers}
	}
	return &Transactional{cl: cl, cfg: cfg, obs: obs, log: log.With("component", "kafka-transactions"), kick: make(chan struct{}, 1)}, nil
}

// Fence registers the transactional id with the broker's transaction
// coordinator (InitProducerId): any other producer with the same id is
// fenced from then on, and a transaction it left open is aborted, so the
// checkpoint read after Fence is final.
func (t *Transactional) Fence(ctx context.Context) error {
	if _, _, err := t.cl.ProducerID(ctx); err != nil {
		return &TxError{TransactionalID: t.cfg.TransactionalID, Op: "register the transactional id", Err: err}
	}
	return nil
}

// Produce queues r for the next Kafka transaction. promise is called with
// nil once the transaction holding r committed, or not at all when the
// producer fails (Run returns the error).
func (t *Transactional) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	t.mu.Lock()
	t.queue.Add(r, promise)
	t.mu.Unlock()
}

// Boundary says that every record produced so far belongs to PostgreSQL
// transactions that ended at or before end: a Kafka transaction may end
// here, with end as its checkpoint. xid and commitTime are of the
// transaction that ended at end: the checkpoint names it, so that a later
// start can tell whether that LSN is the same commit on the server it then
// streams from.
//
// A boundary with no commit (xid 0, zero commitTime: a lone message's
// dead-letter record, at a position no transaction ends) moves the
// checkpoint to end but keeps naming the last commit (Commit.Named), which
// a later start verifies before it skips through end. Without a commit in
// this process to name, the checkpoint names none: a later start cannot
// verify it and skips nothing (a repeat, never a loss).
func (t *Transactional) Boundary(end pglogrepl.LSN, xid uint32, commitTime time.Time) {
	var tl int32
	var epoch int
	if t.cfg.Timeline != nil {
		tl = t.cfg.Timeline()
	}
	if t.cfg.Epoch != nil {
		epoch = t.cfg.Epoch()
	}
	t.mu.Lock()
	full := t.queue.Boundary(end, xid, commitTime, tl, epoch) >= t.cfg.CommitRecords
	t.mu.Unlock()
	if full {
		t.CommitNow()
	}
}

// CommitNow starts the next commit at once rather than after Interval: on
// shutdown the stream waits for what is queued.
func (t *Transactional) CommitNow() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// Discard drops the records produced since the last boundary, which no
// Kafka transaction holds yet (the PostgreSQL transaction they belong to
// will be sent again whole), and returns them; their promises are not
// called.
func (t *Transactional) Discard() []*kgo.Record {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queue.Discard()
}

// Checkpoint is the LSN of the last committed checkpoint record of this
// process (0 before the first commit).
func (t *Transactional) Checkpoint() pglogrepl.LSN { return pglogrepl.LSN(t.committed.Load()) }

// SetCheckpoint sets what Checkpoint reports before the first commit: the
// checkpoint read at start.
func (t *Transactional) SetCheckpoint(lsn pglogrepl.LSN) { t.committed.Store(uint64(lsn)) }

// Run commits what is queued, at most every Interval (sooner when
// CommitRecords wait), until ctx ends. It returns nil when ctx ends, or the
// error that stopped it, after which it never writes again: a fenced
// producer (another instance took over the transactional id), a record the
// broker refused (the whole transaction is aborted), or a commit whose
// outcome is unknown.
//
// ctx is the committer's own, not the process's: on a signal the stream
// stops reading and waits (up to its shutdown timeout) for the queued whole
// transactions to commit, which only a committer still running can do. So
// ctx should end once the stream has returned; a commit still in progress
// then is aborted, never left open.
func (t *Transactional) Run(ctx context.Context) error {
	timer := time.NewTimer(t.cfg.Interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-t.kick:
		}
		start := time.Now()
		if err := t.commitQueued(ctx); err != nil {
			if ctx.Err() != nil {
				// Stopped in the middle of a commit (the stream's drain
				// gave up after its timeout): commitQueued aborted it, or
				// the broker could not be told and its transaction
				// timeout, or the next start's Fence, aborts it. Nothing
				// of it was confirmed.
				return nil
			}
			return err
		}
		// At most every Interval: the next commit waits for what is left
		// of it, unless enough records wait.
		timer.Reset(max(0, t.cfg.Interval-time.Since(start)))
	}
}

// commitQueued writes the records up to the last boundary and their
// checkpoint in one transaction.
func (t *Transactional) commitQueued(ctx context.Context) error {
	t.mu.Lock()
	batch, through := t.queue.Take()
	t.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	start := time.Now()
	for {
		err := t.commitOnce(ctx, batch, through)
		if err == nil {
			break
		}
		var unknown *unconfirmedError
		if !errors.As(err, &unknown) || ctx.Err() != nil {
			return err
		}
		// The broker went away while the commit was asked (a broker
		// restart): it may or may not have committed. Abort, which fences
		// whatever is still open of it, then ask the checkpoint topic
		// which it was; written again only when it did not commit, the
		// transaction's records are in Kafka once either way.
		committed, err := t.settle(ctx, through)
		if err != nil {
			return err
		}
		if committed {
			break
		}
		t.log.Warn("exactly-once delivery: the broker went away while a Kafka transaction was committed, and it did not commit: its records are written again in a new transaction",
			"transactional_id", t.cfg.TransactionalID, "records", len(batch), "checkpoint_lsn", through.End, "error", unknown.err)
	}
	took := time.Since(start)
	t.committed.Store(uint64(through.End))
	if t.obs != nil {
		t.obs.TxCommitted(len(batch), took)
	}
	for _, q := range batch {
		q.Promise(q.R, nil)
	}
	return nil
}

// commitOnce writes batch and the checkpoint of through in one
// transaction. A commit the broker may or may not have made is an
// *unconfirmedError; anything else failed for good (the transaction is
// aborted).
func (t *Transactional) commitOnce(ctx context.Context, batch []Queued, through Commit) error {
	if err := t.cl.BeginTransaction(); err != nil {
		return t.failed("begin a transaction", err)
	}
	var (
		emu      sync.Mutex
		firstErr error
		failedR  *kgo.Record
	)
	collect := func(r *kgo.Record, err error) {
		if err != nil {
			emu.Lock()
			if firstErr == nil {
				firstErr, failedR = err, r
			}
			emu.Unlock()
		}
	}
	for _, q := range batch {
		t.cl.Produce(ctx, q.R, collect)
	}
	t.cl.Produce(ctx, CheckpointRecordAt(t.cfg.CheckpointTopic, t.cfg.CheckpointKey, t.cfg.Origin, through), collect)
	if err := t.cl.Flush(ctx); err != nil {
		return t.abort("flush the transaction's records", err)
	}
	if firstErr != nil {
		if fenced(firstErr) {
			return t.abort("produce the transaction's records", firstErr)
		}
		return t.abort("produce the transaction's records", &RecordError{Topic: failedR.Topic, Err: firstErr})
	}
	if err := t.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		if unconfirmed(err) && ctx.Err() == nil {
			return &unconfirmedError{err: err}
		}
		return t.abort("commit the transaction", err)
	}
	return nil
}

// unconfirmedError is a commit whose outcome the broker never told: the
// connection to it failed while it was asked.
type unconfirmedError struct{ err error }

func (e *unconfirmedError) Error() string { return "commit the transaction: " + e.err.Error() }
func (e *unconfirmedError) Unwrap() error { return e.err }

// unconfirmed reports whether err leaves a commit's outcome unknown, as
// franz-go's EndTransaction documents: a transport error (the broker's
// connection failing: a dial refused while it restarts, which franz-go
// does not retry, a connection reset or closed) or UNKNOWN_SERVER_ERROR.
func unconfirmed(err error) bool {
	return unreachable(err) || errors.Is(err, kerr.UnknownServerError)
}

// unreachable reports whether err is the broker's connection failing.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// settleRetry is the pause between two tries to settle an unconfirmed
// commit while the broker is away.
const settleRetry = 500 * time.Millisecond

// settle ends the transaction whose commit is unconfirmed, once the broker
// answers again, and says whether it committed. As franz-go prescribes,
// the end is retried with TryAbort: that reloads the producer id, bumping
// its epoch, which aborts whatever is still open of the transaction; a
// commit the broker already made stays. Which of the two it was, the
// checkpoint topic then tells: the transaction's checkpoint is there,
// committed, only if the transaction is. It retries until ctx ends.
func (t *Transactional) settle(ctx context.Context, through Commit) (bool, error) {
	for {
		if t.obs != nil {
			t.obs.TxAborted()
		}
		err := t.cl.EndTransaction(ctx, kgo.TryAbort)
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			cp, rerr := ReadCheckpoint(rctx, t.cfg.Admin, t.cfg.CheckpointTopic, t.cfg.CheckpointKey, t.cfg.Origin)
			cancel()
			if rerr == nil {
				return cp.Found && cp.LSN >= through.End && cp.Commit.Timeline >= through.Timeline && cp.Commit.Epoch >= through.Epoch, nil
			}
			err = rerr
		} else if !unreachable(err) && !errors.Is(err, kerr.OperationNotAttempted) {
			return false, t.failed("abort the transaction whose commit is unconfirmed", err)
		}
		select {
		case <-ctx.Done():
			return false, t.failed("settle a commit whose outcome is unknown", err)
		case <-time.After(settleRetry):
		}
	}
}

// abortTimeout bounds the abort of a failed or interrupted transaction.
const abortTimeout = 5 * time.Second

// abort ends a failed transaction without committing it. What failed is
// the error either way: the stream stops, and the next start sends again
// what this transaction held.
//
// It has a context of its own: the transaction failed because Run's
// context ended, often, and an abort on that context would never reach
// the broker, leaving the transaction open, which holds back the last
// stable offset of its partitions (what read_committed consumers may read)
// until the broker's transaction timeout.
func (t *Transactional) abort(op string, err error) error {
	if t.obs != nil {
		t.obs.TxAborted()
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	if aerr := t.cl.AbortBufferedRecords(ctx); aerr == nil {
		_ = t.cl.EndTransaction(ctx, kgo.TryAbort)
	}
	return t.failed(op, err)
}

func (t *Transactional) failed(op string, err error) error {
	return &TxError{TransactionalID: t.cfg.TransactionalID, Op: op, Err: err}
}

// Ping asks a broker for metadata (see Sink.Ping).
func (t *Transactional) Ping(ctx context.Context) error { return t.cl.Ping(ctx) }

// Close stops the client; an open transaction is left to the broker's
// timeout or the next instance's Fence, which abort it.
func (t *Transactional) Close() { t.cl.Close() }

// quieter logs franz-go's info as debug.
type quieter struct{ kgo.Logger }

func (q quieter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelInfo {
		level = kgo.LogLevelDebug
	}
	if level <= q.Level() {
		q.Logger.Log(level, msg, keyvals...)
	}
}

// TxError is a failure of the transactional producer: what it was doing
// and the broker's error.
type TxError struct {
	TransactionalID string
	Op              string
	Err             error
}

func (e *TxError) Error() string {
	return fmt.Sprintf("transactional id %q: %s: %v", e.TransactionalID, e.Op, e.Err)
}

func (e *TxError) Unwrap() error { return e.Err }

// Fenced reports whether the producer was fenced: another producer
// registered the same transactional id, so this one may never write again.
func (e *TxError) Fenced() bool { return fenced(e.Err) }

// fenced reports whether err says a newer producer has the transactional
// id: the broker answers a fenced producer's produce with
// INVALID_PRODUCER_EPOCH and its transaction requests with PRODUCER_FENCED.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// RecordError is a record the broker refused inside a transaction.
type RecordError struct {
	Topic string
	Err   error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("the broker refused a record for topic %s: %v", e.Topic, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }
