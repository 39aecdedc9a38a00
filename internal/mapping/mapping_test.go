package mapping

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func col(oid uint32, s string) Column { return Column{Data: []byte(s), TypeOID: oid} }
func null(oid uint32) Column          { return Column{Null: true, TypeOID: oid} }

var missing = Column{Missing: true}

// defaultRow is a row of the default outbox table.
func defaultRow() map[string]Column {
	return map[string]Column{
		"id":             col(20, "42"),
		"aggregate_type": col(oidText, "order"),
		"aggregate_id":   col(oidText, "o-1"),
		"event_type":     col(oidText, "created"),
		"payload":        col(oidJSONB, `{"a": 1}`),
		"headers":        null(oidJSONB),
		"created_at":     col(oidTimestamptz, "2026-12-01 00:22:33.123456+00"),
	}
}

// colsFor lays row out in m's column order; absent names are missing columns.
func colsFor(m *Mapper, row map[string]Column) []Column {
	cols := make([]Column, len(m.Columns()))
	for i, name := range m.Columns() {
		c, ok := row[name]
		if !ok {
			c = missing
		}
		cols[i] = c
	}
	return cols
}

func mustNew(t testing.TB, cfg Config) *Mapper {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mapRow maps row with the given edits (a nil Column pointer value deletes).
func mapRow(t testing.TB, cfg Config, edit map[string]Column) (*kgo.Record, error) {
	t.Helper()
	m := mustNew(t, cfg)
	row := defaultRow()
	for k, v := range edit {
		row[k] = v
	}
	rec := &kgo.Record{}
	err := m.Map(colsFor(m, row), rec)
	return rec, err
}

// wantBad checks err is a *BadEventError for column whose message contains sub.
func wantBad(t *testing.T, err error, column, sub string) {
	t.Helper()
	var be *BadEventError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want *BadEventError", err)
	}
	if be.Column != column {
		t.Errorf("Column = %q, want %q (%v)", be.Column, column, err)
	}
	if !strings.Contains(err.Error(), sub) {
		t.Errorf("error %q does not contain %q", err, sub)
	}
}

func headerMap(hs []kgo.RecordHeader) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Key+"="+string(h.Value))
	}
	return out
}

func TestMapDefaultRow(t *testing.T) {
	rec, err := mapRow(t, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)
	if rec.Topic != "outbox.event.order" || string(rec.Key) != "o-1" || string(rec.Value) != `{"a": 1}` || !rec.Timestamp.Equal(want) {
		t.Errorf("got topic %q key %q value %q ts %v", rec.Topic, rec.Key, rec.Value, rec.Timestamp)
	}
	if got, want := strings.Join(headerMap(rec.Headers), " "), "id=42 event_type=created aggregate_type=order"; got != want {
		t.Errorf("headers %q, want %q", got, want)
	}
}

