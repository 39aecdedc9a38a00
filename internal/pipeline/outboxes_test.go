package pipeline

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/twmb/franz-go/pkg/kgo"
)

// outboxCatalog says which outbox each relation is, as the catalog does for
// a stream of several.
type outboxCatalog map[uint32]decoder.Outbox

func (c outboxCatalog) Classify(rel *decoder.Relation) (decoder.Role, decoder.Outbox, string, error) {
	o, ok := c[rel.ID]
	if !ok {
		return decoder.RoleOther, decoder.Outbox{}, "test", nil
	}
	return decoder.RoleOutbox, o, "test", nil
}

// relationOf describes relation id with columns of text type, but payload
// (jsonb).
func relationOf(id uint32, namespace, name string, cols ...string) []byte {
	b := be32([]byte{'R'}, id)
	b = append(b, namespace+"\x00"+name+"\x00"...)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		oid := uint32(25)
		if c == "payload" || c == "body" {
			oid = 3802
		}
		b = append(b, 0)
		b = append(b, c+"\x00"...)
		b = be32(b, oid)
		b = be32(b, 0xffffffff)
	}
	return b
}

// insertInto is insertMsg into relation id.
func insertInto(id uint32, values ...string) []byte {
	m := insertMsg(values...)
	binary.BigEndian.PutUint32(m[1:5], id)
	return m
}

