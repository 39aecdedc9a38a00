package pipeline

import (
	"encoding/binary"
	"log/slog"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
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
