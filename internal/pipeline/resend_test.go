package pipeline

import (
	"fmt"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

func beginXid(final uint64, xid uint32) []byte { return beginAt(final, 0, xid) }

// beginAt is a Begin message with a commit time (microseconds since 2000).
func beginAt(final, micros uint64, xid uint32) []byte {
	return be32(be64(be64([]byte{'B'}, final), micros), xid)
}

// change is one message of a transaction as the server sends it: at lsn.
type change struct {
	lsn uint64
	msg []byte
}

// sendTx hands the pipeline a transaction's messages at their LSNs and
// returns the ids of the records it produced.
func sendTx(t *testing.T, p *Pipeline, s *fakeSink, changes ...change) []string {
	t.Helper()
	before := len(s.records)
	for _, c := range changes {
		if err := p.WAL(pglogrepl.LSN(c.lsn), c.msg); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for _, r := range s.records[before:] {
		ids = append(ids, eventID(r))
	}
	return ids
}

// rows are the inserts of ids, one LSN each from lsn on, or all at lsn
// (a multi-row INSERT) when shared.
func rows(lsn uint64, shared bool, ids ...int) []change {
	var out []change
	for i, id := range ids {
		at := lsn
		if !shared {
			at += uint64(i) * 100
		}
		out = append(out, change{at, row(fmt.Sprint(id), "payment")})
	}
	return out
}

func txOf(final, xid uint32, body []change, commit uint64) []change {
	out := []change{{uint64(final) - 50, beginXid(uint64(final), xid)}}
	out = append(out, body...)
	if commit != 0 {
		out = append(out, change{uint64(final), commitMsg(commit)})
	}
	return out
}

// acker answers records for the broker, each once.
type acker struct {
	t     *testing.T
	p     *Pipeline
	s     *fakeSink
	acked map[*kgo.Record]bool
}

func newAcker(t *testing.T, p *Pipeline, s *fakeSink) *acker {
	return &acker{t: t, p: p, s: s, acked: map[*kgo.Record]bool{}}
}

// latest acknowledges the last record produced of each event.
func (a *acker) latest(ids ...string) {
	a.t.Helper()
	for _, id := range ids {
		a.ack(id, len(a.s.records)-1, -1)
	}
}

// earliest acknowledges the first record produced of each event: one of
// a sending before the connection broke.
func (a *acker) earliest(ids ...string) {
	a.t.Helper()
	for _, id := range ids {
		a.ack(id, 0, 1)
	}
}

func (a *acker) ack(id string, from, step int) {
	a.t.Helper()
	for i := from; i >= 0 && i < len(a.s.records); i += step {
		if r := a.s.records[i]; eventID(r) == id {
			if a.acked[r] {
				a.t.Fatalf("the record of event %s was acknowledged already", id)
			}
			a.acked[r] = true
			a.p.ack(r, nil)
			return
		}
	}
	a.t.Fatalf("no record of event %s", id)
}

func same(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// TestResentTransactionRepeatsOnlyWhatWasInFlight: the connection breaks
// inside a transaction of five rows, three of them acknowledged: sent
// again whole, it is published again from the fourth, and confirmed once
// those are acknowledged.
func TestResentTransactionRepeatsOnlyWhatWasInFlight(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("one LSN for all rows: %v", shared), func(t *testing.T) {
			p, ck, s := newTestPipeline(t, Fail, 100)
			a := newAcker(t, p, s)
			sendTx(t, p, s, change{900, relationMsg()})
			body := rows(10_000, shared, 1, 2, 3, 4, 5)
			if got := sendTx(t, p, s, txOf(90_000, 7, body[:4], 0)...); !same(got, []string{"1", "2", "3", "4"}) {
				t.Fatalf("first sending produced %v", got)
			}
			a.latest("1", "2", "3")
			p.Lost()
			got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...)
			if !same(got, []string{"4", "5"}) {
				t.Fatalf("sent again, it produced %v, want [4 5]", got)
			}
			a.earliest("4") // the first sending's, acknowledged late: ignored by the checkpoint
			if ck.Confirmed() != 100 {
				t.Fatalf("confirmed %s before the second sending's records were acknowledged", ck.Confirmed())
			}
			a.latest("4", "5")
			if ck.Confirmed() != 90_100 || p.InFlight() != 0 {
				t.Fatalf("confirmed %s, %d in flight; want 0/15FF4, 0", ck.Confirmed(), p.InFlight())
			}
		})
	}
}

// TestResentTransactionAcksOutOfOrder: an acknowledgement after a record
// still in flight does not extend the prefix until that record's comes;
// one that comes after the connection broke, before the transaction
// arrives again, still counts.
func TestResentTransactionAcksOutOfOrder(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	body := rows(10_000, false, 1, 2, 3, 4)
	sendTx(t, p, s, txOf(90_000, 7, body, 0)...)
	a.latest("1", "3")
	p.Lost()
	a.earliest("2") // in flight when the connection broke
	if got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...); !same(got, []string{"4"}) {
		t.Fatalf("sent again, it produced %v, want [4]", got)
	}
	a.latest("4")
	if ck.Confirmed() != 90_100 {
		t.Fatalf("confirmed %s", ck.Confirmed())
	}
}

