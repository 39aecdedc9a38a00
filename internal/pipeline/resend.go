package pipeline

import (
	"sync"

	"github.com/jackc/pglogrepl"
)

// A transaction sent again is not published again (at-least-once
// delivery).
//
// A position can only be confirmed at a commit, so when the replication
// connection is lost PostgreSQL sends again, from its start, every
// transaction this process has not confirmed: the one that was open, and
// those committed but still waiting for acknowledgements. It sends the same
// changes at the same LSNs, in the same order. Within one process the
// pipeline remembers, for each transaction whose records it produced and
// that is not yet confirmed, which of its changes the broker acknowledged,
// and when the transaction comes again it publishes only the others: what
// was in flight when the connection broke and was still unanswered when
// the transaction came again. That is a repeat at most, never a loss: a
// change is passed over only once the broker acknowledged its record.
//
// A transaction is known again by its xid, the LSN of its commit record
// (the Begin message's final LSN) and its commit time: after a promotion or
// a restore the server's WAL past the fork holds other transactions, which
// may reuse both an xid and a commit LSN, never also the commit time to the
// microsecond. A change within it is known by its position: its LSN and,
// since the rows of one multi-row INSERT or COPY share one LSN, how many
// changes of the transaction came before it at that LSN. Positions increase
// through a transaction as the server sends it. The changes are numbered
// in the order they come; a change sent again has the same number and
// position as before, which is checked.
//
// What is remembered of a sending stays small: the acknowledged prefix
// (every change up to a number) and the changes acknowledged beyond it,
// which the prefix absorbs as the acknowledgements in between arrive. A
// sending that the connection cut short keeps the one before it, which
// knows of changes it did not reach.
//
// In exactly-once delivery there is nothing to remember: the open
// transaction's records are in no Kafka transaction when the connection is
// lost (they are dropped, nothing of them was acknowledged, and nothing of
// them is in Kafka), and the whole transactions queued before it are
// skipped by their commit LSN (SkipThrough, Boundary).

// position is a change's place in the WAL: its LSN, and how many changes
// of the same transaction came before it at that LSN.
type position struct {
	lsn pglogrepl.LSN
	k   uint32
}

func (a position) atOrBefore(b position) bool { return a.lsn < b.lsn || (a.lsn == b.lsn && a.k <= b.k) }

// sentTx is what the pipeline remembers of one sending of a transaction
// it produced records of, until the transaction is confirmed. Its changes
// are numbered from 0, in the order the server sends them.
type sentTx struct {
	xid   uint32
	final pglogrepl.LSN // the commit record's LSN
	when  int64         // the commit time, unix nanoseconds
	end   pglogrepl.LSN // the commit's end LSN; 0 while open (replication goroutine only)
	// prev is what was remembered of the transaction's sending before
	// this one, which knows of acknowledgements of changes this sending
	// has not reached yet.
	prev *sentTx

	mu sync.Mutex // acknowledgements come from the producer's promises
	// next is the first change not acknowledged: changes 0 to next-1 are
	// in Kafka, the last of them at through. ahead are changes after next
	// acknowledged out of order, by number.
	next    uint32
	through position
	ahead   map[uint32]position
}

// acked records that the broker acknowledged change seq, at pos.
func (s *sentTx) acked(seq uint32, pos position) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq != s.next {
		if s.ahead == nil {
			s.ahead = make(map[uint32]position)
		}
		s.ahead[seq] = pos
		return
	}
	s.through = pos
	s.next++
	for len(s.ahead) > 0 {
		q, ok := s.ahead[s.next]
		if !ok {
			break
		}
		delete(s.ahead, s.next)
		s.through = q
		s.next++
	}
}

// holds reports whether the broker acknowledged change seq, at pos, in
// this sending or one before.
func (s *sentTx) holds(seq uint32, pos position) bool {
	for ; s != nil; s = s.prev {
		if s.has(seq, pos) {
			return true
		}
	}
	return false
}

func (s *sentTx) has(seq uint32, pos position) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq < s.next {
		return pos.atOrBefore(s.through)
	}
	q, ok := s.ahead[seq]
	return ok && q == pos
}

