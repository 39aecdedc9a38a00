package pipeline

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// logicalMsg is a pgoutput v1 logical decoding Message.
func logicalMsg(transactional bool, lsn uint64, prefix, content string) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	b := be64([]byte{'M', flags}, lsn)
	b = append(b, prefix+"\x00"...)
	b = be32(b, uint32(len(content)))
	return append(b, content...)
}

func envelope(id, aggType string) string {
	return `{"v":1,"id":"` + id + `","aggregate_type":"` + aggType + `","aggregate_id":"agg-` + id + `","event_type":"Created","payload":{"n": 1}}`
}

func newMessagePipeline(t *testing.T, policy string) (*Pipeline, *checkpoint.Tracker, *fakeSink) {
	t.Helper()
	ck := checkpoint.New(100)
	s := &fakeSink{t: t}
	p, err := New(Config{
		Mapping:    mapping.DefaultConfig(),
		OnBadEvent: policy, DeadLetterTopic: "dlq", MessagePrefix: "cdc_outbox",
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return p, ck, s
}

// TestMessagesKeepTheirPlace: rows and messages of one transaction become
// records in their order, in its checkpoint transaction; messages of
// another prefix are passed over and counted.
func TestMessagesKeepTheirPlace(t *testing.T) {
	p, ck, s := newMessagePipeline(t, Fail)
	o := observe(p)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), logicalMsg(true, 550, "cdc_outbox", envelope("m2", "payment")),
		logicalMsg(true, 551, "other", "anything"), row("3", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range s.records {
		ids = append(ids, eventID(r))
	}
	if strings.Join(ids, " ") != "1 m2 3" || s.records[1].Topic != "outbox.event.payment" || string(s.records[1].Key) != "agg-m2" {
		t.Fatalf("records %v (ids %v)", s.records, ids)
	}
	for i, r := range s.records {
		if i < 2 {
			p.ack(r, nil)
		}
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed with a record of the transaction unacknowledged")
	}
	p.ack(s.records[2], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", ck.Confirmed())
	}
	if o.kinds[KindMessage] != 1 || o.kinds[KindRow] != 2 || p.Skipped().OtherPrefix != 1 {
		t.Errorf("kinds %v, other prefixes %d", o.kinds, p.Skipped().OtherPrefix)
	}
}

// TestNonTransactionalMessage: never published as an event. Under fail
// the stream stops naming it and confirms nothing; under dead-letter its
// content goes to the dead-letter topic in a transaction of its own, ending
// at the message's LSN, confirmed once the broker has it.
func TestNonTransactionalMessage(t *testing.T) {
	lone := logicalMsg(false, 700, "cdc_outbox", envelope("m1", "payment"))

	p, ck, s := newMessagePipeline(t, Fail)
	err := feed(t, p, relationMsg(), lone)
	var nt *NonTransactionalError
	var be *BadEventError
	if !errors.As(err, &nt) || !errors.As(err, &be) || be.EventID != "m1" || be.LSN != 1001 || !be.Message || len(s.records) != 0 {
		t.Fatalf("err = %v, records %d", err, len(s.records))
	}
	if !strings.Contains(err.Error(), "pg_logical_emit_message(true, ...)") {
		t.Errorf("err = %v, want the fix", err)
	}
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s", ck.Confirmed())
	}

	p, ck, s = newMessagePipeline(t, DeadLetter)
	o := observe(p)
	// The message says where its record ends (700); the XLogData's start
	// is not above it, and the higher of the two is confirmed.
	if err := p.WAL(pglogrepl.LSN(650), lone); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 1 || s.records[0].Topic != "dlq" || string(s.records[0].Value) != envelope("m1", "payment") ||
		header(s.records[0], HeaderMessagePrefix) != "cdc_outbox" || header(s.records[0], "source_table") != "" ||
		!strings.Contains(header(s.records[0], "error"), "non-transactional") {
		t.Fatalf("dead-letter record %+v", s.records)
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed before the dead-letter record was acknowledged")
	}
	p.ack(s.records[0], nil)
	if ck.Confirmed() != 700 || o.bad["dead_lettered"] != 1 || o.kinds[KindMessage] != 2 {
		t.Fatalf("confirmed %s, observed %v %v", ck.Confirmed(), o.bad, o.kinds)
	}
	// A transaction after it goes on as usual.
	if err := feed(t, p, relationMsg(), beginMsg(800), row("2", "payment"), commitMsg(900)); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedMessage: content that is no envelope is a bad event under
// both policies, its content set aside as it came.
func TestMalformedMessage(t *testing.T) {
	bad := logicalMsg(true, 550, "cdc_outbox", `{"v":1,"id":"m9","payload":{}}`)
	p, ck, _ := newMessagePipeline(t, Fail)
	err := feed(t, p, relationMsg(), beginMsg(500), bad)
	if err == nil || !strings.Contains(err.Error(), `bad event m9 at LSN 0/3EA: message member "aggregate_type" is missing`) {
		t.Fatalf("err = %v", err)
	}
	if ck.Confirmed() != 100 {
		t.Fatal("confirmed past the bad event")
	}

	p, ck, s := newMessagePipeline(t, DeadLetter)
	if err := feed(t, p, relationMsg(), beginMsg(500), bad, row("2", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || s.records[0].Topic != "dlq" || string(s.records[0].Value) != `{"v":1,"id":"m9","payload":{}}` || eventID(s.records[0]) != "m9" {
		t.Fatalf("records %+v", s.records)
	}
	p.ack(s.records[0], nil)
	p.ack(s.records[1], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s", ck.Confirmed())
	}
}

// TestResentTransactionWithMessages: messages are changes of their
// transaction like rows. The connection breaks inside a transaction of
// rows and messages with the first three acknowledged; sent again, it is
// published again from the fourth, message or row. A non-transactional
// message set aside before it leaves nothing behind to remember.
func TestResentTransactionWithMessages(t *testing.T) {
	p, ck, s := newMessagePipeline(t, DeadLetter)
	a := newAcker(t, p, s)
	sendTx(t, p, s, change{900, relationMsg()})
	if got := sendTx(t, p, s, change{5_000, logicalMsg(false, 5_000, "cdc_outbox", envelope("lone", "payment"))}); !same(got, []string{"lone"}) {
		t.Fatalf("the non-transactional message produced %v", got)
	}
	a.latest("lone")
	body := []change{
		{10_000, row("1", "payment")},
		{10_100, logicalMsg(true, 10_150, "cdc_outbox", envelope("m2", "payment"))},
		{10_200, row("3", "payment")},
		{10_300, logicalMsg(true, 10_350, "cdc_outbox", envelope("m4", "payment"))},
		{10_400, row("5", "payment")},
	}
	if got := sendTx(t, p, s, txOf(90_000, 7, body[:4], 0)...); !same(got, []string{"1", "m2", "3", "m4"}) {
		t.Fatalf("first sending produced %v", got)
	}
	a.latest("1", "m2", "3")
	p.Lost()
	if again := p.d.(*atLeastOnce).resend.again; len(again) != 1 {
		t.Fatalf("%d transactions to be sent again, want the open one", len(again))
	}
	if got := sendTx(t, p, s, txOf(90_000, 7, body, 90_100)...); !same(got, []string{"m4", "5"}) {
		t.Fatalf("sent again, it produced %v, want [m4 5]", got)
	}
	a.earliest("m4") // the first sending's, acknowledged late
	a.latest("m4", "5")
	if ck.Confirmed() != 90_100 || p.InFlight() != 0 {
		t.Fatalf("confirmed %s, %d in flight", ck.Confirmed(), p.InFlight())
	}
}