// TestResentTransactionSkipsWhatWasAckedAheadOfAGap: an acknowledgement
// after a record still unanswered (another partition's broker answered
// first) counts too: sent again, the transaction publishes the unanswered
// changes only, around those.
func TestResentTransactionSkipsWhatWasAckedAheadOfAGap(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	body := rows(10_000, true, 1, 2, 3, 4, 5) // one multi-row INSERT: one LSN
	sendTx(t, p, s, txOf(90_000, 7, body[:4], 0)...)
	a.latest("1", "3")
	p.Lost()
	if got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...); !same(got, []string{"2", "4", "5"}) {
		t.Fatalf("sent again, it produced %v, want [2 4 5]", got)
	}
	a.latest("2", "4")
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s with event 5 unacknowledged", ck.Confirmed())
	}
	p.Lost() // before the commit was confirmed: sent a third time
	if got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...); !same(got, []string{"5"}) {
		t.Fatalf("sent a third time, it produced %v, want [5]", got)
	}
	a.latest("5")
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s: the second sending committed, and its event 5 is unanswered", ck.Confirmed())
	}
	a.earliest("5")
	if ck.Confirmed() != 90_100 {
		t.Fatalf("confirmed %s, want 90100", ck.Confirmed())
	}
}

// TestResentTransactionsWaitingAndOpen: a committed transaction still
// waiting for an acknowledgement and the open one after it are both sent
// again; of each only what the broker had not acknowledged is published
// again. A transaction sent again whole with everything acknowledged
// publishes nothing and is confirmed at its commit.
func TestResentTransactionsWaitingAndOpen(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	ta := txOf(20_000, 5, rows(10_000, false, 1, 2, 3), 20_100)
	tb := txOf(40_000, 6, rows(30_000, false, 4, 5), 0)
	sendTx(t, p, s, ta...)
	sendTx(t, p, s, tb...)
	a.latest("1", "2", "4", "5")
	p.Lost()
	if got := sendTx(t, p, s, ta...); !same(got, []string{"3"}) {
		t.Fatalf("the waiting transaction sent again produced %v, want [3]", got)
	}
	if got := sendTx(t, p, s, append(tb, change{40_000, commitMsg(40_100)})...); len(got) != 0 {
		t.Fatalf("the open transaction, all acknowledged, sent again produced %v", got)
	}
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s with event 3 unacknowledged", ck.Confirmed())
	}
	a.latest("3")
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s with the first sending of event 3 still in flight", ck.Confirmed())
	}
	a.earliest("3") // the checkpoint waits for it: that sending was committed
	if ck.Confirmed() != 40_100 {
		t.Fatalf("confirmed %s, want 40100", ck.Confirmed())
	}
}

// TestResentTransactionLostTwice: the connection breaks again while the
// transaction sent again is still inside the prefix acknowledged the first
// time, and again after it was published past it: each time what was
// acknowledged is not published again.
func TestResentTransactionLostTwice(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	body := rows(10_000, false, 1, 2, 3, 4, 5, 6)
	sendTx(t, p, s, txOf(90_000, 7, body[:3], 0)...)
	a.latest("1", "2", "3")
	p.Lost()
	if got := sendTx(t, p, s, txOf(90_000, 7, body[:2], 0)...); len(got) != 0 {
		t.Fatalf("produced %v inside the acknowledged prefix", got)
	}
	p.Lost()
	if got := sendTx(t, p, s, txOf(90_000, 7, body[:5], 0)...); !same(got, []string{"4", "5"}) {
		t.Fatalf("third sending produced %v, want [4 5]", got)
	}
	a.latest("4")
	p.Lost()
	if got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...); !same(got, []string{"5", "6"}) {
		t.Fatalf("fourth sending produced %v, want [5 6]", got)
	}
	a.latest("5", "6")
	if ck.Confirmed() != 90_100 {
		t.Fatalf("confirmed %s", ck.Confirmed())
	}
}

// TestResentOtherTransactionAtTheSameLSN: a transaction with another xid
// at the remembered commit LSN (the server's history changed) is not the
// one remembered: all of it is published.
func TestResentOtherTransactionAtTheSameLSN(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	body := rows(10_000, false, 1, 2)
	sendTx(t, p, s, txOf(90_000, 7, body, 0)...)
	a.latest("1", "2")
	p.Lost()
	if got := sendTx(t, p, s, txOf(90_000, 8, body, 90_100)...); !same(got, []string{"1", "2"}) {
		t.Fatalf("another transaction produced %v, want [1 2]", got)
	}
}

// TestResentSameXidOtherCommitTime: after a promotion the new primary may
// hand out the xid again and commit at the same LSN; the commit time tells
// that transaction from the one remembered.
func TestResentSameXidOtherCommitTime(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 100)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	body := rows(10_000, false, 1, 2)
	sendTx(t, p, s, append([]change{{89_950, beginAt(90_000, 1_000_000, 7)}}, body...)...)
	a.latest("1", "2")
	p.Lost()
	again := append([]change{{89_950, beginAt(90_000, 2_000_000, 7)}}, body...)
	if got := sendTx(t, p, s, append(again, change{90_000, commitMsg(90_100)})...); !same(got, []string{"1", "2"}) {
		t.Fatalf("another transaction with the same xid and commit LSN produced %v, want [1 2]", got)
	}
}
