package pipeline

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// fakeEncoder writes "enc(<payload>)" and remembers what it was given;
// fault, when set, is its answer instead.
type fakeEncoder struct {
	cols  []string
	fault Fault
	seen  []EncodeEvent
}

func (f *fakeEncoder) Columns() []string { return f.cols }

func (f *fakeEncoder) Encode(rec *kgo.Record, ev EncodeEvent) error {
	cp := EncodeEvent{EventType: append([]byte(nil), ev.EventType...)}
	for _, c := range ev.Columns {
		cp.Columns = append(cp.Columns, append([]byte(nil), c...))
	}
	f.seen = append(f.seen, cp)
	if f.fault != 0 {
		return &EncodeError{Fault: f.fault, Err: errors.New("payload does not fit avro schema 7 (subject \"payment-value\", version 2) at $.n: want string")}
	}
	rec.Value = []byte("enc(" + string(rec.Value) + ")")
	return nil
}

func newEncodingPipeline(t *testing.T, policy string, enc Encoder) (*Pipeline, *checkpoint.Tracker, *fakeSink) {
	t.Helper()
	ck := checkpoint.New(100)
	s := &fakeSink{t: t}
	p, err := New(Config{
		Mapping: mapping.DefaultConfig(), Encoders: []Encoder{enc},
		OnBadEvent: policy, DeadLetterTopic: "dlq",
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return p, ck, s
}

// TestEncoderReplacesTheValue: the encoder gets the event type and its
// columns' values (NULL and missing ones nil) and its output is the value.
func TestEncoderReplacesTheValue(t *testing.T) {
	enc := &fakeEncoder{cols: []string{"aggregate_id", "headers", "schema_version"}}
	p, ck, s := newEncodingPipeline(t, Fail, enc)
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 1 || string(s.records[0].Value) != `enc({"n": 1})` {
		t.Fatalf("records %v, want one of value enc({\"n\": 1})", s.records)
	}
	got := enc.seen[0]
	if string(got.EventType) != "Created" || len(got.Columns) != 3 || string(got.Columns[0]) != "agg-1" || got.Columns[1] != nil || got.Columns[2] != nil {
		t.Fatalf("encoder saw type %q columns %q, want Created [agg-1 nil nil]", got.EventType, got.Columns)
	}
	p.ack(s.records[0], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 0/258", ck.Confirmed())
	}
}

// TestEncodeMismatchIsABadEvent: a payload that does not fit stops the
// stream under fail, naming event and LSN, and is dead-lettered (its
// error in the record) under dead-letter; the checkpoint never passes it
// before the dead-letter record is acknowledged.
func TestEncodeMismatchIsABadEvent(t *testing.T) {
	p, ck, s := newEncodingPipeline(t, Fail, &fakeEncoder{fault: FaultEvent})
	err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"))
	var be *BadEventError
	if !errors.As(err, &be) || be.EventID != "1" || be.LSN != 1002 || !strings.Contains(err.Error(), "at $.n") {
		t.Fatalf("err = %v, want a bad event 1 at 0/3EA naming the path", err)
	}
	if len(s.records) != 0 || ck.Confirmed() != 100 {
		t.Fatalf("produced %d, confirmed %s: want nothing", len(s.records), ck.Confirmed())
	}

	p, ck, s = newEncodingPipeline(t, DeadLetter, &fakeEncoder{fault: FaultEvent})
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 1 || s.records[0].Topic != "dlq" || !strings.Contains(header(s.records[0], "error"), `subject "payment-value"`) {
		t.Fatalf("records %v, want one dead-letter record naming the subject", s.records)
	}
	if ck.Confirmed() != 100 {
		t.Fatalf("confirmed %s before the dead-letter record was acknowledged", ck.Confirmed())
	}
	p.ack(s.records[0], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s after the dead-letter record, want 0/258", ck.Confirmed())
	}
}

// TestEncodeUnavailableReadsAgain: a registry that cannot answer is no bad
// event, whatever the policy: the stream is told to read again (Resend),
// nothing is produced or confirmed, and the transaction sent again goes
// through once the registry answers.
func TestEncodeUnavailableReadsAgain(t *testing.T) {
	enc := &fakeEncoder{fault: FaultUnavailable}
	p, ck, s := newEncodingPipeline(t, DeadLetter, enc)
	err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "payment"))
	var again interface{ Resend() bool }
	if !errors.As(err, &again) || !again.Resend() || !strings.Contains(err.Error(), "event 1 at LSN 0/3EA") {
		t.Fatalf("err = %v, want one that makes the stream read event 1 again", err)
	}
	if len(s.records) != 0 || ck.Confirmed() != 100 {
		t.Fatalf("produced %d, confirmed %s: want nothing (no dead letter either)", len(s.records), ck.Confirmed())
	}
	p.Lost()
	enc.fault = 0
	if err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"), row("2", "payment"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || s.records[0].Topic == "dlq" {
		t.Fatalf("records %v, want the two events", s.records)
	}
	p.ack(s.records[0], nil)
	p.ack(s.records[1], nil)
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 0/258", ck.Confirmed())
	}
}

// TestEncodeSchemaGoneStops: a schema that is gone stops the stream even
// under dead-letter (every event of its subject would follow), naming
// the event; it is not read again.
func TestEncodeSchemaGoneStops(t *testing.T) {
	p, ck, s := newEncodingPipeline(t, DeadLetter, &fakeEncoder{fault: FaultSchema})
	err := feed(t, p, relationMsg(), beginMsg(500), row("1", "payment"))
	var se *SchemaStopError
	var again interface{ Resend() bool }
	if !errors.As(err, &se) || errors.As(err, &again) || !strings.Contains(err.Error(), "event 1 at LSN 0/3EA in table public.outbox") {
		t.Fatalf("err = %v, want a stop naming event 1, its LSN and table", err)
	}
	if len(s.records) != 0 || ck.Confirmed() != 100 {
		t.Fatalf("produced %d, confirmed %s: want nothing", len(s.records), ck.Confirmed())
	}
}

// TestMessagesAreEncodedByTheFirstOutbox: an outbox message, mapped by the
// first outbox's settings, is encoded by its encoder too, with its event
// type and no columns.
func TestMessagesAreEncodedByTheFirstOutbox(t *testing.T) {
	enc := &fakeEncoder{cols: []string{"schema_version"}}
	ck := checkpoint.New(100)
	s := &fakeSink{t: t}
	p, err := New(Config{
		Mapping: mapping.DefaultConfig(), Encoders: []Encoder{enc},
		OnBadEvent: Fail, MessagePrefix: "cdc_outbox",
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20,
	}, ck, newFakeCatalog(), s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := feed(t, p, beginMsg(500), logicalMsg(true, 550, "cdc_outbox", envelope("m1", "payment")), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 1 || string(s.records[0].Value) != `enc({"n": 1})` {
		t.Fatalf("records %v, want the message's payload encoded", s.records)
	}
	if got := enc.seen[0]; string(got.EventType) != "Created" || len(got.Columns) != 0 {
		t.Fatalf("encoder saw type %q columns %q, want Created and none", got.EventType, got.Columns)
	}
}