// TestOutboxesOfDifferentShapes: two outboxes in one stream, with their
// own columns, topic templates and sources: each row is mapped by its
// table's entry, a partition's by its table's, and each table is counted
// apart.
func TestOutboxesOfDifferentShapes(t *testing.T) {
	def := mapping.DefaultConfig()
	def.Topic = "a.{aggregate_type}"
	billing := mapping.DefaultConfig()
	billing.Topic, billing.IDColumn, billing.EventTypeColumn, billing.PayloadColumn, billing.Source = "b.{name}", "event_id", "name", "body", "billing"
	cat := outboxCatalog{
		10: {Entry: 0, OID: 10, Schema: "tenant_1", Name: "outbox", Identity: "sys/db/10"},
		20: {Entry: 1, OID: 20, Schema: "billing", Name: "outbox", Identity: "sys/db/20"},
		21: {Entry: 1, OID: 20, Schema: "billing", Name: "outbox", Identity: "sys/db/20"}, // a partition of 20
	}
	s := &fakeSink{t: t}
	p, err := New(Config{Outboxes: []mapping.Config{def, billing}, OnBadEvent: Fail,
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20}, checkpoint.New(100), cat, s, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = feed(t, p,
		relationOf(10, "tenant_1", "outbox", "id", "aggregate_type", "aggregate_id", "event_type", "payload"),
		relationOf(20, "billing", "outbox", "event_id", "aggregate_type", "aggregate_id", "name", "body"),
		relationOf(21, "billing", "outbox_p1", "event_id", "aggregate_type", "aggregate_id", "name", "body"),
		beginMsg(500),
		insertInto(10, "1", "payment", "p-1", "Created", `{"t": 1}`),
		insertInto(20, "1", "invoice", "i-1", "InvoicePaid", `{"b": 1}`),
		insertInto(21, "2", "invoice", "i-2", "InvoiceSent", `{"b": 2}`),
		commitMsg(600))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 3 {
		t.Fatalf("%d records, want 3", len(s.records))
	}
	for i, want := range []struct{ topic, id, source, value string }{
		{"a.payment", "1", "sys/db/10", `{"t": 1}`},
		{"b.InvoicePaid", "1", "billing", `{"b": 1}`},
		{"b.InvoiceSent", "2", "billing", `{"b": 2}`},
	} {
		r := s.records[i]
		if r.Topic != want.topic || header(r, "id") != want.id || header(r, "source") != want.source || string(r.Value) != want.value {
			t.Errorf("record %d: topic %q id %q source %q value %q; want %+v", i, r.Topic, header(r, "id"), header(r, "source"), r.Value, want)
		}
	}
	for _, r := range s.records {
		p.ack(r, nil)
	}
	got := map[string]uint64{}
	for _, o := range p.Outboxes() {
		got[o.Table] = o.Events
	}
	if len(got) != 2 || got["tenant_1.outbox"] != 1 || got["billing.outbox"] != 2 {
		t.Fatalf("events per outbox: %v, want tenant_1.outbox 1 and billing.outbox 2 (its partition's included)", got)
	}
}

// TestBadEventPolicyPerOutbox: a tenant outbox that dead-letters and a
// payments outbox that stops, in one stream: the tenant's bad row goes to
// the dead-letter topic and the stream goes on; the payments outbox's bad
// row stops it, confirming nothing past it; and the other way round. (A
// record the broker refuses: TestRefusedBatchWithFranzGo.)
func TestBadEventPolicyPerOutbox(t *testing.T) {
	cat := outboxCatalog{
		10: {Entry: 0, OID: 10, Schema: "tenant_1", Name: "outbox", Identity: "sys/db/10"},
		20: {Entry: 1, OID: 20, Schema: "payments", Name: "outbox", Identity: "sys/db/20"},
	}
	cols := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}
	newPipeline := func(policies ...string) (*Pipeline, *checkpoint.Tracker, *fakeSink) {
		t.Helper()
		ck := checkpoint.New(100)
		s := &fakeSink{t: t}
		p, err := New(Config{Outboxes: []mapping.Config{mapping.DefaultConfig(), mapping.DefaultConfig()}, OnBadEvent: Fail, OnBadEvents: policies,
			DeadLetterTopic: "dlq", MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20}, ck, cat, s, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return p, ck, s
	}

	p, ck, s := newPipeline(DeadLetter) // the tenant's own; payments takes the stream's, fail
	err := feed(t, p,
		relationOf(10, "tenant_1", "outbox", cols...),
		relationOf(20, "payments", "outbox", cols...),
		beginMsg(500),
		insertInto(10, "1", "bad topic!", "t-1", "Created", `{}`),
		insertInto(20, "1", "payment", "p-1", "Created", `{}`),
		commitMsg(600))
	if err != nil {
		t.Fatalf("the tenant's bad row stopped the stream: %v", err)
	}
	if len(s.records) != 2 || s.records[0].Topic != "dlq" || s.records[1].Topic != "outbox.event.payment" {
		t.Fatalf("records %v, want the tenant's dead letter and the payment", topics(s.records))
	}
	for _, r := range s.records {
		p.ack(r, nil)
	}
	if ck.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", ck.Confirmed())
	}
	err = feed(t, p, beginMsg(700), insertInto(20, "2", "bad topic!", "p-2", "Created", `{}`))
	var be *BadEventError
	if !errors.As(err, &be) || be.EventID != "2" || be.Table != "payments.outbox" {
		t.Fatalf("payments' bad row: err %v, want a bad event 2 of payments.outbox that stops the stream", err)
	}
	if len(s.records) != 2 || ck.Confirmed() != 600 {
		t.Fatalf("after payments' bad row: %d records, confirmed %s; want nothing sent and 600", len(s.records), ck.Confirmed())
	}

	// Policies the other way round: the stream's dead-letter, payments' fail.
	p, _, s = newPipeline("", Fail)
	p.cfg.OnBadEvent = DeadLetter
	err = feed(t, p,
		relationOf(10, "tenant_1", "outbox", cols...),
		relationOf(20, "payments", "outbox", cols...),
		beginMsg(500),
		insertInto(10, "1", "bad topic!", "t-1", "Created", `{}`),
		insertInto(20, "1", "bad topic!", "p-1", "Created", `{}`))
	if !errors.As(err, &be) || be.Table != "payments.outbox" || len(s.records) != 1 || s.records[0].Topic != "dlq" {
		t.Fatalf("err %v, records %v: want the tenant's row dead-lettered and payments' stop the stream", err, topics(s.records))
	}

	for _, bad := range [][]string{{"stop"}, {Fail, DeadLetter, Fail}} {
		_, err := New(Config{Outboxes: []mapping.Config{mapping.DefaultConfig(), mapping.DefaultConfig()}, OnBadEvent: Fail, OnBadEvents: bad,
			DeadLetterTopic: "dlq", MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20}, checkpoint.New(100), cat, &fakeSink{t: t}, nil, slog.New(slog.DiscardHandler))
		if err == nil {
			t.Errorf("policies %q accepted", bad)
		}
	}
	_, err = New(Config{Outboxes: []mapping.Config{mapping.DefaultConfig()}, OnBadEvent: Fail, OnBadEvents: []string{DeadLetter},
		MaxInflightEvents: 100, MaxInflightBytes: 1 << 30, MaxRecordBytes: 1 << 20}, checkpoint.New(100), cat, &fakeSink{t: t}, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "dead-letter topic") {
		t.Errorf("an outbox's dead-letter policy without a dead-letter topic: err %v", err)
	}
}

func topics(rs []*kgo.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Topic)
	}
	return out
}
