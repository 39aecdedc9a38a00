package pipeline

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// newExactlyOnceMessages is newExactlyOnce with outbox messages: a
// non-transactional one is dead-lettered.
func newExactlyOnceMessages(t *testing.T) (*Pipeline, *checkpoint.Tracker, *fakeTx) {
	t.Helper()
	ck := checkpoint.New(100)
	s := &fakeTx{fakeSink: fakeSink{t: t}}
	p, err := New(Config{
		Mapping:    mapping.DefaultConfig(),
		OnBadEvent: DeadLetter, DeadLetterTopic: "dlq", MessagePrefix: "cdc_outbox",
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return p, ck, s
}

// lone is a non-transactional outbox message whose record ends at lsn.
func lone(lsn uint64, id string) []byte {
	return logicalMsg(false, lsn, "cdc_outbox", envelope(id, "payment"))
}

// walAt hands msg to p as the stream does, at lsn.
func walAt(t *testing.T, p *Pipeline, lsn uint64, msg []byte) error {
	t.Helper()
	return p.WAL(pglogrepl.LSN(lsn), msg)
}

// TestLoneMessageWhileVerifyingConfirmsNothing: a restored cluster on the
// same timeline whose WAL holds a non-transactional outbox message before
// the Kafka checkpoint. While the checkpoint is not proven, the message is
// skipped tentatively like the transactions before it: its dead-letter
// record would end a Kafka transaction and confirm its position, past the
// transactions skipped tentatively, which a refutation could then never
// have sent again. Refuted, all of them are read again and published.
func TestLoneMessageWhileVerifyingConfirmsNothing(t *testing.T) {
	p, ck, s := newExactlyOnceMessages(t)
	p.Verify(mark(600, 60))
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(300, 30, "1"))
	if err := walAt(t, p, 400, lone(400, "m1")); err != nil {
		t.Fatal(err)
	}
	s.commit()
	if len(s.boundaries) != 0 || len(s.records) != 0 || ck.Confirmed() != 100 {
		t.Fatalf("a lone message while the checkpoint is unproven: boundaries %v, %d records, confirmed %s; want none, 0, 0/64",
			s.boundaries, len(s.records), ck.Confirmed())
	}
	// Another transaction at the checkpoint's position: refuted; the two
	// transactions and the message between them are read again.
	err := feed(t, p, vtx(600, 99, "2")...)
	var ue *UnverifiedError
	if !errors.As(err, &ue) || ue.Skipped != 3 {
		t.Fatalf("err = %v, want an *UnverifiedError reading 3 again (two transactions and the message)", err)
	}
	p.Lost()
	feedTx(t, p, vtx(300, 30, "1"))
	if err := walAt(t, p, 400, lone(400, "m1")); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(600, 99, "2"))
	if ids := queuedIDs(s); len(ids) != 3 || ids[0] != "1" || s.records[1].Topic != "dlq" || ids[2] != "2" {
		t.Fatalf("read again: %v (topics %s, %s), want 1, the message's dead letter, 2", ids, s.records[0].Topic, s.records[1].Topic)
	}
	s.commit()
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s after all was read again, want 0/258", ck.Confirmed())
	}
}

// TestLoneMessageVerifiedOrRefutedAtTheCheckpoint: the checkpoint names
// the last commit before a message it was written at. A message past it,
// met before the named commit, refutes it; the message at it is skipped
// once the named commit verified the checkpoint.
func TestLoneMessageVerifiedOrRefutedAtTheCheckpoint(t *testing.T) {
	m := mark(650, 50)
	m.Named, m.CommitTime = 500, mark(500, 50).CommitTime

	p, ck, s := newExactlyOnceMessages(t)
	p.Verify(m)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(500, 50, "1"))
	if err := walAt(t, p, 650, lone(650, "m1")); err != nil {
		t.Fatal(err)
	}
	s.commit()
	if len(s.records) != 0 || ck.Confirmed() != 500 {
		t.Fatalf("verified by its named commit: %d records, confirmed %s; want the message skipped and 0/1F4", len(s.records), ck.Confirmed())
	}

	p, _, _ = newExactlyOnceMessages(t)
	o := observe(p)
	p.Verify(m)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(300, 30, "1"))
	err := walAt(t, p, 700, lone(700, "m2"))
	var ue *UnverifiedError
	if !errors.As(err, &ue) || ue.Skipped != 1 || o.lost != 1 {
		t.Fatalf("a message past the checkpoint before its commit: err = %v, lost %d; want the checkpoint refuted, 1 to read again", err, o.lost)
	}
}

