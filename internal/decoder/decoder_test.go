package decoder_test

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/jackc/pglogrepl"
)

// enc builds a pgoutput message byte by byte, independently of the decoder,
// following the PostgreSQL "Logical Replication Message Formats" page.
type enc struct{ b []byte }

func msg(typ byte) *enc { return &enc{b: []byte{typ}} }

func (e *enc) u8(v byte) *enc    { e.b = append(e.b, v); return e }
func (e *enc) u16(v uint16) *enc { e.b = binary.BigEndian.AppendUint16(e.b, v); return e }
func (e *enc) u32(v uint32) *enc { e.b = binary.BigEndian.AppendUint32(e.b, v); return e }
func (e *enc) u64(v uint64) *enc { e.b = binary.BigEndian.AppendUint64(e.b, v); return e }
func (e *enc) str(s string) *enc { e.b = append(append(e.b, s...), 0); return e }
func (e *enc) raw(b []byte) *enc { e.b = append(e.b, b...); return e }
func (e *enc) bytes() []byte     { return e.b }
func (e *enc) i64(v int64) *enc  { return e.u64(uint64(v)) }
func (e *enc) lsn(v uint64) *enc { return e.u64(v) }
func (e *enc) tuple(vals ...decoder.Value) *enc {
	e.u16(uint16(len(vals)))
	for _, v := range vals {
		e.u8(v.Kind)
		if v.Kind == 't' || v.Kind == 'b' {
			e.u32(uint32(len(v.Data))).raw(v.Data)
		}
	}
	return e
}

func text(s string) decoder.Value { return decoder.Value{Kind: 't', Data: []byte(s)} }

var null = decoder.Value{Kind: 'n'}

// pgMicros converts t to a pgoutput timestamp.
func pgMicros(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

func beginMsg(final uint64, ts int64, xid uint32) []byte {
	return msg('B').lsn(final).i64(ts).u32(xid).bytes()
}

func commitMsg(commitLSN, endLSN uint64, ts int64) []byte {
	return msg('C').u8(0).lsn(commitLSN).lsn(endLSN).i64(ts).bytes()
}

// relationMsg describes a table whose columns are all text (OID 25), the
// first being the key.
func relationMsg(id uint32, namespace, name string, cols ...string) []byte {
	e := msg('R').u32(id).str(namespace).str(name).u8('d').u16(uint16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1
		}
		e.u8(flags).str(c).u32(25).u32(0xFFFFFFFF) // typmod -1
	}
	return e.bytes()
}

func insertMsg(id uint32, vals ...decoder.Value) []byte {
	return msg('I').u32(id).u8('N').tuple(vals...).bytes()
}

// updateMsg sends an old tuple when marker is 'K' or 'O', none when it is 0.
func updateMsg(id uint32, marker byte, old, new []decoder.Value) []byte {
	e := msg('U').u32(id)
	if marker != 0 {
		e.u8(marker).tuple(old...)
	}
	return e.u8('N').tuple(new...).bytes()
}

func deleteMsg(id uint32, marker byte, old ...decoder.Value) []byte {
	return msg('D').u32(id).u8(marker).tuple(old...).bytes()
}

func truncateMsg(options byte, ids ...uint32) []byte {
	e := msg('T').u32(uint32(len(ids))).u8(options)
	for _, id := range ids {
		e.u32(id)
	}
	return e.bytes()
}

func typeMsg() []byte   { return msg('Y').u32(16500).str("public").str("mood").bytes() }
func originMsg() []byte { return msg('O').lsn(0x1_0000_0100).str("other_node").bytes() }
func logicalMsg() []byte {
	return msg('M').u8(1).lsn(0x1_0000_0200).str("app").u32(5).raw([]byte("hello")).bytes()
}

// outboxMsgPrefix is the prefix outboxDecoder takes for outbox messages.
const outboxMsgPrefix = "cdc_outbox"

// outboxMsg is a logical decoding message of the outbox prefix;
// transactional sets flags bit 1.
func outboxMsg(transactional bool, lsn uint64, content string) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	return msg('M').u8(flags).lsn(lsn).str(outboxMsgPrefix).u32(uint32(len(content))).raw([]byte(content)).bytes()
}

// The outbox fixture: a 7-column table and an insert with a ~200-byte JSON
// payload, shared by the tests, the benchmark and the fuzz target.
const (
	outboxID = 16385
	otherID  = 16390
)

