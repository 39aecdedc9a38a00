package checkpoint

import (
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

type txState uint8

const (
	txOpen      txState = iota // Begin seen, Commit not yet
	txCommitted                // Commit seen, waiting for acks or for older transactions
	txDone                     // confirmed and removed from the queue
	txDiscarded                // dropped by Discard; PostgreSQL will resend it
)

func (s txState) String() string {
	switch s {
	case txOpen:
		return "open"
	case txCommitted:
		return "committed"
	case txDone:
		return "confirmed"
	case txDiscarded:
		return "discarded"
	}
	return fmt.Sprintf("txState(%d)", uint8(s))
}

// Tx is one transaction known to a Tracker, from Begin until it is confirmed
// or discarded. It is only a handle: pass it back to the Tracker that
// returned it. Its fields are guarded by that Tracker's mutex, which is why
// it has no methods of its own.
type Tx struct {
	commitTime time.Time
	end        pglogrepl.LSN // TransactionEndLSN, set by Commit
	inflight   int           // records added and not yet acked
	state      txState
	// merged counts the transactions that completed while this one was
	// still waiting and were folded into it (end is the newest's).
	merged int
}

// Tracker computes the WAL position that may be confirmed to PostgreSQL.
//
// Calling contract (the arithmetic is only correct if it holds):
//   - Begin, Add, Commit, Discard and Idle are called by the one goroutine that
//     reads the replication stream, in stream order. At most one transaction
//     is open (begun, neither committed nor discarded) at a time.
//   - Add(tx, n) must happen before those n records are handed to the producer
//     (else their Ack could come first and panic) and before Commit(tx) (else
//     tx could be confirmed while they are still in flight; Add after Commit
//     panics for that reason).
//   - Ack is called once per added record, from any goroutine, when the broker
//     acknowledged it. A record that failed has no Ack: the position then
//     stays behind it, which is the point.
//
// Misuse that would make the Tracker confirm an unacked record panics with a
// message starting "checkpoint:".
//
// A Tracker is safe for concurrent use.
type Tracker struct {
	mu        sync.Mutex
	confirmed pglogrepl.LSN
	open      *Tx // the open transaction, always the newest entry of the queue

	// queue is a ring buffer (power-of-two length) of the transactions that
	// were begun and are not yet confirmed, oldest first. A transaction
	// that is complete at its Commit while an older one still waits is
	// folded into the entry before it (see Commit), so the queue holds at
	// most one entry per transaction with records in flight, plus the open
	// one, however many transactions wait behind them.
	queue   []*Tx
	head, n int
	pending int // transactions the queue stands for, folded ones included

	done uint64        // transactions confirmed so far
	wait chan struct{} // closed on the next advance; nil until someone waits

	held bool // keepalives move nothing (Hold)
}

// New returns a Tracker whose confirmed position starts at start, the slot's
// confirmed_flush_lsn: PostgreSQL resends everything that commits after it.
func New(start pglogrepl.LSN) *Tracker {
	return &Tracker{confirmed: start, queue: make([]*Tx, 16)}
}

// Begin records that a transaction started (a Begin message arrived).
// commitTime is the Begin message's CommitTime; Oldest reports it for lag.
// It panics if another transaction is still open: that one would otherwise
// never complete and the confirmed position would stall without a word.
func (t *Tracker) Begin(commitTime time.Time) *Tx {
	tx := &Tx{commitTime: commitTime} // the only allocation; outside the lock
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open != nil {
		panic("checkpoint: Begin while another transaction is open; Commit or Discard it first")
	}
	t.open = tx
	t.push(tx)
	t.pending++
	return tx
}

// Add records that n more records of tx are in flight to the broker. Call it
// before producing them. Adding to a discarded transaction is ignored.
func (t *Tracker) Add(tx *Tx, n int) {
	if n < 0 {
		panic(fmt.Sprintf("checkpoint: Add with negative count %d", n))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch tx.state {
	case txOpen:
		tx.inflight += n
	case txDiscarded:
	default:
		panic(fmt.Sprintf("checkpoint: Add to a %s transaction; records must be added before Commit", tx.state))
	}
}

// Commit records that tx's Commit message arrived; end is its
// TransactionEndLSN. Once tx and every older transaction are fully acked,
// the confirmed position moves to end (never backwards: a transaction
// resent after a reconnect may end below the confirmed position).
//
// A transaction with nothing in flight at its Commit (no outbox row, or
// every record already acked) is complete: it may be confirmed exactly
// when the transaction before it is. So when one is still waiting, tx is
// folded into it rather than queued, and that entry's end becomes tx's.
// Transactions without outbox rows (other tables of the publication, or
// any writing transaction before PostgreSQL 15) then cost no memory while
// Kafka is away, however many commit.
func (t *Tracker) Commit(tx *Tx, end pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx.state != txOpen || t.open != tx {
		panic(fmt.Sprintf("checkpoint: Commit of a %s transaction that is not this Tracker's open transaction", tx.state))
	}
	tx.state = txCommitted
	tx.end = end
	t.open = nil
	if tx.inflight != 0 {
		return
	}
	if t.n >= 2 {
		// tx is the newest entry; the one before it is committed (only
		// one transaction is open at a time) and still waiting, or the
		// queue would not hold it.
		mask := len(t.queue) - 1
		prev := t.queue[(t.head+t.n-2)&mask]
		prev.end = max(prev.end, end)
		prev.merged += 1 + tx.merged
		t.n--
		t.queue[(t.head+t.n)&mask] = nil
		return
	}
	t.advance()
}

// Ack records that the broker acknowledged one record of tx. Acks may come
// before or after tx's Commit and in any order across transactions. An Ack
// for a discarded transaction is ignored. More Acks than Adds panics: it
// would let the position pass a record that was never acknowledged.
func (t *Tracker) Ack(tx *Tx) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx.state == txDiscarded {
		return
	}
	if tx.inflight == 0 {
		panic(fmt.Sprintf("checkpoint: Ack of a %s transaction with no record in flight (more Acks than Adds)", tx.state))
	}
	tx.inflight--
	if tx.inflight == 0 && tx.state == txCommitted {
		t.advance()
	}
}

// Discard forgets tx, which was open (no Commit yet) when the replication
// connection was lost: PostgreSQL will resend it whole, so its records that
// are still in flight no longer hold anything back, and their Acks are
// ignored. Discarding a discarded transaction does nothing. Discarding a
// committed one panics: it will not be resent if the position passes it, so
// its acks must still be waited for.
func (t *Tracker) Discard(tx *Tx) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tx.state == txDiscarded {
		return
	}
	if tx.state != txOpen || t.open != tx {
		panic(fmt.Sprintf("checkpoint: Discard of a %s transaction; only the open transaction can be discarded", tx.state))
	}
	tx.state = txDiscarded
	tx.inflight = 0
	t.open = nil
	t.pending--
	// The open transaction is the newest entry, so it is removed from the tail.
	t.n--
	t.queue[(t.head+t.n)&(len(t.queue)-1)] = nil
}

