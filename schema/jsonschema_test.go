package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const paymentJSONSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "string"},
    "amount": {"type": "integer", "minimum": 0},
    "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}}
  },
  "required": ["id", "amount"],
  "additionalProperties": false,
  "definitions": {
    "line": {"type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}}, "required": ["sku"]}
  }
}`

func TestJSONSchemaValidate(t *testing.T) {
	c, err := compileJSONSchema(paymentJSONSchema)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.validate([]byte(`{"id":"p","amount":3,"lines":[{"sku":"a","quantity":1}]}`)); m != nil {
		t.Errorf("a fitting payload: mismatch at %s: %s", m.path, m.reason)
	}
	for _, tc := range []struct{ payload, path, reason string }{
		{`{"id":"p"}`, "$", "missing property 'amount'"},
		{`{"id":"p","amount":-1}`, "$.amount", "minimum"},
		{`{"id":"p","amount":"1"}`, "$.amount", "want integer"},
		{`{"id":"p","amount":1,"lines":[{"sku":"a"},{"quantity":2}]}`, "$.lines[1]", "missing property 'sku'"},
		{`{"id":"p","amount":1,"lines":[{"sku":"a","quantity":1.5}]}`, "$.lines[0].quantity", "want integer"},
		{`{"id":"p","amount":1,"a b":2}`, "$", "additional properties 'a b'"},
		{`{"id":`, "$", "not JSON"},
	} {
		m := c.validate([]byte(tc.payload))
		if m == nil {
			t.Errorf("%s: valid, want a mismatch at %s", tc.payload, tc.path)
			continue
		}
		if m.path != tc.path || !strings.Contains(m.reason, tc.reason) {
			t.Errorf("%s: mismatch at %s: %s\nwant at %s: ...%s...", tc.payload, m.path, m.reason, tc.path, tc.reason)
		}
	}
}

// TestJSONSchemaLoadsNothing: a $ref outside the schema is an error at
// compile time, not a file read: the schema comes from the registry and
// names nothing on this machine (the file here is a schema that would
// compile).
func TestJSONSchemaLoadsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(path, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := compileJSONSchema(`{"$ref": "file://` + path + `"}`); err == nil {
		t.Errorf("compiled a schema referring to %s", path)
	}
}

// TestJSONSchemaDraft7ByDefault: a schema without $schema is draft-07, as
// Confluent's registry reads it: draft 2020-12's prefixItems is then an
// unknown keyword, and items applies to every element.
func TestJSONSchemaDraft7ByDefault(t *testing.T) {
	c, err := compileJSONSchema(`{"type":"array","items":[{"type":"string"}],"additionalItems":false}`)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.validate([]byte(`["a", 1]`)); m == nil || m.path != "$" {
		t.Errorf("draft-07 additionalItems: %+v, want a mismatch at $", m)
	}
}