// resendState is the pipeline's memory of what it sent (replication
// goroutine only; the sentTx entries' acknowledgements are guarded by
// their own lock).
type resendState struct {
	// sent are the transactions of this connection with records produced,
	// oldest first; the confirmed ones are dropped as new ones begin.
	sent []*sentTx
	// again are, after a lost connection, those the server will send
	// again, oldest first, each until its Begin comes, or a later one.
	again []*sentTx
	// cur is what is remembered of the open transaction's sending, once
	// a change of it was published or passed over; earlier, when it is
	// one sent before, what was remembered of that sending.
	cur, earlier *sentTx
	// xid, final and when name the open transaction; at is the position
	// of its current change, seq that change's number and n the number
	// of its changes so far.
	xid     uint32
	final   pglogrepl.LSN
	when    int64
	at      position
	seq, n  uint32
	skipped int // changes not published again
}

// resendBegin is a Begin message: xid's transaction commits at final, at
// time when.
func (a *atLeastOnce) resendBegin(xid uint32, final pglogrepl.LSN, when int64) {
	r := &a.resend
	confirmed := a.p.ckpt.Confirmed()
	i := 0
	for ; i < len(r.sent) && r.sent[i].end != 0 && r.sent[i].end <= confirmed; i++ {
		r.sent[i] = nil
	}
	r.sent = r.sent[i:]
	// The server sends again in commit order: those committed before this
	// one that did not come were confirmed meanwhile.
	for len(r.again) > 0 && r.again[0].final < final {
		r.again[0] = nil
		r.again = r.again[1:]
	}
	r.earlier = nil
	if len(r.again) > 0 && r.again[0].final == final {
		if a := r.again[0]; a.xid == xid && a.when == when {
			r.earlier = a
		}
		r.again[0] = nil
		r.again = r.again[1:]
	}
	r.xid, r.final, r.when, r.cur = xid, final, when, nil
	r.at, r.seq, r.n, r.skipped = position{}, 0, 0, 0
}

// resendChange places a change of the open transaction at lsn and reports
// whether the broker acknowledged it when the transaction was sent before:
// then it is not published again.
func (a *atLeastOnce) resendChange(lsn pglogrepl.LSN) (skip bool) {
	r := &a.resend
	if lsn == r.at.lsn {
		r.at.k++
	} else {
		r.at = position{lsn: lsn}
	}
	r.seq, r.n = r.n, r.n+1
	if e := r.earlier; e == nil || !e.holds(r.seq, r.at) {
		return false
	}
	// In Kafka already: this sending's memory has it acknowledged.
	a.resendCurrent().acked(r.seq, r.at)
	r.skipped++
	return true
}

// resendCurrent is what is remembered of the open transaction's sending,
// made at the first change published or passed over.
func (a *atLeastOnce) resendCurrent() *sentTx {
	r := &a.resend
	if r.cur == nil {
		r.cur = &sentTx{xid: r.xid, final: r.final, when: r.when, prev: r.earlier}
		r.sent = append(r.sent, r.cur)
	}
	return r.cur
}

// resendSent ties pd, the record of the open transaction's current
// change, to what is remembered of the transaction.
func (a *atLeastOnce) resendSent(pd *pending) {
	r := &a.resend
	pd.sent, pd.sentSeq, pd.at = a.resendCurrent(), r.seq, r.at
}

// resendCommit is the open transaction's Commit, ending at end.
func (a *atLeastOnce) resendCommit(end pglogrepl.LSN) {
	r := &a.resend
	switch {
	case r.cur != nil:
		r.cur.end = end
	case r.earlier != nil:
		// Nothing of it came this time (no change, or none at all
		// published or passed over): what was remembered holds until the
		// transaction is confirmed.
		r.earlier.end = end
		r.sent = append(r.sent, r.earlier)
	}
	if r.earlier != nil {
		a.p.log.Info("a transaction sent again after the connection was lost: the events the broker had acknowledged are not published again",
			"xid", r.xid, "commit_lsn", r.final, "not_published_again", r.skipped)
	}
	r.cur, r.earlier = nil, nil
}

// resendLost is a lost connection: every transaction not yet confirmed
// comes again, in the order it came.
func (a *atLeastOnce) resendLost() {
	r := &a.resend
	confirmed := a.p.ckpt.Confirmed()
	var again []*sentTx
	for _, s := range r.sent {
		if s.end == 0 || s.end > confirmed {
			again = append(again, s)
		}
	}
	if r.earlier != nil && r.cur == nil {
		// Lost again before a change of it came: what was remembered
		// holds as it was.
		again = append(again, r.earlier)
	}
	r.again = append(again, r.again...)
	clear(r.sent)
	r.sent = r.sent[:0]
	r.cur, r.earlier = nil, nil
}