var outboxWanted = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"}

var outboxColumns = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"}

func outboxRelation() []byte {
	return relationMsg(outboxID, "public", "outbox", outboxColumns...)
}

func otherRelation() []byte {
	return relationMsg(otherID, "public", "orders", "id", "total")
}

const payload = `{"orderId":"7f3c2a10-5b7e-4c1d-9a8e-2f6b1d4c3e21","customerId":"c-104729","status":"CREATED","items":[{"sku":"SKU-1001","qty":2,"price":"19.99"},{"sku":"SKU-2002","qty":1,"price":"5.49"}],"total":"45.47"}`

func outboxInsert() []byte {
	return insertMsg(outboxID,
		text("3b241101-e2bb-4255-8caf-4136c566a962"),
		text("order"),
		text("7f3c2a10-5b7e-4c1d-9a8e-2f6b1d4c3e21"),
		text("OrderCreated"),
		text(payload),
		text(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`),
		text("2024-05-06 07:08:09.123456+00"),
	)
}

// outboxDecoder returns a decoder that knows outboxID as the outbox and
// otherID as another table, as the streamer's catalog lookup would say.
func outboxDecoder() *decoder.Decoder {
	d := decoder.New(outboxWanted)
	d.Messages(outboxMsgPrefix)
	d.Assign(outboxID, decoder.RoleOutbox)
	d.Assign(otherID, decoder.RoleOther)
	return d
}

// primed returns an outboxDecoder that has seen the outbox and other-table
// Relation messages.
func primed(t testing.TB) *decoder.Decoder {
	t.Helper()
	d := outboxDecoder()
	for _, m := range [][]byte{outboxRelation(), otherRelation()} {
		if _, err := d.Decode(m); err != nil {
			t.Fatalf("priming: %v", err)
		}
	}
	return d
}

func mustDecode(t *testing.T, d *decoder.Decoder, m []byte) *decoder.Event {
	t.Helper()
	ev, err := d.Decode(m)
	if err != nil {
		t.Fatalf("Decode(%q): %v", m, err)
	}
	return ev
}

func TestBegin(t *testing.T) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	ev := mustDecode(t, decoder.New(nil), beginMsg(0x16_B374D848, pgMicros(at), 7771))
	if ev.Kind != decoder.KindBegin || ev.Xid != 7771 || ev.FinalLSN != pglogrepl.LSN(0x16_B374D848) {
		t.Errorf("got %+v", ev)
	}
	if ev.FinalLSN.String() != "16/B374D848" {
		t.Errorf("FinalLSN = %s", ev.FinalLSN)
	}
	if !ev.CommitTime.Equal(at) || ev.CommitTime.Location() != time.UTC {
		t.Errorf("CommitTime = %v, want %v in UTC", ev.CommitTime, at)
	}
}

func TestCommit(t *testing.T) {
	d := decoder.New(nil)
	for _, tc := range []struct {
		micros int64
		want   time.Time
	}{
		{0, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}, // the PostgreSQL epoch
		{86_400_000_001, time.Date(2000, 1, 2, 0, 0, 0, 1000, time.UTC)},
		{-1_000_000, time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC)},
		{pgMicros(time.Date(2025, 12, 13, 15, 1, 35, 999999000, time.UTC)), time.Date(2025, 12, 13, 15, 1, 35, 999999000, time.UTC)},
	} {
		ev := mustDecode(t, d, commitMsg(0x100, 0x128, tc.micros))
		if ev.Kind != decoder.KindCommit {
			t.Fatalf("Kind = %v", ev.Kind)
		}
		// The two LSNs differ on purpose: the streamer must confirm EndLSN.
		if ev.CommitLSN != 0x100 || ev.EndLSN != 0x128 {
			t.Errorf("CommitLSN, EndLSN = %s, %s; want 0/100, 0/128", ev.CommitLSN, ev.EndLSN)
		}
		if !ev.CommitTime.Equal(tc.want) || ev.CommitTime.Location() != time.UTC {
			t.Errorf("micros %d: CommitTime = %v, want %v", tc.micros, ev.CommitTime, tc.want)
		}
	}
}

func TestInsertValuesByName(t *testing.T) {
	// Columns in another order than wanted, one extra column, one wanted
	// column missing.
	d := decoder.New([]string{"id", "topic", "payload", "key"})
	d.Assign(42, decoder.RoleOutbox)
	ev := mustDecode(t, d, relationMsg(42, "app", "outbox", "payload", "extra", "id", "topic"))
	if ev.Kind != decoder.KindRelation || ev.Relation == nil {
		t.Fatalf("got %+v", ev)
	}
	rel := ev.Relation
	if rel.Role != decoder.RoleOutbox || rel.ID != 42 || rel.Namespace != "app" || rel.Name != "outbox" || rel.ReplicaIdentity != 'd' {
		t.Errorf("relation = %+v", rel)
	}
	if want := []int{2, 3, 0, -1}; !slices.Equal(rel.Wanted, want) {
		t.Errorf("Wanted = %v, want %v", rel.Wanted, want)
	}
	want := decoder.Column{Name: "payload", TypeOID: 25, Flags: 1, TypeMod: -1}
	if len(rel.Columns) != 4 || rel.Columns[0] != want {
		t.Errorf("Columns = %+v", rel.Columns)
	}

	ev = mustDecode(t, d, insertMsg(42, text(`{"a":1}`), text("ignored"), text("id-1"), text("orders")))
	if ev.Kind != decoder.KindInsert || ev.Relation != rel {
		t.Fatalf("got %+v", ev)
	}
	got := make([]string, len(ev.Values))
	for i, v := range ev.Values {
		got[i] = string(v.Data)
	}
	if want := []string{"id-1", "orders", `{"a":1}`, ""}; !slices.Equal(got, want) {
		t.Errorf("Values = %q, want %q", got, want)
	}
	if !ev.Values[3].Missing() || ev.Values[0].Missing() {
		t.Errorf("Missing() wrong: %+v", ev.Values)
	}
	if len(ev.Tuple) != 4 || string(ev.Tuple[1].Data) != "ignored" {
		t.Errorf("Tuple = %+v", ev.Tuple)
	}
}

func TestInsertValueKinds(t *testing.T) {
	d := decoder.New([]string{"a", "b", "c", "d"})
	d.Assign(1, decoder.RoleOutbox)
	mustDecode(t, d, relationMsg(1, "public", "outbox", "a", "b", "c", "d"))
	bin := decoder.Value{Kind: 'b', Data: []byte{0, 1, 2}}
	empty := decoder.Value{Kind: 't', Data: []byte{}}
	ev := mustDecode(t, d, insertMsg(1, null, decoder.Value{Kind: 'u'}, bin, empty))
	v := ev.Values
	if !v[0].Null() || v[0].Missing() || v[0].Data != nil {
		t.Errorf("null: %+v", v[0])
	}
	if v[1].Kind != 'u' || v[1].Null() || v[1].Missing() {
		t.Errorf("unchanged TOAST: %+v", v[1])
	}
	if v[2].Kind != 'b' || string(v[2].Data) != "\x00\x01\x02" {
		t.Errorf("binary: %+v", v[2])
	}
	if v[3].Kind != 't' || len(v[3].Data) != 0 || v[3].Null() {
		t.Errorf("empty text: %+v", v[3])
	}
}

func TestInsertValuesAliasMessage(t *testing.T) {
	d := primed(t)
	m := outboxInsert()
	ev := mustDecode(t, d, m)
	p := ev.Values[4].Data
	if string(p) != payload {
		t.Fatalf("payload = %q", p)
	}
	// Capped: appending must copy instead of overwriting the next column.
	if cap(p) != len(p) {
		t.Errorf("cap(Data) = %d, want %d", cap(p), len(p))
	}
}

func TestRelationReplaced(t *testing.T) {
	d := decoder.New([]string{"id", "payload", "key"})
	d.Assign(7, decoder.RoleOutbox)
	first := mustDecode(t, d, relationMsg(7, "public", "outbox", "id", "payload"))
	old := first.Relation
	if first.Replaced != nil {
		t.Errorf("a new relation id replaced %+v", first.Replaced)
	}
	if want := []int{0, 1, -1}; !slices.Equal(old.Wanted, want) {
		t.Fatalf("Wanted = %v, want %v", old.Wanted, want)
	}
	ev := mustDecode(t, d, insertMsg(7, text("1"), text("p1")))
	if !ev.Values[2].Missing() {
		t.Errorf("key should be missing before ALTER TABLE: %+v", ev.Values[2])
	}

	// ALTER TABLE outbox ADD COLUMN key, with columns reordered.
	ev = mustDecode(t, d, relationMsg(7, "public", "outbox", "key", "id", "note", "payload"))
	altered := ev.Relation
	if ev.Replaced != old || altered.Role != decoder.RoleOutbox {
		t.Errorf("Replaced = %p, want the old relation %p; role %v", ev.Replaced, old, altered.Role)
	}
	if want := []int{1, 3, 0}; !slices.Equal(altered.Wanted, want) {
		t.Errorf("Wanted after ALTER = %v, want %v", altered.Wanted, want)
	}
	if want := []int{0, 1, -1}; !slices.Equal(old.Wanted, want) || len(old.Columns) != 2 {
		t.Errorf("old *Relation was modified: %+v", old)
	}
	ev = mustDecode(t, d, insertMsg(7, text("k"), text("2"), null, text("p2")))
	if ev.Relation != altered || string(ev.Values[0].Data) != "2" || string(ev.Values[1].Data) != "p2" || string(ev.Values[2].Data) != "k" {
		t.Errorf("after ALTER: %+v", ev)
	}

	// A tuple in the old shape no longer fits.
	_, err := d.Decode(insertMsg(7, text("3"), text("p3")))
	if !errors.Is(err, decoder.ErrMalformed) || !strings.Contains(err.Error(), "tuple has 2 columns, relation public.outbox has 4") {
		t.Errorf("old-shape insert: err = %v", err)
	}
}

func TestSkip(t *testing.T) {
	row := []decoder.Value{text("1"), text("o"), text("a"), text("e"), text("{}"), null, text("t")}
	key := []decoder.Value{text("1"), null, null, null, null, null, null}
	for _, tc := range []struct {
		name     string
		msg      []byte
		reason   string
		relation uint32 // 0: none
	}{
		{"update", updateMsg(outboxID, 0, nil, row), decoder.SkipUpdate, outboxID},
		{"update with key", updateMsg(outboxID, 'K', key, row), decoder.SkipUpdate, outboxID},
		{"update with old row", updateMsg(outboxID, 'O', row, row), decoder.SkipUpdate, outboxID},
		{"update other table", updateMsg(otherID, 0, nil, []decoder.Value{text("1"), text("2")}), decoder.SkipUpdate, otherID},
		{"delete with key", deleteMsg(outboxID, 'K', key...), decoder.SkipDelete, outboxID},
		{"delete with old row", deleteMsg(outboxID, 'O', row...), decoder.SkipDelete, outboxID},
		{"delete other table", deleteMsg(otherID, 'K', text("1"), null), decoder.SkipDelete, otherID},
		{"truncate outbox", truncateMsg(0, outboxID), decoder.SkipTruncate, outboxID},
		{"truncate outbox among others", truncateMsg(1, otherID, 99999, outboxID), decoder.SkipTruncate, outboxID},
		{"truncate other", truncateMsg(2, otherID), decoder.SkipTruncate, otherID},
		{"truncate unknown", truncateMsg(0, 99999), decoder.SkipTruncate, 0},
		{"truncate nothing", truncateMsg(0), decoder.SkipTruncate, 0},
		{"insert other table", insertMsg(otherID, text("1"), text("2")), decoder.SkipOtherTable, otherID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := primed(t)
			ev := mustDecode(t, d, tc.msg)
			if ev.Kind != decoder.KindSkip || ev.SkipReason != tc.reason || ev.Values != nil || ev.Tuple != nil {
				t.Errorf("got %+v, want Skip %q", ev, tc.reason)
			}
			switch {
			case tc.relation == 0 && ev.Relation != nil:
				t.Errorf("Relation = %+v, want nil", ev.Relation)
			case tc.relation != 0 && (ev.Relation == nil || ev.Relation.ID != tc.relation):
				t.Errorf("Relation = %+v, want id %d", ev.Relation, tc.relation)
			}
		})
	}
}

func TestSkipped(t *testing.T) {
	d := primed(t)
	row := []decoder.Value{text("1"), text("o"), text("a"), text("e"), text("{}"), null, text("t")}
	for _, m := range [][]byte{
		updateMsg(outboxID, 0, nil, row),
		updateMsg(outboxID, 0, nil, row),
		deleteMsg(outboxID, 'O', row...),
		truncateMsg(0, outboxID, otherID), // one message, counted once
		insertMsg(otherID, text("1"), text("2")),
		insertMsg(otherID, text("1"), text("2")),
		insertMsg(otherID, text("1"), text("2")),
		outboxInsert(), // published, not counted
	} {
		mustDecode(t, d, m)
	}
	// Rejected messages are not counted either.
	if _, err := d.Decode(updateMsg(outboxID, 0, nil, row[:1])); err == nil {
		t.Fatal("short update decoded")
	}
	want := decoder.SkipCounts{Update: 2, Delete: 1, Truncate: 1, OtherTable: 3}
	if got := d.Skipped(); got != want {
		t.Errorf("Skipped() = %+v, want %+v", got, want)
	}
}

func TestUnknownRelation(t *testing.T) {
	for _, m := range [][]byte{
		insertMsg(4242, text("x")),
		updateMsg(4242, 0, nil, []decoder.Value{text("x")}),
		deleteMsg(4242, 'K', text("x")),
	} {
		_, err := primed(t).Decode(m)
		if !errors.Is(err, decoder.ErrUnknownRelation) || !strings.Contains(err.Error(), "4242") {
			t.Errorf("%c: err = %v, want ErrUnknownRelation naming 4242", m[0], err)
		}
	}
}

// TestUnmappedInsert: an insert into a relation that has no role is neither
// published nor skipped: it is an Unmapped event, with the values, so the
// caller can name the event it refuses.
func TestUnmappedInsert(t *testing.T) {
	d := primed(t)
	mustDecode(t, d, relationMsg(77, "app", "outbox_2026_12", outboxColumns...))
	ev := mustDecode(t, d, insertMsg(77, text("9"), text("o"), text("a"), text("e"), text("{}"), null, text("t")))
	if ev.Kind != decoder.KindUnmapped || ev.Relation == nil || ev.Relation.ID != 77 || ev.Relation.Role != decoder.RoleUnmapped {
		t.Fatalf("got %+v, want an Unmapped event of relation 77", ev)
	}
	if len(ev.Values) != len(outboxWanted) || string(ev.Values[0].Data) != "9" || len(ev.Tuple) != len(outboxColumns) {
		t.Errorf("values %+v, tuple %+v", ev.Values, ev.Tuple)
	}
	if got := d.Skipped(); got != (decoder.SkipCounts{}) {
		t.Errorf("an unmapped insert was counted as skipped: %+v", got)
	}
	// Updates, deletes and truncates of it are skipped as before: they
	// publish nothing whatever the relation is.
	row := []decoder.Value{text("9"), text("o"), text("a"), text("e"), text("{}"), null, text("t")}
	if ev := mustDecode(t, d, updateMsg(77, 0, nil, row)); ev.Kind != decoder.KindSkip {
		t.Errorf("update of an unmapped relation: %v", ev.Kind)
	}
}

// TestAssign: a role may be given before or after the Relation message, is
// kept across later Relation messages of the id, and replaces the cached
// Relation rather than changing it.
func TestAssign(t *testing.T) {
	d := decoder.New(outboxWanted)
	row := []decoder.Value{text("1"), text("o"), text("a"), text("e"), text("{}"), null, text("t")}
	early := mustDecode(t, d, relationMsg(5, "public", "outbox_p1", outboxColumns...)).Relation
	if ev := mustDecode(t, d, insertMsg(5, row...)); ev.Kind != decoder.KindUnmapped {
		t.Fatalf("insert before Assign: %v, want unmapped", ev.Kind)
	}
	rel := d.Assign(5, decoder.RoleOutbox)
	if rel == nil || rel == early || rel.Role != decoder.RoleOutbox || early.Role != decoder.RoleUnmapped || rel.Name != "outbox_p1" {
		t.Fatalf("Assign returned %+v; the earlier relation is now %+v", rel, early)
	}
	if again := d.Assign(5, decoder.RoleOutbox); again != rel {
		t.Errorf("assigning the same role again replaced the relation")
	}
	if ev := mustDecode(t, d, insertMsg(5, row...)); ev.Kind != decoder.KindInsert || ev.Relation != rel {
		t.Errorf("insert after Assign: %+v", ev)
	}
	// Renamed: a new Relation message, same id, same role.
	renamed := mustDecode(t, d, relationMsg(5, "archive", "outbox_old", outboxColumns...))
	if renamed.Relation.Role != decoder.RoleOutbox || renamed.Replaced != rel {
		t.Errorf("renamed relation: role %v, replaced %p (want %p)", renamed.Relation.Role, renamed.Replaced, rel)
	}
	if d.Assign(6, decoder.RoleOther) != nil {
		t.Errorf("Assign of an id without a Relation returned one")
	}
	mustDecode(t, d, relationMsg(6, "public", "orders", "id"))
	if ev := mustDecode(t, d, insertMsg(6, text("1"))); ev.Kind != decoder.KindSkip || ev.SkipReason != decoder.SkipOtherTable {
		t.Errorf("insert into another table: %+v", ev)
	}
}

func TestIgnore(t *testing.T) {
	d := primed(t)
	for _, m := range [][]byte{typeMsg(), originMsg()} {
		if ev := mustDecode(t, d, m); ev.Kind != decoder.KindIgnore {
			t.Errorf("%c: Kind = %v, want ignore", m[0], ev.Kind)
		}
	}
}

// TestMessage decodes a logical decoding message byte by byte: flags,
// LSN, prefix, content length and content (protocol version 1, no xid).
func TestMessage(t *testing.T) {
	d := primed(t)
	content := `{"v":1,"id":"e1"}`
	m := outboxMsg(true, 0x2_0000_0010, content)
	ev := mustDecode(t, d, m)
	if ev.Kind != decoder.KindMessage || !ev.Transactional || ev.MessageLSN != 0x2_0000_0010 ||
		string(ev.Prefix) != outboxMsgPrefix || string(ev.Content) != content || ev.Relation != nil {
		t.Fatalf("transactional message: %+v", ev)
	}
	// The content aliases the message, capped so appending cannot
	// overwrite what follows.
	if &ev.Content[0] != &m[len(m)-len(content)] || cap(ev.Content) != len(content) {
		t.Errorf("content does not alias the message, or is not capped")
	}
	ev = mustDecode(t, d, outboxMsg(false, 0x2_0000_0020, "x"))
	if ev.Kind != decoder.KindMessage || ev.Transactional || ev.MessageLSN != 0x2_0000_0020 {
		t.Errorf("non-transactional message: %+v", ev)
	}
	// Bits other than the first are not ours to judge.
	if ev := mustDecode(t, d, msg('M').u8(3).lsn(1).str(outboxMsgPrefix).u32(0).bytes()); ev.Kind != decoder.KindMessage || !ev.Transactional || len(ev.Content) != 0 {
		t.Errorf("flags 3, empty content: %+v", ev)
	}
	// Other prefixes, a prefix of ours among them, are passed over and
	// counted.
	for _, p := range []string{"app", "", "cdc_outbo", "cdc_outbox2", "CDC_OUTBOX"} {
		if ev := mustDecode(t, d, msg('M').u8(1).lsn(1).str(p).u32(1).raw([]byte("x")).bytes()); ev.Kind != decoder.KindSkip || ev.SkipReason != decoder.SkipOtherPrefix || ev.Content != nil {
			t.Errorf("prefix %q: %+v", p, ev)
		}
	}
	if got := d.Skipped(); got != (decoder.SkipCounts{OtherPrefix: 5}) {
		t.Errorf("Skipped() = %+v", got)
	}
	// Without Messages every message is passed over.
	plain := decoder.New(nil)
	if ev := mustDecode(t, plain, m); ev.Kind != decoder.KindSkip || ev.SkipReason != decoder.SkipOtherPrefix {
		t.Errorf("decoder without a prefix: %+v", ev)
	}
	// A message between rows of a transaction keeps its place.
	var kinds []decoder.Kind
	for _, m := range [][]byte{beginMsg(0x300, 0, 9), outboxInsert(), outboxMsg(true, 0x2f0, "{}"), outboxInsert(), commitMsg(0x300, 0x330, 0)} {
		kinds = append(kinds, mustDecode(t, d, m).Kind)
	}
	if want := []decoder.Kind{decoder.KindBegin, decoder.KindInsert, decoder.KindMessage, decoder.KindInsert, decoder.KindCommit}; !slices.Equal(kinds, want) {
		t.Errorf("kinds = %v, want %v", kinds, want)
	}
}

func TestTransaction(t *testing.T) {
	d := outboxDecoder()
	var kinds []decoder.Kind
	for _, m := range [][]byte{
		beginMsg(0x200, 0, 1), outboxRelation(), outboxInsert(), otherRelation(),
		insertMsg(otherID, text("1"), text("2")), outboxInsert(), commitMsg(0x200, 0x230, 0),
	} {
		ev := mustDecode(t, d, m)
		kinds = append(kinds, ev.Kind)
		// The Event is reused: fields of the previous kind must not leak.
		if ev.Kind != decoder.KindInsert && (ev.Values != nil || ev.Tuple != nil) {
			t.Errorf("%v event carries values", ev.Kind)
		}
		if ev.Kind != decoder.KindSkip && ev.SkipReason != "" {
			t.Errorf("%v event carries a skip reason", ev.Kind)
		}
	}
	want := []decoder.Kind{decoder.KindBegin, decoder.KindRelation, decoder.KindInsert, decoder.KindRelation, decoder.KindSkip, decoder.KindInsert, decoder.KindCommit}
	if !slices.Equal(kinds, want) {
		t.Errorf("kinds = %v, want %v", kinds, want)
	}
}

func TestNewCopiesWanted(t *testing.T) {
	wanted := []string{"id", "payload"}
	d := decoder.New(wanted)
	wanted[0] = "changed"
	ev := mustDecode(t, d, relationMsg(1, "public", "outbox", "id", "payload"))
	if !slices.Equal(ev.Relation.Wanted, []int{0, 1}) {
		t.Errorf("Wanted = %v", ev.Relation.Wanted)
	}
}

// validMessages has one valid message of every type, for a primed decoder.
func validMessages() [][]byte {
	row := []decoder.Value{text("1"), text("o"), null, text("e"), {Kind: 'b', Data: []byte{1}}, {Kind: 'u'}, text("t")}
	return [][]byte{
		beginMsg(0x300, 1, 2),
		commitMsg(0x300, 0x330, 1),
		outboxRelation(),
		outboxInsert(),
		insertMsg(otherID, text("1"), text("2")),
		updateMsg(outboxID, 0, nil, row),
		updateMsg(outboxID, 'O', row, row),
		deleteMsg(outboxID, 'K', row...),
		truncateMsg(0, otherID, outboxID),
		typeMsg(),
		originMsg(),
		logicalMsg(),
		outboxMsg(true, 0x1_0000_0300, `{"v":1}`),
	}
}

// TestTruncatedMessages cuts every valid message at every length: each cut
// must be reported as ErrTruncated for that message type, without panicking
// and without changing the decoder.
func TestTruncatedMessages(t *testing.T) {
	for _, m := range validMessages() {
		for n := range len(m) {
			d := primed(t)
			ev, err := d.Decode(m[:n])
			var me *decoder.MessageError
			if ev != nil || !errors.Is(err, decoder.ErrTruncated) || !errors.As(err, &me) {
				t.Errorf("%q[:%d]: got %+v, %v; want ErrTruncated", m, n, ev, err)
				continue
			}
			if n > 0 && (me.Type != m[0] || me.Offset > n) {
				t.Errorf("%q[:%d]: %+v", m, n, me)
			}
			// A cut Relation message must not have replaced the cached one.
			if m[0] == 'R' {
				if ev := mustDecode(t, d, outboxInsert()); ev.Kind != decoder.KindInsert {
					t.Errorf("after cut Relation: %v", ev.Kind)
				}
			}
			if got := d.Skipped(); got != (decoder.SkipCounts{}) {
				t.Errorf("%q[:%d] counted a skip: %+v", m, n, got)
			}
		}
	}
}

func TestTruncatedErrorMessage(t *testing.T) {
	m := outboxInsert()
	_, err := primed(t).Decode(m[:len(m)-5])
	const want = "decoder: Insert message: column value needs 29 bytes, 24 left"
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "message truncated") {
		t.Errorf("err = %v, want it to start with %q", err, want)
	}
}

func TestMalformed(t *testing.T) {
	row := []decoder.Value{text("1"), text("o"), text("a"), text("e"), text("{}"), null, text("t")}
	withRaw := func(m []byte, extra ...byte) []byte { return append(slices.Clip(m), extra...) }
	for _, tc := range []struct {
		name   string
		msg    []byte
		target error
		detail string
	}{
		{"empty", nil, decoder.ErrTruncated, "no message type byte"},
		{"unknown type", []byte("S\x00\x00\x00\x01\x00"), decoder.ErrUnknownMessageType, "protocol version 1"},
		{"insert marker", msg('I').u32(outboxID).u8('K').tuple(row...).bytes(), decoder.ErrMalformed, "new tuple marker is 'K', want 'N'"},
		{"insert column count", insertMsg(outboxID, row[:6]...), decoder.ErrMalformed, "tuple has 6 columns"},
		{"insert too many columns", insertMsg(outboxID, append(slices.Clip(row), null)...), decoder.ErrMalformed, "tuple has 8 columns"},
		{"column kind", msg('I').u32(otherID).u8('N').u16(2).u8('n').u8('x').bytes(), decoder.ErrMalformed, "column kind is 'x'"},
		{"negative column length", msg('I').u32(otherID).u8('N').u16(2).u8('n').u8('t').u32(0xFFFFFFFF).bytes(), decoder.ErrMalformed, "column length is -1"},
		{"insert trailing", withRaw(outboxInsert(), 0), decoder.ErrMalformed, "1 bytes left after the last field"},
		{"begin trailing", withRaw(beginMsg(1, 2, 3), 1, 2), decoder.ErrMalformed, "2 bytes left"},
		{"commit trailing", withRaw(commitMsg(1, 2, 3), 1), decoder.ErrMalformed, "1 bytes left"},
		{"relation trailing", withRaw(outboxRelation(), 0), decoder.ErrMalformed, "1 bytes left"},
		{"update marker", msg('U').u32(outboxID).u8('X').tuple(row...).bytes(), decoder.ErrMalformed, "tuple marker is 'X'"},
		{"update new marker", msg('U').u32(outboxID).u8('O').tuple(row...).u8('O').tuple(row...).bytes(), decoder.ErrMalformed, "new tuple marker is 'O'"},
		{"update old column count", updateMsg(outboxID, 'K', row[:1], row), decoder.ErrMalformed, "tuple has 1 columns"},
		{"delete marker", deleteMsg(outboxID, 'N', row...), decoder.ErrMalformed, "tuple marker is 'N', want 'K' or 'O'"},
		{"truncate count", msg('T').u32(3).u8(0).u32(1).bytes(), decoder.ErrTruncated, "3 relation ids need 12 bytes, 4 left"},
		{"truncate huge count", msg('T').u32(0xFFFFFFFF).u8(0).bytes(), decoder.ErrTruncated, "relation ids need"},
		{"relation huge count", msg('R').u32(9).str("s").str("t").u8('d').u16(0xFFFF).bytes(), decoder.ErrTruncated, "columns needs 655350 bytes, 0 left"},
		{"message negative length", msg('M').u8(0).lsn(1).str("p").u32(0x80000000).bytes(), decoder.ErrMalformed, "content length is -2147483648"},
		{"type unterminated", msg('Y').u32(1).str("public").raw([]byte("mood")).bytes(), decoder.ErrTruncated, "type name has no terminating NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := primed(t).Decode(tc.msg)
			var me *decoder.MessageError
			if ev != nil || !errors.Is(err, tc.target) || !errors.As(err, &me) || !strings.Contains(me.Detail, tc.detail) {
				t.Errorf("got %+v, %v; want %v with %q", ev, err, tc.target, tc.detail)
			}
		})
	}
}

// TestInsertAllocs holds the hot path to zero allocations per message.
func TestInsertAllocs(t *testing.T) {
	d := primed(t)
	m := outboxInsert()
	mustDecode(t, d, m) // grow the reused tuple once
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Decode(Insert) allocates %v times per message, want 0", allocs)
	}
	// Begin, Commit and a skipped insert are on the per-transaction path;
	// hold them to zero too.
	for _, m := range [][]byte{beginMsg(1, 2, 3), commitMsg(1, 2, 3), insertMsg(otherID, text("1"), text("2"))} {
		if allocs := testing.AllocsPerRun(100, func() { _, _ = d.Decode(m) }); allocs != 0 {
			t.Errorf("Decode(%c) allocates %v times per message, want 0", m[0], allocs)
		}
	}
}

func BenchmarkDecodeInsert(b *testing.B) {
	d := primed(b)
	m := outboxInsert()
	b.SetBytes(int64(len(m)))
	b.ReportAllocs()
	for b.Loop() {
		ev, err := d.Decode(m)
		if err != nil || ev.Kind != decoder.KindInsert {
			b.Fatal(ev, err)
		}
	}
}
