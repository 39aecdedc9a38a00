package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// delivery is what the two deliveries do differently with the stream's
// transactions: how a transaction the server sends again is known, where
// one ends for the producer, and what a lost connection costs. The
// pipeline makes one from its producer: a Transactional is exactly-once,
// any other at-least-once. Every method is called from the replication
// goroutine, but waiting and reach, which metrics read too.
type delivery interface {
	// begin: the server sends the transaction of xid whose commit record
	// starts at final. skip: its changes are passed over (the producer
	// holds it whole already, or may: exactly-once while a checkpoint is
	// unproven).
	begin(xid uint32, final pglogrepl.LSN, commitTime int64) (skip bool, err error)
	// again reports whether the open transaction's change at lsn reached
	// the broker when the server sent the transaction before: it is not
	// published again.
	again(lsn pglogrepl.LSN) bool
	// produced: pd, a record of the open transaction (or a lone message's
	// dead letter), goes to the producer now.
	produced(pd *pending, lone bool)
	// commit: the open transaction ended at end. tentative: it stays out
	// of the tracker (skipped while a checkpoint is unproven).
	commit(end pglogrepl.LSN, xid uint32, commitTime time.Time, skipped bool) (tentative bool, err error)
	// lone: a non-transactional outbox message at at. skip: its
	// dead-letter record is in Kafka already, or may be.
	lone(at pglogrepl.LSN) (skip bool, err error)
	// loneEnded: the lone message's dead-letter record ends a transaction
	// of its own at at.
	loneEnded(at pglogrepl.LSN)
	// lost: the replication connection broke; the server sends every
	// transaction not confirmed again.
	lost()
	// reach is how far into the WAL the producer may hold events beyond
	// the tracker's commits (Newest).
	reach() pglogrepl.LSN
	// waiting is the open transaction's records that wait for its commit
	// before any acknowledgement can come: not in flight.
	waiting() (records, bytes int64)
}

// atLeastOnce: every record is produced on its own; a transaction the
// server sends again after a lost connection is published again but for
// what the broker acknowledged of it (resend.go).
type atLeastOnce struct {
	p      *Pipeline
	resend resendState
	// newest is the newest LSN of a record produced, whatever became of
	// its transaction: a large one cut off mid-way has rows in Kafka whose
	// commit never came. Written by the replication goroutine, read by
	// any.
	newest atomic.Uint64
}

func (a *atLeastOnce) begin(xid uint32, final pglogrepl.LSN, commitTime int64) (bool, error) {
	a.resendBegin(xid, final, commitTime)
	return false, nil
}

func (a *atLeastOnce) again(lsn pglogrepl.LSN) bool { return a.resendChange(lsn) }

func (a *atLeastOnce) produced(pd *pending, lone bool) {
	if !lone {
		// A lone message's dead letter belongs to no transaction of the
		// server's: nothing to remember for a sending again.
		a.resendSent(pd)
	}
	if uint64(pd.lsn) > a.newest.Load() {
		a.newest.Store(uint64(pd.lsn))
	}
}

func (a *atLeastOnce) commit(end pglogrepl.LSN, _ uint32, _ time.Time, _ bool) (bool, error) {
	a.resendCommit(end)
	return false, nil
}

func (a *atLeastOnce) lone(pglogrepl.LSN) (bool, error) { return false, nil }

func (a *atLeastOnce) loneEnded(pglogrepl.LSN) {}

func (a *atLeastOnce) lost() { a.resendLost() }

func (a *atLeastOnce) reach() pglogrepl.LSN { return pglogrepl.LSN(a.newest.Load()) }

func (a *atLeastOnce) waiting() (int64, int64) { return 0, 0 }

