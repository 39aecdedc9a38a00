package schema

import (
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

const paymentAvro = `{
  "type": "record", "name": "PaymentCreated", "namespace": "com.example",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "amount", "type": "long"},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "ratio", "type": "double", "default": 1.5},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": null},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "attrs", "type": {"type": "map", "values": "int"}, "default": {}},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}, "default": "\u0000\u0000\u0000\u0000"},
    {"name": "payer", "type": ["null", {"type": "record", "name": "Payer", "fields": [
      {"name": "name", "type": "string"},
      {"name": "iban", "type": ["null", "string"], "default": null}
    ]}], "default": null},
    {"name": "ref", "type": ["null", "long", "string"], "default": null}
  ]
}`

func mustAvro(t *testing.T, text string) *avroCodec {
	t.Helper()
	c, err := compileAvro(text)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAvroFromJSON: payloads in the JSON shapes the docs promise are
// encoded by hamba/avro, and decoding the bytes gives the values back.
func TestAvroFromJSON(t *testing.T) {
	c := mustAvro(t, paymentAvro)
	at := time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		payload string
		check   map[string]any // fields of the decoded record
	}{
		{"defaults", `{"id":"p-1","amount":1200,"currency":"EUR","at":` + strconv.FormatInt(at.UnixMilli(), 10) + `,"price":"12.30"}`,
			map[string]any{"id": "p-1", "amount": int64(1200), "currency": "EUR", "note": nil, "ratio": 1.5, "at": at,
				"price": big.NewRat(123, 10), "tags": []any{}, "attrs": map[string]any{}, "digest": [4]byte{}, "payer": nil, "ref": nil}},
		{"natural union values", `{"id":"p-2","amount":-5,"currency":"USD","note":"hi","at":"2026-12-04T10:30:00Z","day":"2026-12-04",
			"price":12.3,"tags":["a","b"],"attrs":{"x":1},"digest":"ab\u00ffc","payer":{"name":"Ann"},"ref":"r-9"}`,
			map[string]any{"note": "hi", "at": at, "day": time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC),
				"tags": []any{"a", "b"}, "attrs": map[string]any{"x": 1}, "digest": [4]byte{'a', 'b', 0xff, 'c'},
				"payer": map[string]any{"name": "Ann", "iban": nil}, "ref": "r-9"}},
		{"Avro JSON encoding of unions", `{"id":"p-3","amount":1,"currency":"EUR","at":0,"price":"0",
			"note":{"string":"x"},"payer":{"com.example.Payer":{"name":"Bo","iban":{"string":"DE1"}}},"ref":{"long":7}}`,
			map[string]any{"note": "x", "payer": map[string]any{"name": "Bo", "iban": "DE1"}, "ref": int64(7)}},
		{"first fitting branch", `{"id":"p-4","amount":1,"currency":"EUR","at":0,"price":"0","ref":7}`,
			map[string]any{"ref": int64(7)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, m := c.encode([]byte(tc.payload))
			if m != nil {
				t.Fatalf("mismatch at %s: %s", m.path, m.reason)
			}
			var got map[string]any
			if err := avro.Unmarshal(c.schema, b, &got); err != nil {
				t.Fatalf("decoding what was encoded: %v", err)
			}
			for k, want := range tc.check {
				g := unwrapUnion(got[k])
				if w, ok := want.(*big.Rat); ok {
					if r, ok := g.(*big.Rat); !ok || r.Cmp(w) != 0 {
						t.Errorf("%s = %v, want %v", k, g, w)
					}
					continue
				}
				if tm, ok := g.(time.Time); ok {
					g = tm.UTC()
				}
				if m, ok := g.(map[string]any); ok {
					for mk, mv := range m {
						m[mk] = unwrapUnion(mv)
					}
				}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("%s = %#v, want %#v", k, g, want)
				}
			}
		})
	}
}

// unwrapUnion takes a union's value out of hamba/avro's decoded form
// ({"type": value}).
func unwrapUnion(v any) any {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, inner := range m {
			if k == "string" || k == "long" || k == "int.date" || strings.Contains(k, ".") {
				return inner
			}
		}
	}
	return v
}

