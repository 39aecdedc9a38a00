package sink

import (
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TxQueue is the exactly-once producer's bookkeeping, without I/O: the
// records produced and not yet in a Kafka transaction, how many of them
// are whole PostgreSQL transactions, and the checkpoint those end at.
// Transactional commits what Take returns; the simulation of the recovery
// protocol (internal/relay) commits it to an in-memory Kafka, so both run
// this one rule. Not safe for concurrent use: the caller locks.
type TxQueue struct {
	queue    []Queued // produced, not yet in a Kafka transaction, in order
	boundary int      // queue[:boundary] are whole PostgreSQL transactions
	through  Commit   // the last of them
}

// Queued is a record produced and its promise.
type Queued struct {
	R       *kgo.Record
	Promise func(*kgo.Record, error)
}

// Add queues r.
func (q *TxQueue) Add(r *kgo.Record, promise func(*kgo.Record, error)) {
	q.queue = append(q.queue, Queued{r, promise})
}

// Boundary says that every record added so far belongs to PostgreSQL
// transactions that ended at or before end (Transactional.Boundary); the
// checkpoint names the transaction xid committed at commitTime, on
// timeline, published in epoch. It returns how many records are whole
// transactions now.
//
// A boundary with no commit (xid 0, zero commitTime: a lone message's
// dead-letter record, at a position no transaction ends) moves the
// checkpoint to end but keeps naming the last commit (Commit.Named), which
// a later start verifies before it skips through end. Without a commit to
// name, the checkpoint names none: a later start cannot verify it and
// skips nothing (a repeat, never a loss). Either way it carries the
// timeline and epoch of its position.
func (q *TxQueue) Boundary(end pglogrepl.LSN, xid uint32, commitTime time.Time, timeline int32, epoch int) int {
	q.boundary = len(q.queue)
	if xid == 0 && commitTime.IsZero() {
		if end > q.through.End {
			if q.through.Xid != 0 && q.through.Named == 0 {
				q.through.Named = q.through.End
			}
			// Its position is on the timeline it was read on, which
			// Decide judges it by (a failover may come between the named
			// commit and the message), in the stream's epoch, which
			// orders it (Checkpoint.Supersedes) even when it names no
			// commit.
			q.through.End, q.through.Timeline, q.through.Epoch = end, timeline, max(q.through.Epoch, epoch)
		}
		return q.boundary
	}
	if end > q.through.End || epoch > q.through.Epoch {
		q.through = Commit{End: end, Timeline: timeline, Xid: xid, CommitTime: commitTime, Epoch: epoch}
	}
	return q.boundary
}

// Discard drops the records added since the last boundary and returns
// them.
func (q *TxQueue) Discard() []*kgo.Record {
	var out []*kgo.Record
	for _, r := range q.queue[q.boundary:] {
		out = append(out, r.R)
	}
	clear(q.queue[q.boundary:])
	q.queue = q.queue[:q.boundary]
	return out
}

// Take removes the records up to the last boundary, for one Kafka
// transaction, and returns them with the checkpoint they end at.
func (q *TxQueue) Take() ([]Queued, Commit) {
	batch := q.queue[:q.boundary:q.boundary]
	q.queue = q.queue[q.boundary:]
	q.boundary = 0
	return batch, q.through
}