// TestLoneMessageCheckpointWithTheSlotAtItsCommit: the process stopped
// after the Kafka commit of a lone message's dead-letter record and
// before the slot was told, which stays at the commit the checkpoint
// names. The server does not send that commit again, only the message: it
// verifies the checkpoint. Its dead-letter record is not written a second
// time, and the next transaction refutes nothing (a lost history that
// never happened would begin an epoch).
func TestLoneMessageCheckpointWithTheSlotAtItsCommit(t *testing.T) {
	m := mark(650, 50)
	m.Named, m.CommitTime = 500, mark(500, 50).CommitTime

	p, ck, s := newExactlyOnceMessages(t)
	o := observe(p)
	if !ck.Idle(500) {
		t.Fatal("the slot's position was not taken")
	}
	p.Verify(m)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	if err := walAt(t, p, 650, lone(650, "m1")); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(800, 80, "2"))
	if ids := queuedIDs(s); len(ids) != 1 || ids[0] != "2" || o.lost != 0 {
		t.Fatalf("queued %v, lost %d; want only 2 (the message's dead letter is in Kafka already), nothing lost", ids, o.lost)
	}
	s.commit()
	if ck.Confirmed() != 800 {
		t.Fatalf("confirmed %s, want 0/320", ck.Confirmed())
	}

	// The same checkpoint, and the server has a transaction before the
	// message: not the history the checkpoint was written on.
	p, _, _ = newExactlyOnceMessages(t)
	o = observe(p)
	p.ckpt.Idle(500)
	p.Verify(m)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, vtx(600, 60, "3"))
	if o.lost != 1 {
		t.Fatalf("a commit between the named commit and the message: lost %d, want the checkpoint refuted", o.lost)
	}
}

// TestNewestCountsATransactionSentInPart: a large transaction cut off
// mid-way (the primary failed while the walsender sent it) has rows in
// Kafka whose commit never came. They lie where the WAL of their commit
// does: what a failover's fork or a restored server's WAL end is compared
// with must reach them, and still after the connection is lost, which
// forgets the transaction but not its records.
func TestNewestCountsATransactionSentInPart(t *testing.T) {
	p, _, _ := newTestPipeline(t, Fail, 100)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	for i, msg := range [][]byte{beginMsg(9000), row("1", "payment"), row("2", "payment")} {
		if err := walAt(t, p, uint64(5000+100*i), msg); err != nil {
			t.Fatal(err)
		}
	}
	if p.Newest() != 5200 {
		t.Fatalf("Newest %s, HandedOn %s with rows up to 0/1450 produced, want 0/1450", p.Newest(), p.HandedOn())
	}
	p.Lost()
	if p.Newest() != 5200 {
		t.Fatalf("Newest %s after the connection was lost, want 0/1450: the records are in Kafka", p.Newest())
	}
	// In exactly-once delivery the open transaction's records are in no
	// Kafka transaction: they count once committed.
	eo, _, _ := newExactlyOnce(t, 0, 100)
	if err := feed(t, eo, relationMsg()); err != nil {
		t.Fatal(err)
	}
	for i, msg := range [][]byte{beginMsg(9000), row("1", "payment")} {
		if err := walAt(t, eo, uint64(5000+100*i), msg); err != nil {
			t.Fatal(err)
		}
	}
	if eo.Newest() != 100 {
		t.Fatalf("exactly-once Newest %s with an open transaction's records queued, want the start 0/64", eo.Newest())
	}
}

// TestLoneMessagesBeforeTheCheckpointWithTheSlotAtItsCommit: a checkpoint
// written at the second of two lone messages after the commit it names,
// the slot at that commit. The server sends both messages again: the first
// is held like a transaction, and the second verifies the checkpoint; no
// dead letter is written again and no lost history is recorded.
func TestLoneMessagesBeforeTheCheckpointWithTheSlotAtItsCommit(t *testing.T) {
	m := mark(700, 50)
	m.Named, m.CommitTime = 500, mark(500, 50).CommitTime

	p, ck, s := newExactlyOnceMessages(t)
	o := observe(p)
	ck.Idle(500)
	p.Verify(m)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	for _, at := range []uint64{650, 700} {
		if err := walAt(t, p, at, lone(at, "m")); err != nil {
			t.Fatal(err)
		}
	}
	feedTx(t, p, vtx(800, 80, "2"))
	if ids := queuedIDs(s); len(ids) != 1 || ids[0] != "2" || o.lost != 0 {
		t.Fatalf("queued %v, lost %d; want only 2 (both dead letters are in Kafka already), nothing lost", ids, o.lost)
	}
}
