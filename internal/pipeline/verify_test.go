package pipeline

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
)

// pgEpoch is where pgoutput's timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// vtx is tx with the given xid, committed end microseconds after pgEpoch,
// so that each transaction has its own commit.
func vtx(end uint64, xid uint32, ids ...string) [][]byte {
	msgs := tx(end, ids...)
	msgs[0] = be32(be64(be64([]byte{'B'}, end-8), end), xid)
	return msgs
}

// mark names vtx(end, xid)'s commit.
func mark(end uint64, xid uint32) checkpoint.Mark {
	return checkpoint.Mark{End: pglogrepl.LSN(end), Timeline: 1, Xid: xid, CommitTime: pgEpoch.Add(time.Duration(end) * time.Microsecond)}
}

func queuedIDs(s *fakeTx) []string {
	var ids []string
	for _, r := range s.records {
		ids = append(ids, eventID(r))
	}
	return ids
}

// TestVerifiedCheckpointSkips: the transactions up to the checkpoint are
// skipped, and confirmed only once its commit is met (the same xid and
// commit time at its LSN); a keepalive meanwhile moves nothing.
func TestVerifiedCheckpointSkips(t *testing.T) {
	p, ck, s := newExactlyOnce(t, 0, 100)
	o := observe(p)
	p.Verify(mark(600, 60))
	if p.Newest() != 600 {
		t.Fatalf("Newest %s while the checkpoint is verified, want the checkpoint's 0/258", p.Newest())
	}
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(500, 50, "1", "2"))
	if ck.Idle(550) || ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s before the checkpoint was verified", ck.Confirmed())
	}
	feedTx(t, p, vtx(600, 60, "3"))
	if len(s.records) != 0 || ck.Confirmed() != 600 || p.SkippedTransactions() != 2 || o.lost != 0 {
		t.Fatalf("after the checkpoint's commit: %d records, confirmed %s, %d skipped, %d lost; want 0, 0/258, 2, 0",
			len(s.records), ck.Confirmed(), p.SkippedTransactions(), o.lost)
	}
	feedTx(t, p, vtx(700, 70, "4"))
	if ids := queuedIDs(s); len(ids) != 1 || ids[0] != "4" || s.boundaries[0] != 700 {
		t.Fatalf("after the checkpoint: %v, boundaries %v", ids, s.boundaries)
	}
}

// TestRefutedCheckpointReadsAgain is a restore from a base backup: the
// same timeline and LSNs, other transactions. The commit at the
// checkpoint's LSN is another (or the stream passes the LSN without a
// commit there): WAL returns an error that asks to read again, nothing was
// confirmed, and what the server sends again is all published.
func TestRefutedCheckpointReadsAgain(t *testing.T) {
	for _, c := range []struct {
		name          string
		first, second [][]byte // what the server has from the slot's position on
		skipped       uint64   // transactions skipped tentatively when it is refuted
		end           pglogrepl.LSN
	}{
		{"another commit at the checkpoint", vtx(500, 50, "1", "2"), vtx(600, 99, "3"), 2, 600},
		{"no commit at the checkpoint", vtx(500, 50, "1", "2"), vtx(650, 65, "3"), 1, 650},
		// Its own rows were skipped, tentatively, before its commit.
		{"the first transaction is another at the checkpoint", vtx(600, 99, "1", "2"), vtx(700, 70, "3"), 1, 700},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ck, s := newExactlyOnce(t, 0, 100)
			o := observe(p)
			p.Verify(mark(600, 60))
			if err := feed(t, p, relationMsg()); err != nil {
				t.Fatal(err)
			}
			err := feed(t, p, c.first...)
			if err == nil {
				err = feed(t, p, c.second...)
			}
			var ue *UnverifiedError
			if !errors.As(err, &ue) || !ue.Resend() || ue.Skipped != c.skipped || ue.Checkpoint.End != 600 {
				t.Fatalf("err = %v, want an *UnverifiedError to read %d transactions again", err, c.skipped)
			}
			if ck.Confirmed() != 100 || o.lost != 1 || p.SkippedTransactions() != 0 {
				t.Fatalf("confirmed %s, lost %d, skipped %d; want 0/64, 1, 0", ck.Confirmed(), o.lost, p.SkippedTransactions())
			}
			// The stream reads again from the confirmed position.
			p.Lost()
			feedTx(t, p, c.first, c.second)
			if ids := queuedIDs(s); len(ids) != 3 {
				t.Fatalf("read again: queued %v, want all 3", ids)
			}
			s.commit()
			if ck.Confirmed() != c.end {
				t.Fatalf("confirmed %s after the commit, want %s", ck.Confirmed(), c.end)
			}
			if !ck.Idle(900) {
				t.Fatal("keepalives still held after the checkpoint was refuted")
			}
		})
	}
}