func TestNew(t *testing.T) {
	edit := func(f func(*Config)) Config { c := DefaultConfig(); f(&c); return c }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // error substring, "" for success
	}{
		{"default", DefaultConfig(), ""},
		{"literal only", edit(func(c *Config) { c.Topic = "events" }), ""},
		{"empty template", edit(func(c *Config) { c.Topic = "" }), "topic template is empty"},
		{"unclosed", edit(func(c *Config) { c.Topic = "outbox.{aggregate_type" }), `unclosed '{' at offset 7`},
		{"nested", edit(func(c *Config) { c.Topic = "a{b{c}}" }), `unclosed '{' at offset 1`},
		{"unmatched close", edit(func(c *Config) { c.Topic = "a}b" }), `unmatched '}' at offset 1`},
		{"empty placeholder", edit(func(c *Config) { c.Topic = "a.{}" }), `empty placeholder {} at offset 2`},
		{"bad literal char", edit(func(c *Config) { c.Topic = "outbox event.{aggregate_type}" }), `character ' ' at offset 6`},
		{"literal too long", edit(func(c *Config) { c.Topic = strings.Repeat("a", 250) }), "over Kafka's 249-byte"},
		{"literal dot", edit(func(c *Config) { c.Topic = "." }), "does not allow"},
		{"literal dotdot", edit(func(c *Config) { c.Topic = ".." }), "does not allow"},
		{"dot with placeholder ok", edit(func(c *Config) { c.Topic = ".{x}" }), ""},
		{"empty id column", edit(func(c *Config) { c.IDColumn = "" }), `IDColumn is empty; name the outbox table's event id column (default "id")`},
		{"empty created_at column", edit(func(c *Config) { c.CreatedAtColumn = "" }), "CreatedAtColumn is empty"},
		{"zero max header", edit(func(c *Config) { c.MaxHeaderBytes = 0 }), "MaxHeaderBytes is 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestColumns(t *testing.T) {
	def := []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"}
	cfg := DefaultConfig()
	if got := mustNew(t, cfg).Columns(); strings.Join(got, ",") != strings.Join(def, ",") {
		t.Errorf("default Columns() = %q", got)
	}
	cfg.Topic = "{tenant}.{aggregate_type}.{region}.{tenant}"
	want := append(def, "tenant", "region")
	if got := mustNew(t, cfg).Columns(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Columns() = %q, want %q", got, want)
	}
	// A column serving two roles is read once, and serves both.
	cfg = DefaultConfig()
	cfg.AggregateIDColumn = "id"
	m := mustNew(t, cfg)
	if got := m.Columns(); len(got) != 6 || got[0] != "id" {
		t.Errorf("aliased Columns() = %q", got)
	}
	rec := &kgo.Record{}
	if err := m.Map(colsFor(m, defaultRow()), rec); err != nil || string(rec.Key) != "42" {
		t.Errorf("aliased key %q, err %v", rec.Key, err)
	}
}

func TestTopic(t *testing.T) {
	for _, tc := range []struct {
		name, tmpl string
		edit       map[string]Column
		want       string // topic; or, with badCol/bad, the error
		badCol     string
		bad        string
	}{
		{name: "default", tmpl: "outbox.event.{aggregate_type}", want: "outbox.event.order"},
		{name: "literal only", tmpl: "all-events", want: "all-events"},
		{name: "multiple columns", tmpl: "{tenant}.{aggregate_type}_{event_type}-v1",
			edit: map[string]Column{"tenant": col(oidText, "acme")}, want: "acme.order_created-v1"},
		{name: "same column twice", tmpl: "{aggregate_type}.{aggregate_type}", want: "order.order"},
		{name: "non-text column", tmpl: "t.{id}", want: "t.42"},
		{name: "bad char in value", tmpl: "outbox.{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, "order/line")}, badCol: "aggregate_type", bad: `contains '/'`},
		{name: "non-ascii value", tmpl: "outbox.{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, "ordér")}, badCol: "aggregate_type", bad: "Kafka topic names allow only"},
		{name: "blame the right column", tmpl: "{tenant}.{aggregate_type}",
			edit: map[string]Column{"tenant": col(oidText, "acme"), "aggregate_type": col(oidText, "a b")}, badCol: "aggregate_type", bad: `contains ' '`},
		{name: "empty", tmpl: "{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, "")}, badCol: "aggregate_type", bad: "is empty"},
		{name: "dot", tmpl: "{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, ".")}, badCol: "aggregate_type", bad: "does not allow"},
		{name: "dotdot", tmpl: "{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, "..")}, badCol: "aggregate_type", bad: "does not allow"},
		{name: "too long", tmpl: "outbox.event.{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, strings.Repeat("x", 237))}, bad: "would be 250 bytes, over Kafka's 249-byte limit"},
		{name: "exactly 249", tmpl: "outbox.event.{aggregate_type}",
			edit: map[string]Column{"aggregate_type": col(oidText, strings.Repeat("x", 236))}, want: "outbox.event." + strings.Repeat("x", 236)},
		{name: "template column missing", tmpl: "{tenant}.x", badCol: "tenant", bad: "is not a column of the outbox table, but the topic template"},
		{name: "template column null", tmpl: "{tenant}.x",
			edit: map[string]Column{"tenant": null(oidText)}, badCol: "tenant", bad: "is NULL, but the topic template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Topic = tc.tmpl
			rec, err := mapRow(t, cfg, tc.edit)
			if tc.bad != "" {
				wantBad(t, err, tc.badCol, tc.bad)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec.Topic != tc.want {
				t.Errorf("topic %q, want %q", rec.Topic, tc.want)
			}
		})
	}
}

func TestPayload(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload Column
		want    string // value; or the error when bad
		bad     bool
	}{
		{name: "jsonb exact", payload: col(oidJSONB, `{"a": 1, "b": [true, null]}`), want: `{"a": 1, "b": [true, null]}`},
		{name: "json whitespace and escapes kept", payload: col(oidJSON, " {\"k\" :\t\"caf\\u00e9 \\n\"}\n"), want: " {\"k\" :\t\"caf\\u00e9 \\n\"}\n"},
		{name: "jsonb unicode kept", payload: col(oidJSONB, `{"k": "café ☕"}`), want: `{"k": "café ☕"}`},
		{name: "jsonb scalar", payload: col(oidJSONB, `"just a string"`), want: `"just a string"`},
		{name: "jsonb null value", payload: col(oidJSONB, `null`), want: `null`},
		{name: "text valid", payload: col(oidText, `[1,2]`), want: `[1,2]`},
		{name: "varchar valid", payload: col(oidVarchar, `{"x":"y"}`), want: `{"x":"y"}`},
		{name: "text invalid", payload: col(oidText, `{"x":`), want: "is text but not valid JSON", bad: true},
		{name: "text not json", payload: col(oidText, `hello`), want: "is text but not valid JSON", bad: true},
		{name: "text empty", payload: col(oidText, ``), want: "is text but not valid JSON", bad: true},
		{name: "jsonb empty", payload: col(oidJSONB, ``), want: "is empty", bad: true},
		{name: "bytea", payload: col(oidBytea, `\x00ff10Ab`), want: "\x00\xff\x10\xab"},
		{name: "bytea empty", payload: col(oidBytea, `\x`), want: ""},
		{name: "bytea not json is fine", payload: col(oidBytea, `\x7b7b`), want: "{{"},
		{name: "bytea escape format", payload: col(oidBytea, `abc\000`), want: "bytea_output = 'hex'", bad: true},
		{name: "bytea odd", payload: col(oidBytea, `\x0`), want: "odd number of hex digits", bad: true},
		{name: "bytea bad hex", payload: col(oidBytea, `\xzz`), want: "invalid hex", bad: true},
		{name: "other type", payload: col(23, `12`), want: "has type OID 23", bad: true},
		{name: "null", payload: null(oidJSONB), want: "is NULL; every outbox row needs a payload", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := mapRow(t, DefaultConfig(), map[string]Column{"payload": tc.payload})
			if tc.bad {
				wantBad(t, err, "payload", tc.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Value) != tc.want {
				t.Errorf("value %q, want %q", rec.Value, tc.want)
			}
			if rec.Value == nil {
				t.Error("nil value: Kafka would see a tombstone, not an empty payload")
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	fixed := []string{"id=42", "event_type=created", "aggregate_type=order"}
	for _, tc := range []struct {
		name    string
		headers Column
		want    []string // extra headers as key=value; or the error
		bad     string
	}{
		{name: "null", headers: null(oidJSONB)},
		{name: "missing column", headers: missing},
		{name: "empty object", headers: col(oidJSONB, `{}`)},
		{name: "order kept", headers: col(oidJSONB, `{"zeta": "1", "alpha": "2", "mid": "3"}`),
			want: []string{"zeta=1", "alpha=2", "mid=3"}},
		{name: "strings raw", headers: col(oidJSONB, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "q": "say \"hi\"\n", "bs": "a\\b", "u": "caf\u00e9 \ud83d\ude00", "esc": "\u00e9\/"}`),
			want: []string{"traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "q=say \"hi\"\n", `bs=a\b`, "u=café 😀", "esc=é/"}},
		{name: "escaped surrogate pair", headers: col(oidJSON, `{"e": "\ud83d\ude00"}`), want: []string{"e=😀"}},
		{name: "other values as JSON text", headers: col(oidJSONB, `{"n": 1.50, "big": 12345678901234567890, "o": {"a": [1, "}"]}, "a": [], "t": true, "f": false, "z": null}`),
			want: []string{"n=1.50", "big=12345678901234567890", `o={"a": [1, "}"]}`, "a=[]", "t=true", "f=false", "z=null"}},
		{name: "json whitespace", headers: col(oidJSON, " {\n \"a\" : 1 ,\"b\":\"x\"\t}\n"), want: []string{"a=1", "b=x"}},
		{name: "escaped key", headers: col(oidJSONB, `{"k\u00e9y": "v"}`), want: []string{"kéy=v"}},
		{name: "duplicate keys kept", headers: col(oidJSON, `{"a": "1", "a": "2"}`), want: []string{"a=1", "a=2"}},
		{name: "empty string", headers: col(oidJSONB, `{"a": ""}`), want: []string{"a="}},
		{name: "text column", headers: col(oidText, `{"a":"b"}`), want: []string{"a=b"}},
		{name: "array", headers: col(oidJSONB, `["a"]`), bad: "is not a JSON object"},
		{name: "string", headers: col(oidJSONB, `"a"`), bad: "is not a JSON object"},
		{name: "json null", headers: col(oidJSONB, `null`), bad: "is not a JSON object"},
		{name: "invalid json", headers: col(oidText, `{"a":}`), bad: "is not valid JSON"},
		{name: "trailing garbage", headers: col(oidText, `{"a":1} x`), bad: "is not valid JSON"},
		{name: "invalid utf8", headers: col(oidText, "{\"a\":\"\xff\"}"), bad: "not valid UTF-8"},
		{name: "lone high surrogate", headers: col(oidJSON, `{"a":"\ud83d"}`), bad: "lone surrogate"},
		{name: "lone low surrogate", headers: col(oidJSON, `{"a":"\ude00x"}`), bad: "lone surrogate"},
		{name: "surrogate in key", headers: col(oidJSON, `{"\ud83dx":"a"}`), bad: "lone surrogate"},
		{name: "oversize", headers: col(oidJSONB, `{"big": "`+strings.Repeat("x", 65537)+`"}`), bad: `header "big" is 65537 bytes, over the 65536-byte header limit`},
		{name: "oversize object", headers: col(oidJSONB, `{"big": [`+strings.Repeat("1,", 40000)+`1]}`), bad: `header "big" is 80003 bytes`},
		{name: "exactly at limit", headers: col(oidJSONB, `{"big": "`+strings.Repeat("x", 65536)+`"}`), want: []string{"big=" + strings.Repeat("x", 65536)}},
		{name: "limit counts unescaped bytes", headers: col(oidJSONB, `{"big": "`+strings.Repeat(`\n`, 65536)+`"}`), want: []string{"big=" + strings.Repeat("\n", 65536)}},
		{name: "oversize key", headers: col(oidJSONB, `{"`+strings.Repeat("k", 65537)+`": 1}`), bad: "65537-byte key"},
		{name: "wrong type", headers: col(23, `1`), bad: "has type OID 23"},
		{name: "reserved id", headers: col(oidJSONB, `{"a": "1", "id": "x"}`), bad: `has key "id", a header cdc-outbox sets itself`},
		{name: "reserved event_type", headers: col(oidJSONB, `{"event_type": "y"}`), bad: `has key "event_type"`},
		{name: "reserved aggregate_type", headers: col(oidJSON, `{"aggregate_type": 1}`), bad: `has key "aggregate_type"`},
		{name: "reserved key escaped", headers: col(oidJSON, `{"\u0069d": "x"}`), bad: `has key "id"`},
		{name: "reserved keys are case-sensitive", headers: col(oidJSONB, `{"ID": "x", "Event_Type": "y"}`), want: []string{"ID=x", "Event_Type=y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := mapRow(t, DefaultConfig(), map[string]Column{"headers": tc.headers})
			if tc.bad != "" {
				wantBad(t, err, "headers", tc.bad)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, want := headerMap(rec.Headers), append(fixed, tc.want...)
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Errorf("headers %q, want %q", got, want)
			}
		})
	}
}

func TestFixedHeaderLimits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHeaderBytes = 8
	_, err := mapRow(t, cfg, map[string]Column{"event_type": col(oidText, "123456789")})
	wantBad(t, err, "event_type", "is 9 bytes, over the 8-byte header limit")
	_, err = mapRow(t, cfg, map[string]Column{"id": col(oidText, "a\xffb")})
	wantBad(t, err, "id", "not valid UTF-8")
	_, err = mapRow(t, cfg, map[string]Column{"aggregate_type": col(oidText, "\xc3")})
	wantBad(t, err, "aggregate_type", "not valid UTF-8")
}

func TestMapTimestamp(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Column
		want time.Time // zero: no timestamp
		bad  string
	}{
		{name: "micro utc", c: col(oidTimestamptz, "2026-12-01 00:22:33.123456+00"), want: time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)},
		{name: "half hour offset", c: col(oidTimestamptz, "2026-12-01 00:22:33+05:30"), want: time.Date(2026, 11, 30, 18, 52, 33, 0, time.UTC)},
		{name: "negative offset short fraction", c: col(oidTimestamptz, "2026-12-01 00:22:33.5-08"), want: time.Date(2026, 12, 1, 8, 22, 33, 500000000, time.UTC)},
		{name: "timestamp without tz is utc", c: col(oidTimestamp, "2026-12-01 00:22:33.123456"), want: time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)},
		{name: "null", c: null(oidTimestamptz)},
		{name: "missing", c: missing},
		{name: "infinity", c: col(oidTimestamptz, "infinity"), bad: "is infinity"},
		{name: "-infinity", c: col(oidTimestamp, "-infinity"), bad: "is -infinity"},
		{name: "sql datestyle", c: col(oidTimestamptz, "12/01/2026 00:22:33.123456 UTC"), bad: "DateStyle ISO"},
		{name: "tz missing offset", c: col(oidTimestamptz, "2026-12-01 00:22:33"), bad: "ISO output of a timestamptz"},
		{name: "timestamp with offset", c: col(oidTimestamp, "2026-12-01 00:22:33+00"), bad: "ISO output of a timestamp;"},
		{name: "wrong type", c: col(oidText, "2026-12-01 00:22:33+00"), bad: "has type OID 25"},
		{name: "epoch", c: col(oidTimestamptz, "1970-01-01 00:00:00+00"), want: time.Unix(0, 0)},
		{name: "before epoch", c: col(oidTimestamptz, "1969-12-31 23:59:59.999+00"), bad: "before 1970-01-01"},
		{name: "year 1", c: col(oidTimestamp, "0001-01-01 00:00:00"), bad: "before 1970-01-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := mapRow(t, DefaultConfig(), map[string]Column{"created_at": tc.c})
			if tc.bad != "" {
				wantBad(t, err, "created_at", tc.bad)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !rec.Timestamp.Equal(tc.want) || rec.Timestamp.IsZero() != tc.want.IsZero() {
				t.Errorf("timestamp %v, want %v", rec.Timestamp, tc.want)
			}
		})
	}
}

func TestRequiredColumns(t *testing.T) {
	for _, name := range []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"} {
		t.Run(name+" null", func(t *testing.T) {
			_, err := mapRow(t, DefaultConfig(), map[string]Column{name: null(oidText)})
			wantBad(t, err, name, "is NULL; every outbox row needs")
		})
		t.Run(name+" missing", func(t *testing.T) {
			_, err := mapRow(t, DefaultConfig(), map[string]Column{name: missing})
			wantBad(t, err, name, "is not a column of the outbox table; check the column flags")
		})
	}
	_, err := mapRow(t, DefaultConfig(), map[string]Column{"aggregate_id": col(oidText, "")})
	wantBad(t, err, "aggregate_id", "is empty; every outbox row needs an aggregate id (it is the Kafka key)")
	_, err = mapRow(t, DefaultConfig(), map[string]Column{"aggregate_id": col(oidText, "o-\xff")})
	wantBad(t, err, "aggregate_id", "not valid UTF-8")

	m := mustNew(t, DefaultConfig())
	if err := m.Map(make([]Column, 3), &kgo.Record{}); err == nil || errors.As(err, new(*BadEventError)) {
		t.Errorf("wrong column count: err = %v, want a plain error", err)
	}
}

func TestBadEventError(t *testing.T) {
	_, err := mapRow(t, DefaultConfig(), map[string]Column{"aggregate_id": null(oidText)})
	const want = `event 42: column "aggregate_id": is NULL; every outbox row needs an aggregate id (it is the Kafka key)`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	_, err = mapRow(t, DefaultConfig(), map[string]Column{"id": null(20)})
	if err == nil || !strings.HasPrefix(err.Error(), `event with unknown id: column "id": is NULL`) {
		t.Errorf("got %v", err)
	}
	e := &BadEventError{EventID: "a b\n", Reason: "r"}
	if got := e.Error(); got != `event "a b\n": r` {
		t.Errorf("got %s", got)
	}
	m := mustNew(t, DefaultConfig())
	if id := m.EventID(colsFor(m, defaultRow())); id != "42" {
		t.Errorf("EventID = %q", id)
	}
	if id := m.EventID(colsFor(m, map[string]Column{})); id != "" {
		t.Errorf("EventID of missing = %q", id)
	}
}

// TestMapCopies checks that the record shares no memory with the column
// buffers, which the replication reader reuses.
func TestMapCopies(t *testing.T) {
	m := mustNew(t, DefaultConfig())
	row := defaultRow()
	row["headers"] = col(oidJSONB, `{"tenant": "acme", "n": 7}`)
	cols := colsFor(m, row)
	var rec kgo.Record
	if err := m.Map(cols, &rec); err != nil {
		t.Fatal(err)
	}
	snap := func() string {
		return rec.Topic + "|" + string(rec.Key) + "|" + string(rec.Value) + "|" + strings.Join(headerMap(rec.Headers), "|")
	}
	before := snap()
	for _, c := range cols {
		for i := range c.Data {
			c.Data[i] = '#'
		}
	}
	if after := snap(); after != before {
		t.Errorf("record changed with its input:\nbefore %s\nafter  %s", before, after)
	}
	// Fields are capped: growing one must not overwrite the next.
	_ = append(rec.Key, "XXXXXXXX"...)
	_ = append(rec.Headers[0].Value, "XXXXXXXX"...)
	if after := snap(); after != before {
		t.Errorf("appending to a field changed another:\nbefore %s\nafter  %s", before, after)
	}
}

func TestMapOverwritesRecord(t *testing.T) {
	m := mustNew(t, DefaultConfig())
	rec := &kgo.Record{
		Topic: "old", Key: []byte("old"), Partition: 7, Offset: 9,
		Headers:   []kgo.RecordHeader{{Key: "stale"}},
		Timestamp: time.Unix(1, 0),
	}
	row := defaultRow()
	row["created_at"] = null(oidTimestamptz)
	if err := m.Map(colsFor(m, row), rec); err != nil {
		t.Fatal(err)
	}
	if rec.Partition != 0 || rec.Offset != 0 || !rec.Timestamp.IsZero() || len(rec.Headers) != 3 || rec.Headers[0].Key != "id" {
		t.Errorf("stale fields left: %+v", rec)
	}
}

func TestConcurrentMap(t *testing.T) {
	m := mustNew(t, DefaultConfig())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				row := defaultRow()
				at := string(rune('a'+g)) + string(rune('a'+i%26))
				row["aggregate_type"] = col(oidText, at)
				row["headers"] = col(oidJSONB, `{"k`+at+`": 1}`)
				var rec kgo.Record
				if err := m.Map(colsFor(m, row), &rec); err != nil {
					t.Error(err)
					return
				}
				if rec.Topic != "outbox.event."+at || rec.Headers[3].Key != "k"+at {
					t.Errorf("got %q %q", rec.Topic, rec.Headers[3].Key)
				}
			}
		})
	}
	wg.Wait()
}

func TestInternCacheBounded(t *testing.T) {
	var c internCache
	for i := range maxInterned + 100 {
		b := []byte{byte(i), byte(i >> 8)}
		if s := c.get(b); s != string(b) {
			t.Fatalf("get(%q) = %q", b, s)
		}
	}
	if n := len(*c.m.Load()); n != maxInterned {
		t.Errorf("cache holds %d, want %d", n, maxInterned)
	}
	if s := c.get([]byte{0, 0}); s != "\x00\x00" {
		t.Errorf("cached get = %q", s)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		``:                   ``,
		`plain`:              `plain`,
		`\"\\\/\b\f\n\r\t`:   "\"\\/\b\f\n\r\t",
		`\u0041\u00e9\u20ac`: "Aé€",
		`\uD83D\uDE00!`:      "😀!",
		`a\u0000b`:           "a\x00b",
	} {
		n, ok := unescapedLen([]byte(in))
		got := appendUnescaped([]byte("pre"), []byte(in))
		if !ok || n != len(want) || !bytes.Equal(got, []byte("pre"+want)) {
			t.Errorf("%s: got %q (len %d, ok %v), want %q", in, got, n, ok, want)
		}
	}
	for _, in := range []string{`\ud800`, `\udc00`, `\ud800\u0041`, `\ud800x`, `\x`, `\u12`, `\`, `\u12g4`} {
		if _, ok := unescapedLen([]byte(in)); ok {
			t.Errorf("%s: accepted", in)
		}
	}
}