// TestAvroMismatchPath: a payload that does not fit says where (the JSON
// path of the first mismatch, fields in the schema's order) and why.
func TestAvroMismatchPath(t *testing.T) {
	c := mustAvro(t, paymentAvro)
	const ok = `"id":"p","currency":"EUR","at":0,"price":"1"`
	for _, tc := range []struct{ payload, path, reason string }{
		{`{` + ok + `}`, "$.amount", "missing"},
		{`{` + ok + `,"amount":"12"}`, "$.amount", "want long, got a string"},
		{`{` + ok + `,"amount":1.5}`, "$.amount", "an integer"},
		{`{` + ok + `,"amount":99999999999999999999}`, "$.amount", "out of range"},
		{`{"id":"p","amount":1,"currency":"GBP","at":0,"price":"1"}`, "$.currency", `"GBP" is no symbol`},
		{`{` + ok + `,"amount":1,"amuont":2}`, "$.amuont", `no field "amuont"`},
		{`{` + ok + `,"amount":1,"tags":["a",3]}`, "$.tags[1]", "want string, got a number"},
		{`{` + ok + `,"amount":1,"attrs":{"a b":"x"}}`, `$.attrs["a b"]`, "want int"},
		{`{` + ok + `,"amount":1,"payer":{"name":1}}`, "$.payer.name", "want string, got a number"},
		{`{` + ok + `,"amount":1,"payer":{"com.example.Payer":{}}}`, `$.payer["com.example.Payer"].name`, "missing"},
		{`{` + ok + `,"amount":1,"ref":true}`, "$.ref", "fits no branch of union [null, long, string]"},
		{`{"id":"p","amount":1,"currency":"EUR","at":0,"price":"1.234"}`, "$.price", "fractional digits"},
		{`{` + ok + `,"amount":1,"digest":"abc"}`, "$.digest", "3 bytes"},
		{`{` + ok + `,"amount":1,"digest":"ab€c"}`, "$.digest", "no byte"},
		{`{"id":"p","amount":1,"currency":"EUR","at":"yesterday","price":"1"}`, "$.at", "RFC 3339"},
		{`[1]`, "$", "want com.example.PaymentCreated, got an array"},
		{`{"id":`, "$", "not JSON"},
		{`{` + ok + `,"amount":1} {}`, "$", "not one JSON value"},
	} {
		_, m := c.encode([]byte(tc.payload))
		if m == nil {
			t.Errorf("%s: encoded, want a mismatch at %s", tc.payload, tc.path)
			continue
		}
		if m.path != tc.path || !strings.Contains(m.reason, tc.reason) {
			t.Errorf("%s: mismatch at %s: %s\nwant at %s: ...%s...", tc.payload, m.path, m.reason, tc.path, tc.reason)
		}
	}
}

// TestAvroSchemasApart: a schema is read on its own. hamba/avro's default
// parse keeps every named type it met in a package-wide cache, where a
// second schema naming a type it does not define would find another
// subject's type instead of failing; and two versions of one record stay
// two schemas.
func TestAvroSchemasApart(t *testing.T) {
	mustAvro(t, paymentAvro) // defines com.example.Payer
	if _, err := compileAvro(`{"type":"record","name":"Refund","namespace":"com.example","fields":[{"name":"payer","type":"com.example.Payer"}]}`); err == nil {
		t.Error("a schema naming a type it does not define compiled: it found another schema's")
	}
	v1 := mustAvro(t, `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`)
	v2 := mustAvro(t, `{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"string"}]}`)
	if _, m := v1.encode([]byte(`{"a":1}`)); m != nil {
		t.Errorf("v1: %s: %s", m.path, m.reason)
	}
	if _, m := v2.encode([]byte(`{"a":1}`)); m == nil || m.path != "$.b" {
		t.Errorf("v2 without b: %+v, want a mismatch at $.b", m)
	}
}