// TestCheckpointPassedWithNothingSkipped: the first transaction the server
// sends is past the checkpoint, which the slot's position was before: the
// checkpoint's commit is not on this history, but nothing was skipped, so
// the stream goes on; the lost history is reported.
func TestCheckpointPassedWithNothingSkipped(t *testing.T) {
	p, _, s := newExactlyOnce(t, 0, 100)
	o := observe(p)
	p.Verify(mark(600, 60))
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(700, 70, "1"))
	if ids := queuedIDs(s); len(ids) != 1 || o.lost != 1 {
		t.Fatalf("queued %v, lost %d", ids, o.lost)
	}
}

// TestCheckpointBehindTheStart needs no proof: the server sends nothing
// that ended before the slot's position, so nothing is held.
func TestCheckpointBehindTheStart(t *testing.T) {
	p, ck, s := newExactlyOnce(t, 0, 100)
	p.Verify(mark(100, 10))
	if !ck.Idle(200) {
		t.Fatal("a keepalive is held for a checkpoint at the start")
	}
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(300, 30, "1"))
	if len(s.records) != 1 {
		t.Fatalf("queued %d records", len(s.records))
	}
}

// TestLostDuringVerification: a connection lost while transactions are
// skipped tentatively starts over from the same position, still
// verifying.
func TestLostDuringVerification(t *testing.T) {
	p, ck, s := newExactlyOnce(t, 0, 100)
	p.Verify(mark(600, 60))
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(500, 50, "1"))
	if err := feed(t, p, vtx(600, 60, "2")[:2]...); err != nil {
		t.Fatal(err)
	}
	p.Lost()
	feedTx(t, p, vtx(500, 50, "1"), vtx(600, 60, "2"))
	if len(s.records) != 0 || ck.Confirmed() != 600 || p.SkippedTransactions() != 2 {
		t.Fatalf("%d records, confirmed %s, skipped %d", len(s.records), ck.Confirmed(), p.SkippedTransactions())
	}
}

// TestNewestReachesWhatWasHandedOn: what a failover's fork is compared
// with covers a transaction still waiting for its acknowledgement and, in
// exactly-once delivery, the Kafka checkpoint, not only the confirmed
// position.
func TestNewestReachesWhatWasHandedOn(t *testing.T) {
	p, ck, _ := newTestPipeline(t, Fail, 100)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	for i, msg := range [][]byte{beginMsg(492), row("1", "payment"), commitMsg(500)} {
		if err := walAt(t, p, uint64(400+40*i), msg); err != nil {
			t.Fatal(err)
		}
	}
	if ck.Confirmed() >= 500 || p.Newest() != 500 {
		t.Fatalf("confirmed %s, Newest %s with a transaction waiting for its ack; want Newest 0/1F4", ck.Confirmed(), p.Newest())
	}
	eo, _, _ := newExactlyOnce(t, 700, 100)
	if eo.Newest() != 700 {
		t.Fatalf("Newest %s with a Kafka checkpoint at 0/2BC", eo.Newest())
	}
}

// TestNewestCountsAnUnverifiedCheckpoint: a checkpoint the stream cannot
// verify skips nothing, but Kafka holds events up to it: a reconnect to a
// server whose WAL ends before it (a restore) must find a lost history.
func TestNewestCountsAnUnverifiedCheckpoint(t *testing.T) {
	p, _, _ := newExactlyOnce(t, 0, 100)
	p.Holds(0x900)
	if got := p.Newest(); got != 0x900 {
		t.Fatalf("Newest %s, want the checkpoint's 0/900", got)
	}
}
