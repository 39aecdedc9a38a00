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

// fakeSink keeps produced records; the test answers them through the
// pipeline's promise.
type fakeSink struct {
	t       *testing.T
	records []*kgo.Record
}

func (f *fakeSink) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	if promise == nil {
		f.t.Fatal("a record was produced without a promise")
	}
	f.records = append(f.records, r)
}

func newTestPipeline(t *testing.T, policy string, maxInflight int) (*Pipeline, *checkpoint.Tracker, *fakeSink) {
	t.Helper()
	ck := checkpoint.New(100)
	s := &fakeSink{t: t}
	p, err := New(Config{
		Mapping:    mapping.DefaultConfig(),
		OnBadEvent: policy, DeadLetterTopic: "dlq",
		MaxInflightEvents: maxInflight, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
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
	p.ack(s.records[1], nil)
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s with one record unacknowledged", ck.Confirmed())
	}
	p.ack(s.records[0], nil)
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
	p.ack(s.records[0], nil)
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
	p.ack(s.records[1], nil)
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed before the dead-letter record was acknowledged")
	}
	p.ack(s.records[0], nil)
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
	p.ack(s.records[0], nil)
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
	p.ack(s.records[1], nil)
	p.ack(s.records[0], nil) // the first copy's ack is ignored by the checkpoint
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", ck.Confirmed())
	}
}

// countingObserver counts what the pipeline reports.
type countingObserver struct {
	acked, replaced, lost int
	bad                   map[string]int // by action
	kinds                 map[string]int // acked and bad, by kind
}

func (o *countingObserver) Acked(_, kind string, _ int64) { o.acked++; o.kinds[kind]++ }
func (o *countingObserver) Received(int64)                {}
func (o *countingObserver) Bad(action, kind string)       { o.bad[action]++; o.kinds[kind]++ }
func (o *countingObserver) TimestampReplaced()            { o.replaced++ }
func (o *countingObserver) LostHistory()                  { o.lost++ }

func observe(p *Pipeline) *countingObserver {
	o := &countingObserver{bad: map[string]int{}, kinds: map[string]int{}}
	p.obs = o
	return o
}

func failure(p *Pipeline) error {
	select {
	case err := <-p.Failed():
		return err
	default:
		return nil
	}
}

// refuseBatch fails records the way franz-go fails a partition whose
// batch the broker refused: every buffered record, in order, same error.
func refuseBatch(p *Pipeline, err error, recs ...*kgo.Record) {
	for _, r := range recs {
		p.ack(r, err)
	}
}

