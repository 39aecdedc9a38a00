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
// that is not yet confirmed, how far the broker acknowledged it without a
// gap (its acknowledged prefix), and when the transaction comes again it
// publishes only what follows that prefix. What was in flight when the
// connection broke, and what the broker acknowledged out of order after a
// record still in flight, is published again: a repeat, never a loss.
//
// A transaction is known again by its xid, the LSN of its commit record
// (the Begin message's final LSN) and its commit time: after a promotion or
// a restore the server's WAL past the fork holds other transactions, which
// may reuse both an xid and a commit LSN, never also the commit time to the
// microsecond. A change within it is known by its position: its
// LSN and, since the rows of one multi-row INSERT or COPY share one LSN, how
// many changes of the transaction came before it at that LSN. Positions
// increase through a transaction as the server sends it.
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

// sentTx is what the pipeline remembers of one transaction it produced
// records of, until the transaction is confirmed.
type sentTx struct {
	xid   uint32
	final pglogrepl.LSN // the commit record's LSN
	when  int64         // the commit time, unix nanoseconds
	end   pglogrepl.LSN // the commit's end LSN; 0 while open (replication goroutine only)
	n     uint32        // records produced (replication goroutine only)

	mu sync.Mutex // acknowledgements come from the producer's promises
	// through is the last change of the acknowledged prefix, valid when
	// has: it and every change of the transaction before it are in Kafka.
	through position
	has     bool
	next    uint32              // the record whose acknowledgement extends the prefix
	ahead   map[uint32]position // acknowledged out of order, by record number
}

// acked records that the broker acknowledged record seq, the change at pos.
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
	s.through, s.has = pos, true
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

// holds reports whether the change at pos is in the acknowledged prefix.
func (s *sentTx) holds(pos position) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.has && pos.atOrBefore(s.through)
}

// resendState is the pipeline's memory of what it sent (replication
// goroutine only; the sent entries' prefixes move with acknowledgements).
type resendState struct {
	// sent are the transactions of this connection with records produced,
	// oldest first; the confirmed ones are dropped as new ones begin.
	sent []*sentTx
	// again are, after a lost connection, those the server will send
	// again, oldest first, each until its Begin comes, or a later one.
	again []*sentTx
	cur   *sentTx // the open transaction's, once it produced a record
	// earlier is the open transaction's from before the connection was
	// lost while its changes are still in that acknowledged prefix; nil
	// once a change is past it, from then on every change is published.
	earlier *sentTx
	// xid, final and when name the open transaction; at is the position of its
	// last change; skipped counts its changes not published again and
	// last is the last of them.
	xid     uint32
	final   pglogrepl.LSN
	when    int64
	at      position
	skipped int
	last    position
}

// resendBegin is a Begin message: xid's transaction commits at final, at
// time when.
func (p *Pipeline) resendBegin(xid uint32, final pglogrepl.LSN, when int64) {
	r := &p.resend
	confirmed := p.ckpt.Confirmed()
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
			r.earlier = r.again[0]
		}
		r.again[0] = nil
		r.again = r.again[1:]
	}
	r.xid, r.final, r.when, r.cur = xid, final, when, nil
	r.at, r.skipped, r.last = position{}, 0, position{}
}

// resendChange places a change of the open transaction at lsn and reports
// whether it is in what the broker acknowledged when the transaction was
// sent before: then it is not published again.
func (p *Pipeline) resendChange(lsn pglogrepl.LSN) (skip bool) {
	r := &p.resend
	if lsn == r.at.lsn {
		r.at.k++
	} else {
		r.at = position{lsn: lsn}
	}
	if r.earlier == nil {
		return false
	}
	if r.earlier.holds(r.at) {
		r.skipped++
		r.last = r.at
		return true
	}
	p.log.Info("a transaction sent again after the connection was lost: the events the broker acknowledged before are not published again",
		"xid", r.xid, "commit_lsn", r.final, "not_published_again", r.skipped, "from_lsn", lsn)
	r.earlier = nil
	return false
}

// resendSent numbers pd, a record of the open transaction's current
// change, in what is remembered of the transaction.
func (p *Pipeline) resendSent(pd *pending) {
	r := &p.resend
	if r.cur == nil {
		// What this sending skipped is acknowledged: the prefix starts
		// after it.
		r.cur = &sentTx{xid: r.xid, final: r.final, when: r.when, through: r.last, has: r.skipped > 0}
		r.sent = append(r.sent, r.cur)
	}
	pd.sent, pd.sentSeq, pd.at = r.cur, r.cur.n, r.at
	r.cur.n++
}

// resendCommit is the open transaction's Commit, ending at end.
func (p *Pipeline) resendCommit(end pglogrepl.LSN) {
	r := &p.resend
	if r.cur != nil {
		r.cur.end = end
	}
	if r.earlier != nil {
		p.log.Info("a transaction sent again after the connection was lost: the broker had acknowledged all of it, nothing is published again",
			"xid", r.xid, "commit_lsn", r.final, "not_published_again", r.skipped)
	}
	r.cur, r.earlier = nil, nil
}

// resendLost is a lost connection: every transaction not yet confirmed
// comes again, in the order it came.
func (p *Pipeline) resendLost() {
	r := &p.resend
	confirmed := p.ckpt.Confirmed()
	var again []*sentTx
	for _, s := range r.sent {
		if s.end == 0 || s.end > confirmed {
			again = append(again, s)
		}
	}
	if r.earlier != nil {
		// Lost again while still inside that prefix: it holds as it did.
		again = append(again, r.earlier)
	}
	r.again = append(again, r.again...)
	clear(r.sent)
	r.sent = r.sent[:0]
	r.cur, r.earlier = nil, nil
}
