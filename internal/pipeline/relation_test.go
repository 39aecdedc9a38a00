package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
)

// fakeCatalog answers Classify from a table of roles by relation id, as the
// catalog would; relation 1 (relationMsg) is the outbox.
type fakeCatalog struct {
	roles map[uint32]decoder.Role
	err   error
	asked []uint32 // relation ids, in the order asked
}

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{roles: map[uint32]decoder.Role{1: decoder.RoleOutbox}}
}

func (c *fakeCatalog) Classify(rel *decoder.Relation) (decoder.Role, decoder.Outbox, string, error) {
	c.asked = append(c.asked, rel.ID)
	if c.err != nil {
		return 0, decoder.Outbox{}, "", c.err
	}
	role := c.roles[rel.ID]
	switch role {
	case decoder.RoleUnmapped:
		return role, decoder.Outbox{}, "it no longer exists (test)", nil
	case decoder.RoleOutbox:
		// Every relation of the outbox is relation 1's: a partition, or
		// the table renamed.
		return role, decoder.Outbox{OID: 1, Schema: "public", Name: "outbox"}, "test", nil
	}
	return role, decoder.Outbox{}, "test", nil
}

// relationMsgAs describes relation id with the outbox's columns, under
// another name (a partition, or the outbox renamed).
func relationMsgAs(id uint32, namespace, name string) []byte {
	m := relationMsg()
	rest := m[bytes.IndexByte(m, 'd'):] // from the replica identity on; "public\x00outbox\x00" has no 'd'
	b := be32([]byte{'R'}, id)
	b = append(b, namespace+"\x00"+name+"\x00"...)
	return append(b, rest...)
}

// rowIn is row() in relation id.
func rowIn(id uint32, eventID string) []byte {
	m := row(eventID, "payment")
	binary.BigEndian.PutUint32(m[1:5], id)
	return m
}

func pipelineWith(t *testing.T, policy string, cat *fakeCatalog, log *slog.Logger) (*Pipeline, *fakeSink) {
	t.Helper()
	p, _, s := newTestPipeline(t, policy, 100)
	p.catalog = cat
	if log != nil {
		p.log = log
	}
	return p, s
}

// TestPartitionRowsArePublished: a relation the catalog calls the outbox's
// (a partition, under its own name) is published like the outbox, and once
// known it is not looked up again, not even when it is renamed.
func TestPartitionRowsArePublished(t *testing.T) {
	cat := newFakeCatalog()
	cat.roles[2] = decoder.RoleOutbox
	var logs bytes.Buffer
	p, s := pipelineWith(t, Fail, cat, slog.New(slog.NewTextHandler(&logs, nil)))
	err := feed(t, p, beginMsg(500), relationMsg(), row("1", "payment"), relationMsgAs(2, "public", "outbox_2026_12"), rowIn(2, "2"),
		relationMsgAs(2, "archive", "outbox_2026_12"), rowIn(2, "3"), commitMsg(600))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 3 || eventID(s.records[1]) != "2" || eventID(s.records[2]) != "3" {
		t.Fatalf("records %v", s.records)
	}
	if len(cat.asked) != 2 {
		t.Errorf("asked the catalog about %v; want relations 1 and 2 once each", cat.asked)
	}
	if n := strings.Count(logs.String(), "was renamed or moved"); n != 1 || !strings.Contains(logs.String(), "from=public.outbox_2026_12 to=archive.outbox_2026_12") {
		t.Errorf("want one rename line, got %d:\n%s", n, logs.String())
	}
}

// TestUnmappedRowStops: under fail, a row from a relation the catalog
// cannot map stops the stream with the relation, the event and the LSN, and
// nothing is produced.
func TestUnmappedRowStops(t *testing.T) {
	cat := newFakeCatalog()
	p, s := pipelineWith(t, Fail, cat, nil)
	err := feed(t, p, relationMsg(), beginMsg(500), relationMsgAs(9, "public", "outbox_2025_01"), rowIn(9, "41"))
	if err == nil {
		t.Fatal("an unmapped row did not stop the stream")
	}
	for _, want := range []string{"bad event 41 at LSN 0/3EB", "relation public.outbox_2025_01 (OID 9)", "cannot be mapped to the outbox table", "no longer exists"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if len(s.records) != 0 {
		t.Errorf("produced %v", s.records)
	}
}

// TestUnmappedRowDeadLettered: under dead-letter it goes to the dead-letter
// topic, named after its relation, as part of its transaction.
func TestUnmappedRowDeadLettered(t *testing.T) {
	p, s := pipelineWith(t, DeadLetter, newFakeCatalog(), nil)
	err := feed(t, p, relationMsg(), beginMsg(500), relationMsgAs(9, "public", "outbox_2025_01"), rowIn(9, "41"), row("42", "payment"), commitMsg(600))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 2 || s.records[0].Topic != "dlq" || eventID(s.records[0]) != "41" || header(s.records[0], "source_table") != "public.outbox_2025_01" ||
		!strings.Contains(header(s.records[0], "error"), "OID 9") {
		t.Fatalf("records %v", s.records)
	}
	p.ack(s.records[1], nil)
	if p.ckpt.Confirmed() != 100 {
		t.Fatal("confirmed before the dead-letter record was acknowledged")
	}
	p.ack(s.records[0], nil)
	if p.ckpt.Confirmed() != 600 {
		t.Fatalf("confirmed %s, want 600", p.ckpt.Confirmed())
	}
}

// TestOtherTableIsSkippedAndLookedUpAgain: a table the catalog calls
// another is skipped, and looked up again on its next Relation message: it
// may have been attached to the outbox since.
func TestOtherTableIsSkippedAndLookedUpAgain(t *testing.T) {
	cat := newFakeCatalog()
	cat.roles[5] = decoder.RoleOther
	p, s := pipelineWith(t, Fail, cat, nil)
	if err := feed(t, p, relationMsg(), beginMsg(500), relationMsgAs(5, "public", "orders"), rowIn(5, "1"), commitMsg(600)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 0 || p.Skipped().OtherTable != 1 || p.ckpt.Confirmed() != 600 {
		t.Fatalf("records %v, skipped %+v, confirmed %s", s.records, p.Skipped(), p.ckpt.Confirmed())
	}
	cat.roles[5] = decoder.RoleOutbox // ALTER TABLE outbox ATTACH PARTITION orders ...
	if err := feed(t, p, beginMsg(700), relationMsgAs(5, "public", "orders"), rowIn(5, "2"), commitMsg(800)); err != nil {
		t.Fatal(err)
	}
	if len(s.records) != 1 || eventID(s.records[0]) != "2" {
		t.Fatalf("after the attach: records %v", s.records)
	}
}

// TestCatalogErrorIsReturned: a failed lookup is returned wrapped, so the
// stream can tell it from a bad row and read the transaction again.
func TestCatalogErrorIsReturned(t *testing.T) {
	errDown := errors.New("catalog down")
	cat := newFakeCatalog()
	cat.err = errDown
	p, s := pipelineWith(t, Fail, cat, nil)
	err := feed(t, p, beginMsg(500), relationMsg(), row("1", "payment"))
	if !errors.Is(err, errDown) || !strings.Contains(err.Error(), "public.outbox (OID 1)") {
		t.Fatalf("err = %v", err)
	}
	if len(s.records) != 0 {
		t.Fatalf("records %v", s.records)
	}
}