// TestBrokerRefusalFindsTheRecordUnderFail: the broker refuses a batch of
// three records of which one is too large. Each is sent again alone, in
// order, after everything else settled; the neighbour before it goes
// through, and the stream stops naming the one refused alone.
func TestBrokerRefusalFindsTheRecordUnderFail(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	o := observe(p)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("6", "payment"), row("7", "payment"), row("8", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	refuseBatch(p, kerr.MessageTooLarge, s.records...)
	if failure(p) != nil || !p.Full() {
		t.Fatal("a refused batch must pause reading and stop nothing yet")
	}
	if len(s.records) != 4 || eventID(s.records[3]) != "6" {
		t.Fatalf("want event 6 sent again alone, got %d records", len(s.records))
	}
	if !p.Full() || len(s.records) != 4 {
		t.Fatal("sent the next record before the broker answered for the one sent alone")
	}
	p.ack(s.records[3], nil)
	if !p.Full() || len(s.records) != 5 || eventID(s.records[4]) != "7" {
		t.Fatalf("want event 7 sent alone next, got %d records", len(s.records))
	}
	p.ack(s.records[4], kerr.MessageTooLarge)
	err := failure(p)
	var be *BadEventError
	var refused *RefusedError
	if !errors.As(err, &be) || be.EventID != "7" || be.LSN == 0 || !errors.As(err, &refused) || refused.Topic != "outbox.event.payment" ||
		!errors.Is(err, kerr.MessageTooLarge) || !strings.Contains(err.Error(), "bad event 7 at LSN") {
		t.Fatalf("err = %v, want it to name event 7, its LSN, the topic and the refusal", err)
	}
	if o.bad["failed"] != 1 || ck.Confirmed() != 100 {
		t.Fatalf("bad %v, confirmed %s: want one failed and nothing confirmed", o.bad, ck.Confirmed())
	}
}

// TestBrokerRefusalDeadLettersAndKeepsOrder: under dead-letter the record
// refused alone is replaced by its dead-letter record, its neighbours are
// sent again in their order, and the transaction is confirmed once all of
// it is acknowledged.
func TestBrokerRefusalDeadLettersAndKeepsOrder(t *testing.T) {
	p, ck, s := newTestPipeline(t, DeadLetter, 100)
	o := observe(p)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("6", "payment"), row("7", "payment"), row("8", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.ack(s.records[0], nil)
	refuseBatch(p, kerr.InvalidTimestamp, s.records[1], s.records[2])
	p.Full()
	p.ack(s.records[3], kerr.InvalidTimestamp) // event 7, alone
	if o.bad["dead_lettered"] != 0 {
		t.Fatal("counted as dead-lettered before the broker had the dead-letter record")
	}
	p.Full()
	dl := s.records[4]
	if dl.Topic != "dlq" || eventID(dl) != "7" || !strings.Contains(header(dl, "error"), "INVALID_TIMESTAMP") || !strings.Contains(string(dl.Value), `"topic":"outbox.event.payment"`) {
		t.Fatalf("dead-letter record: topic %q id %q error %q value %s", dl.Topic, eventID(dl), header(dl, "error"), dl.Value)
	}
	p.ack(dl, nil)
	if o.bad["dead_lettered"] != 1 {
		t.Fatalf("bad events %v, want one dead-lettered", o.bad)
	}
	p.Full()
	if len(s.records) != 6 || eventID(s.records[5]) != "8" {
		t.Fatalf("want event 8 sent again after the dead letter, got %d records", len(s.records))
	}
	p.ack(s.records[5], nil)
	if p.Full() || failure(p) != nil {
		t.Fatal("still paused, or failed, once every refused record is settled")
	}
	if ck.Confirmed() != 600 || p.InFlight() != 0 || p.InFlightBytes() != 0 {
		t.Fatalf("confirmed %s in flight %d/%d", ck.Confirmed(), p.InFlight(), p.InFlightBytes())
	}
}

// TestRefusalWaitsForEverythingInFlight: records of other partitions still
// unanswered when a batch is refused may be refused too; nothing is sent
// again before they settle.
func TestRefusalWaitsForEverythingInFlight(t *testing.T) {
	p, _, s := newTestPipeline(t, DeadLetter, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "order"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.ack(s.records[0], kerr.MessageTooLarge)
	p.Full()
	if len(s.records) != 2 {
		t.Fatal("sent a refused record again while another was in flight")
	}
	p.ack(s.records[1], nil)
	p.Full()
	if len(s.records) != 3 || eventID(s.records[2]) != "1" {
		t.Fatalf("want event 1 sent again once the rest settled, got %d records", len(s.records))
	}
}

// TestClusterRefusalStops: a refusal that concerns the cluster stops at
// once, naming the event.
func TestClusterRefusalStops(t *testing.T) {
	p, ck, s := newTestPipeline(t, DeadLetter, 100)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("7", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.ack(s.records[0], kerr.TopicAuthorizationFailed)
	err := failure(p)
	var pe *ProduceError
	if !errors.As(err, &pe) || pe.EventID != "7" || pe.Err.Topic != "outbox.event.payment" || !errors.Is(err, kerr.TopicAuthorizationFailed) ||
		!strings.Contains(err.Error(), "event 7 at LSN") {
		t.Fatalf("err = %v", err)
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed past a refused record")
	}
}

// TestClosedClientIsNotABadEvent: records failed by closing the producer on
// shutdown are not bad events and stop nothing; they stay unconfirmed.
func TestClosedClientIsNotABadEvent(t *testing.T) {
	p, ck, s := newTestPipeline(t, Fail, 100)
	o := observe(p)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("7", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.ack(s.records[0], kgo.ErrClientClosed)
	if err := failure(p); err != nil || len(o.bad) != 0 {
		t.Fatalf("failure %v, bad events %v: want none", err, o.bad)
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed a record that was never acknowledged")
	}
}

// TestDeadLetterRecordFitsAfterEncoding: JSON escapes control characters
// to six bytes each; the dead-letter record is measured once encoded and
// shrunk until it fits --max-record-bytes. <, > and & are not escaped.
func TestDeadLetterRecordFitsAfterEncoding(t *testing.T) {
	p, _, s := newTestPipeline(t, DeadLetter, 100)
	p.cfg.MaxRecordBytes = 400_000
	// 200,000 bytes, 450,000 once encoded by JSON (1,200,000 if <, > and &
	// were escaped too).
	big := strings.Repeat("\x01<>&", 50_000)
	row := insertMsg("9", "bad topic!", "agg", "E", big, "\x00", "\x00")
	if err := feed(t, p, relationMsg(), beginMsg(500), row, commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	dl := s.records[0]
	if size := RecordSize(dl); size > int64(p.cfg.MaxRecordBytes) {
		t.Fatalf("dead-letter record is %d bytes, over %d", size, p.cfg.MaxRecordBytes)
	}
	if !strings.Contains(string(dl.Value), `"omitted_bytes"`) || !strings.Contains(string(dl.Value), `"aggregate_type":"bad topic!"`) {
		t.Fatalf("dead-letter value %.200s: want the payload omitted and the small columns kept", dl.Value)
	}
	small := insertMsg("10", "bad topic!", "agg", "E", `"<a & b>"`, "\x00", "\x00")
	if err := feed(t, p, beginMsg(700), small, commitMsg(800)); err != nil {
		t.Fatal(err)
	}
	if v := string(s.records[1].Value); !strings.Contains(v, `"payload":"\"<a & b>\""`) {
		t.Fatalf("dead-letter value %s: want <, > and & as they are", v)
	}
}

// TestTimestampTooFarAheadIsReplaced: a created_at more than
// MaxTimestampAhead ahead is replaced by the produce time (a zero
// timestamp, which franz-go fills), counted, and the event published.
func TestTimestampTooFarAheadIsReplaced(t *testing.T) {
	p, _, s := newTestPipeline(t, Fail, 100)
	o := observe(p)
	ahead := time.Now().Add(2 * time.Hour).UTC().Format("2006-01-02 15:04:05+00")
	near := time.Now().Add(30 * time.Minute).UTC().Format("2006-01-02 15:04:05+00")
	if err := feed(t, p, relationMsg(), beginMsg(500),
		insertMsg("1", "payment", "a", "E", `{}`, "\x00", ahead),
		insertMsg("2", "payment", "a", "E", `{}`, "\x00", near), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if !s.records[0].Timestamp.IsZero() || s.records[1].Timestamp.IsZero() || o.replaced != 1 {
		t.Fatalf("timestamps %v and %v, replaced %d: want the first replaced, the second kept", s.records[0].Timestamp, s.records[1].Timestamp, o.replaced)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestOvertakingIsReported: a later event of an aggregate that reaches the
// broker while an earlier one waits to be sent again (the window inside the
// Kafka client) is reported as an order violation, naming both events.
func TestOvertakingIsReported(t *testing.T) {
	p, _, s := newTestPipeline(t, DeadLetter, 100)
	var log strings.Builder
	p.log = slog.New(slog.NewTextHandler(&log, nil))
	same := func(id string) []byte {
		return insertMsg(id, "payment", "agg", "E", `{}`, "\x00", "\x00")
	}
	if err := feed(t, p, relationMsg(), beginMsg(500), same("1"), same("2"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	p.ack(s.records[0], kerr.MessageTooLarge)
	p.ack(s.records[1], nil) // produced after 1, landed before it is resolved
	if got := log.String(); !strings.Contains(got, "per-aggregate order not kept") || !strings.Contains(got, "event_id=2") || !strings.Contains(got, "earlier_event_id=1") {
		t.Fatalf("no order violation reported:\n%s", got)
	}
}
