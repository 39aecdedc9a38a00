package pipeline

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// fakeTx is a Transactional that keeps what it is told.
type fakeTx struct {
	fakeSink
	promises   []func(*kgo.Record, error)
	boundaries []pglogrepl.LSN
	boundary   int // records before the last boundary
	discarded  int
}

func (f *fakeTx) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	f.fakeSink.Produce(r, promise)
	f.promises = append(f.promises, promise)
}

func (f *fakeTx) Boundary(end pglogrepl.LSN, _ uint32, _ time.Time) {
	f.boundaries = append(f.boundaries, end)
	f.boundary = len(f.records)
}

func (f *fakeTx) Discard() []*kgo.Record {
	out := f.records[f.boundary:]
	f.records, f.promises = f.records[:f.boundary], f.promises[:f.boundary]
	f.discarded += len(out)
	return out
}

// commit answers every record up to the last boundary, as a committed
// Kafka transaction does.
func (f *fakeTx) commit() {
	for i := range f.boundary {
		f.promises[i](f.records[i], nil)
	}
	f.records, f.promises, f.boundary = f.records[f.boundary:], f.promises[f.boundary:], 0
}

func newExactlyOnce(t *testing.T, skipThrough pglogrepl.LSN, maxInflight int) (*Pipeline, *checkpoint.Tracker, *fakeTx) {
	t.Helper()
	ck := checkpoint.New(100)
	s := &fakeTx{fakeSink: fakeSink{t: t}}
	p, err := New(Config{
		Mapping:    mapping.DefaultConfig(),
		OnBadEvent: DeadLetter, DeadLetterTopic: "dlq",
		MaxInflightEvents: maxInflight, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p.SkipThrough(skipThrough)
	return p, ck, s
}

// tx is the messages of one transaction ending at end (its commit record
// starts 8 bytes before) with rows of the given ids.
func tx(end uint64, ids ...string) [][]byte {
	msgs := [][]byte{beginMsg(end - 8)}
	for _, id := range ids {
		msgs = append(msgs, row(id, "payment"))
	}
	return append(msgs, commitMsg(end))
}

func feedTx(t *testing.T, p *Pipeline, txs ...[][]byte) {
	t.Helper()
	for _, msgs := range txs {
		if err := feed(t, p, msgs...); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExactlyOnceSkipsWhatKafkaHolds: transactions that ended at or before
// the Kafka checkpoint are not produced again, and still confirmed; the
// first one after it is.
func TestExactlyOnceSkipsWhatKafkaHolds(t *testing.T) {
	p, ck, s := newExactlyOnce(t, 600, 100)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, tx(500, "1", "2"), tx(600, "3"))
	if len(s.records) != 0 || len(s.boundaries) != 0 {
		t.Fatalf("produced %d records and %d boundaries for transactions Kafka holds", len(s.records), len(s.boundaries))
	}
	if ck.Confirmed() != 600 || p.SkippedTransactions() != 2 {
		t.Fatalf("confirmed %s, skipped %d; want 0/258 and 2", ck.Confirmed(), p.SkippedTransactions())
	}
	feedTx(t, p, tx(700, "4"))
	if len(s.records) != 1 || eventID(s.records[0]) != "4" || len(s.boundaries) != 1 || s.boundaries[0] != 700 {
		t.Fatalf("after the checkpoint: records %d, boundaries %v", len(s.records), s.boundaries)
	}
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s before the Kafka transaction committed", ck.Confirmed())
	}
	s.commit()
	if ck.Confirmed() != 700 || p.InFlight() != 0 {
		t.Fatalf("after the commit: confirmed %s, in flight %d", ck.Confirmed(), p.InFlight())
	}
}

// TestExactlyOnceLostDropsTheOpenTransaction: a lost connection drops the
// open transaction's records from the producer (the server sends it again
// whole, and it is produced again); a committed transaction the server
// sends again after the reconnect is skipped, though its Kafka transaction
// has not committed yet.
func TestExactlyOnceLostDropsTheOpenTransaction(t *testing.T) {
	p, ck, s := newExactlyOnce(t, 0, 100)
	if err := feed(t, p, relationMsg()); err != nil {
		t.Fatal(err)
	}
	feedTx(t, p, tx(500, "1"))
	open := tx(600, "2", "3")
	if err := feed(t, p, open[:3]...); err != nil { // Begin and both rows, no Commit
		t.Fatal(err)
	}
	p.Lost()
	if s.discarded != 2 || p.InFlight() != 1 || len(s.records) != 1 {
		t.Fatalf("after Lost: %d discarded, %d in flight, %d queued; want 2, 1, 1", s.discarded, p.InFlight(), len(s.records))
	}
	// The server resends from the confirmed position: both transactions.
	feedTx(t, p, tx(500, "1"), open)
	var ids []string
	for _, r := range s.records {
		ids = append(ids, eventID(r))
	}
	if len(ids) != 3 || ids[0] != "1" || ids[1] != "2" || ids[2] != "3" {
		t.Fatalf("queued %v, want [1 2 3]", ids)
	}
	s.commit()
	if ck.Confirmed() != 600 || p.InFlight() != 0 || p.InFlightBytes() != 0 {
		t.Fatalf("confirmed %s, in flight %d (%d bytes)", ck.Confirmed(), p.InFlight(), p.InFlightBytes())
	}
}

// TestExactlyOnceFullCountsWholeTransactions: the open transaction's
// records wait for its commit, so they neither pause reading nor count as
// in flight (a drain would wait for them); once committed they count.
func TestExactlyOnceFullCountsWholeTransactions(t *testing.T) {
	p, _, s := newExactlyOnce(t, 0, 2)
	msgs := tx(500, "1", "2", "3", "4")
	if err := feed(t, p, append([][]byte{relationMsg()}, msgs[:5]...)...); err != nil {
		t.Fatal(err)
	}
	if p.Full() {
		t.Fatal("Full while the only records belong to the open transaction: its commit could never come")
	}
	if p.InFlight() != 0 || p.InFlightBytes() != 0 {
		t.Fatalf("in flight %d (%d bytes) before the commit: a drain would wait for acknowledgements that cannot come", p.InFlight(), p.InFlightBytes())
	}
	if err := feed(t, p, msgs[5]); err != nil {
		t.Fatal(err)
	}
	if !p.Full() {
		t.Fatal("not Full with 4 committed records waiting and a limit of 2")
	}
	s.commit()
	if p.Full() {
		t.Fatal("Full after the Kafka transaction committed")
	}
}

// TestExactlyOnceDeadLetterInTheSameTransaction: a bad row's dead-letter
// record is produced before its transaction's boundary, so it commits in
// the same Kafka transaction as the transaction's other records.
func TestExactlyOnceDeadLetterInTheSameTransaction(t *testing.T) {
	p, _, s := newExactlyOnce(t, 0, 100)
	bad := insertMsg("9", "payment", "\x00", "Created", `{}`, "\x00", "\x00") // no aggregate id
	if err := feed(t, p, relationMsg(), beginMsg(492), row("1", "payment"), bad, commitMsg(500)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || s.records[1].Topic != "dlq" || len(s.boundaries) != 1 || s.boundary != 2 {
		t.Fatalf("records %d (second to %q), boundary after %d", len(s.records), s.records[len(s.records)-1].Topic, s.boundary)
	}
}