// Idle handles a keepalive whose server WAL end is walEnd: the confirmed
// position moves to walEnd only if no transaction is open or waiting for
// acks (everything the server sent before walEnd is then done) and walEnd is
// ahead of it. It reports whether the position moved. Call it in stream
// order from the replication goroutine, like Begin and Commit.
func (t *Tracker) Idle(walEnd pglogrepl.LSN) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held || t.n > 0 || walEnd <= t.confirmed {
		return false
	}
	t.confirmed = walEnd
	t.notify()
	return true
}

// Hold, while on, keeps keepalives from moving the confirmed position
// (Idle does nothing); committed transactions still move it. The pipeline
// holds it while it skips transactions it cannot yet prove Kafka has (a
// checkpoint not yet verified): it commits none of them here, so the
// position stays where the stream started, and a keepalive must not carry
// it past them either, or the server would not send them again.
func (t *Tracker) Hold(on bool) {
	t.mu.Lock()
	t.held = on
	t.mu.Unlock()
}

// Newest returns the end LSN of the newest transaction committed here,
// confirmed or still waiting for acks, or the confirmed position if that
// is later: how far the stream has read what it may confirm.
func (t *Tracker) Newest() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	newest := t.confirmed
	mask := len(t.queue) - 1
	for i := range t.n {
		newest = max(newest, t.queue[(t.head+i)&mask].end)
	}
	return newest
}

// Confirmed returns the position that may be sent to PostgreSQL as flushed
// (and applied). It never decreases.
func (t *Tracker) Confirmed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed
}

// Wait returns a channel that is closed the next time Confirmed advances
// after this call. Until then every call returns the same channel, so any
// number of goroutines may wait on it; after it is closed, call Wait again
// for the next advance. To miss no advance, call Wait before Confirmed:
//
//	for {
//		ch := t.Wait()
//		send(t.Confirmed())
//		<-ch // or select with a ticker and ctx.Done()
//	}
//
// Several advances may happen before a waiter runs; Confirmed then returns
// the latest.
func (t *Tracker) Wait() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.wait == nil {
		t.wait = make(chan struct{})
	}
	return t.wait
}

// Oldest returns the commit time of the oldest transaction not yet confirmed
// (open ones included), for a replication lag metric. ok is false when there
// is none.
func (t *Tracker) Oldest() (commitTime time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return time.Time{}, false
	}
	return t.queue[t.head].commitTime, true
}

// Pending returns the number of transactions begun and not yet confirmed,
// open ones included, discarded ones not.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending
}

// Transactions returns the number of transactions confirmed so far (a
// transaction resent after a reconnect counts again).
func (t *Tracker) Transactions() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done
}

// push appends tx to the queue, doubling the ring when full. Called with mu held.
func (t *Tracker) push(tx *Tx) {
	if t.n == len(t.queue) {
		grown := make([]*Tx, 2*len(t.queue))
		k := copy(grown, t.queue[t.head:])
		copy(grown[k:], t.queue[:t.head])
		t.queue, t.head = grown, 0
	}
	t.queue[(t.head+t.n)&(len(t.queue)-1)] = tx
	t.n++
}

// advance confirms the longest prefix of the queue whose transactions are
// committed and fully acked. Each transaction is popped once, so the cost is
// O(1) amortised per transaction. Called with mu held.
func (t *Tracker) advance() {
	moved := false
	mask := len(t.queue) - 1
	for t.n > 0 {
		tx := t.queue[t.head]
		if tx.state != txCommitted || tx.inflight != 0 {
			break
		}
		tx.state = txDone
		t.queue[t.head] = nil
		t.head = (t.head + 1) & mask
		t.n--
		t.pending -= 1 + tx.merged
		t.done += 1 + uint64(tx.merged)
		if tx.end > t.confirmed {
			t.confirmed = tx.end
			moved = true
		}
	}
	if moved {
		t.notify()
	}
}

// notify closes the current Wait channel, if any. Called with mu held.
func (t *Tracker) notify() {
	if t.wait != nil {
		close(t.wait)
		t.wait = nil
	}
}