// exactlyOnce: the producer (Transactional) writes whole PostgreSQL
// transactions in Kafka transactions with a checkpoint; a transaction that
// ended at or before the checkpoint is skipped, once the checkpoint is
// proven to be on the server's history (verify.go).
type exactlyOnce struct {
	p   *Pipeline
	txp Transactional
	// through is the end LSN of the last transaction handed to txp, or
	// the Kafka checkpoint (replication goroutine only).
	through   pglogrepl.LSN
	skippedTx atomic.Uint64
	// open and openBytes count the open transaction's records, which wait
	// in txp until its commit: they count neither against the in-flight
	// limits nor as in flight, since no acknowledgement can come for them
	// before the commit (written by the replication goroutine, read by
	// metrics too).
	open, openBytes atomic.Int64
	// verify is the Kafka checkpoint's commit while it is not yet verified
	// (verify.go); tentative counts the transactions skipped meanwhile,
	// unproven is set while the open one is.
	verify    *checkpoint.Mark
	tentative uint64
	unproven  bool
	// holds is the position of a Kafka checkpoint the stream cannot
	// verify (Holds).
	holds pglogrepl.LSN
	// namedPassed: verify is a lone message's checkpoint whose named
	// commit the slot had confirmed, which the server does not send again.
	namedPassed bool
}

func (e *exactlyOnce) begin(_ uint32, final pglogrepl.LSN, _ int64) (bool, error) {
	// The commit record starts at final and ends at the end LSN a
	// checkpoint holds: a transaction ended at or before the checkpoint
	// exactly when its commit record starts before it.
	if final < e.through {
		if e.skippedTx.Add(1) == 1 {
			e.p.log.Info("skipping transactions that Kafka holds already (exactly-once): PostgreSQL sends again what it was not yet told of",
				"first_commit_lsn", final, "through", e.through)
		}
		return true, nil
	}
	if e.verify != nil {
		return e.verifyBegin(final)
	}
	return false, nil
}

// again: what the connection lost of an open transaction was in no Kafka
// transaction, and the whole ones before it are skipped by their commit.
func (e *exactlyOnce) again(pglogrepl.LSN) bool { return false }

func (e *exactlyOnce) produced(pd *pending, _ bool) {
	e.open.Add(1)
	e.openBytes.Add(pd.size)
}

func (e *exactlyOnce) commit(end pglogrepl.LSN, xid uint32, commitTime time.Time, skipped bool) (bool, error) {
	if e.unproven {
		if tentative, err := e.verifyCommit(end, xid); tentative || err != nil {
			return tentative, err
		}
		skipped = true // verified: it is the checkpoint's, in Kafka
	}
	if !skipped {
		// The records are then whole transactions when the producer's
		// promises come.
		e.txp.Boundary(end, xid, commitTime)
		e.through = max(e.through, end)
	}
	e.open.Store(0)
	e.openBytes.Store(0)
	return false, nil
}

func (e *exactlyOnce) lone(at pglogrepl.LSN) (bool, error) {
	if at <= e.through {
		return true, nil // Kafka holds its dead-letter record
	}
	if e.verify != nil {
		return e.verifyLone(at)
	}
	return false, nil
}

// loneEnded: no commit of the server's ends here: the checkpoint at this
// position names the last commit before it (sink.Commit.Named), which a
// later start verifies before it skips through here.
func (e *exactlyOnce) loneEnded(at pglogrepl.LSN) {
	e.txp.Boundary(at, 0, time.Time{})
	e.through = max(e.through, at)
	e.open.Store(0)
	e.openBytes.Store(0)
}

// lost: the open transaction's records are in no Kafka transaction yet;
// dropped, they are not repeated.
func (e *exactlyOnce) lost() {
	p := e.p
	dropped := e.txp.Discard()
	for _, r := range dropped {
		pd := r.Context.(*pending)
		p.inflight.Add(-1)
		p.inflightBytes.Add(-pd.size)
	}
	if len(dropped) > 0 {
		p.log.Info("the replication connection was lost inside a transaction: its records, in no Kafka transaction yet, are dropped, and PostgreSQL sends it again whole",
			"dropped", len(dropped))
	}
	e.open.Store(0)
	e.openBytes.Store(0)
	e.tentative, e.unproven = 0, false // the server sends them again
}

// reach is the Kafka checkpoint, the one being verified, or one that
// cannot be (Holds).
func (e *exactlyOnce) reach() pglogrepl.LSN {
	n := max(e.through, e.holds)
	if e.verify != nil {
		n = max(n, e.verify.End)
	}
	return n
}

func (e *exactlyOnce) waiting() (int64, int64) { return e.open.Load(), e.openBytes.Load() }
