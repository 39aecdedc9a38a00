package sink

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTxQueueLoneBoundary: a boundary with no commit moves the checkpoint
// and keeps naming the last commit; named or not, it carries the timeline
// its position was read on (Decide judges it by it) and the epoch, which
// orders it among the stream's checkpoints (Checkpoint.Supersedes).
func TestTxQueueLoneBoundary(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var q TxQueue
	q.Add(&kgo.Record{}, func(*kgo.Record, error) {})
	q.Boundary(0x100, 0, time.Time{}, 2, 3)
	batch, c := q.Take()
	if len(batch) != 1 || c != (Commit{End: 0x100, Timeline: 2, Epoch: 3}) {
		t.Fatalf("took %d records through %+v, want 1 through 0/100 on timeline 2 in epoch 3", len(batch), c)
	}
	earlier := Checkpoint{Found: true, LSN: 0x200, Commit: Commit{End: 0x200, Timeline: 2, Epoch: 2, Xid: 7, CommitTime: at}}
	if !(Checkpoint{Found: true, LSN: 0x100, Commit: c}).Supersedes(earlier) {
		t.Fatal("a checkpoint naming no commit was ordered below one of an earlier epoch")
	}

	q.Add(&kgo.Record{}, func(*kgo.Record, error) {})
	q.Boundary(0x300, 9, at, 2, 3)
	q.Add(&kgo.Record{}, func(*kgo.Record, error) {})
	q.Add(&kgo.Record{}, func(*kgo.Record, error) {}) // open: not taken
	q.Boundary(0x300, 0, time.Time{}, 2, 3)
	if n := len(q.Discard()); n != 0 {
		t.Fatalf("discarded %d records after a boundary", n)
	}
	q.Add(&kgo.Record{}, func(*kgo.Record, error) {})
	q.Boundary(0x380, 0, time.Time{}, 3, 4)           // on a timeline that forked after the commit
	q.Add(&kgo.Record{}, func(*kgo.Record, error) {}) // open
	batch, c = q.Take()
	want := Commit{End: 0x380, Timeline: 3, Xid: 9, CommitTime: at, Epoch: 4, Named: 0x300}
	if len(batch) != 4 || c != want || len(q.Discard()) != 1 {
		t.Fatalf("took %d records through %+v, want 4 through %+v and one left open", len(batch), c, want)
	}
}
