package pipeline

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// pgoutput v1 messages, built byte by byte.

func be32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func be64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

var outboxColumns = []struct {
	name string
	oid  uint32
}{{"id", 20}, {"aggregate_type", 25}, {"aggregate_id", 25}, {"event_type", 25}, {"payload", 3802}, {"headers", 3802}, {"created_at", 1184}}

func relationMsg() []byte {
	b := be32([]byte{'R'}, 1)
	b = append(b, "public\x00outbox\x00"...)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(outboxColumns)))
	for _, c := range outboxColumns {
		b = append(b, 0)
		b = append(b, c.name+"\x00"...)
		b = be32(b, c.oid)
		b = be32(b, 0xffffffff)
	}
	return b
}

func beginMsg(final uint64) []byte { return be32(be64(be64([]byte{'B'}, final), 0), 7) }

func commitMsg(end uint64) []byte { return be64(be64(be64([]byte{'C', 0}, end-8), end), 0) }

// insertMsg: values in outboxColumns order; "\x00" means NULL.
func insertMsg(values ...string) []byte {
	b := be32([]byte{'I'}, 1)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(values)))
	for _, v := range values {
		if v == "\x00" {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = be32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func row(id, aggType string) []byte {
	return insertMsg(id, aggType, "agg-"+id, "Created", `{"n": `+id+`}`, "\x00", "2026-12-01 00:00:00+00")
}

// fakeSink keeps produced records; the test acks them.
type fakeSink struct{ records []*kgo.Record }

func (f *fakeSink) Produce(r *kgo.Record) { f.records = append(f.records, r) }

func newTestPipeline(t *testing.T, policy string, maxInflight int) (*Pipeline, *checkpoint.Tracker, *fakeSink) {
	t.Helper()
	ck := checkpoint.New(100)
	p, err := New(Config{
		Mapping:    mapping.DefaultConfig(),
		OnBadEvent: policy, DeadLetterTopic: "dlq",
		MaxInflightEvents: maxInflight, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeSink{}
	p.SetSink(s)
	return p, ck, s
}

func feed(t *testing.T, p *Pipeline, msgs ...[]byte) error {
	t.Helper()
	for i, m := range msgs {
		if err := p.WAL(pglogrepl.LSN(1000+i), m); err != nil {
			return err
		}
	}
	return nil
}

func TestConfirmsOnlyAfterEveryAck(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || p.InFlight() != 2 {
		t.Fatalf("produced %d, in flight %d", len(s.records), p.InFlight())
	}
	p.Ack(s.records[1], nil)
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s with one record unacknowledged", ck.Confirmed())
	}
	p.Ack(s.records[0], nil)
	if ck.Confirmed() != 600 || p.InFlight() != 0 || p.InFlightBytes() != 0 {
		t.Fatalf("confirmed %s in flight %d/%d, want 0/600 and nothing in flight", ck.Confirmed(), p.InFlight(), p.InFlightBytes())
	}
}

func TestFailPolicyStopsBeforeTheBadEvent(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "bad topic!"))
	if err == nil || !strings.Contains(err.Error(), "bad event 2 at LSN 0/3EB") {
		t.Fatalf("err = %v, want it to name event 2 and its LSN", err)
	}
	p.Ack(s.records[0], nil)
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s past the bad event's transaction", ck.Confirmed())
	}
}

func TestDeadLetterIsPartOfItsTransaction(t *testing.T) {
	p, ck, s := newTestPipeline(t, DeadLetter, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "bad topic!"), row("2", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || s.records[0].Topic != "dlq" || eventID(s.records[0]) != "1" {
		t.Fatalf("records: %v", s.records)
	}
	if !strings.Contains(string(s.records[0].Value), `"aggregate_type":"bad topic!"`) {
		t.Fatalf("dead-letter value %s lacks the raw row", s.records[0].Value)
	}
	p.Ack(s.records[1], nil)
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed before the dead-letter record was acknowledged")
	}
	p.Ack(s.records[0], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", ck.Confirmed())
	}
}

func TestBackpressure(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 2)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment")); err != nil {
		t.Fatal(err)
	}
	if p.Full() {
		t.Fatal("full with 1 of 2 in flight")
	}
	if err := p.WAL(2000, row("2", "payment")); err != nil {
		t.Fatal(err)
	}
	if !p.Full() {
		t.Fatal("not full with 2 of 2 in flight")
	}
	p.Ack(s.records[0], nil)
	select {
	case <-p.Room():
	case <-time.After(time.Second):
		t.Fatal("no room signalled after an ack")
	}
	if p.Full() {
		t.Fatal("still full after an ack")
	}
}

func TestLostDiscardsTheOpenTransaction(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment")); err != nil {
		t.Fatal(err)
	}
	p.Lost()
	// The server sends the transaction again, whole.
	if err := feed(t, p, beginMsg(500), row("1", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.Ack(s.records[1], nil)
	p.Ack(s.records[0], nil) // the first copy's ack is ignored by the checkpoint
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", ck.Confirmed())
	}
}

func TestBrokerRefusalFailsWithTheEvent(t *testing.T) {
	p, ck, s := newTestPipeline(t, DeadLetter, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("7", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.Ack(s.records[0], kerr.MessageTooLarge)
	select {
	case err := <-p.Failed():
		if !strings.Contains(err.Error(), "event 7 at LSN") || !errors.Is(err, kerr.MessageTooLarge) || !strings.Contains(err.Error(), "--max-record-bytes") {
			t.Fatalf("err = %v", err)
		}
	default:
		t.Fatal("no failure reported")
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed past a refused record")
	}
}
