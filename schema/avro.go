package schema

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// avroCodec encodes JSON payloads by one Avro schema. The payload's JSON
// is read by the schema into the Go values hamba/avro encodes (records and
// maps as map[string]any, a union's value as map[string]any{branch: v}),
// so every mismatch is found with its JSON path before any byte is
// written; hamba/avro does the binary encoding.
//
// The JSON shape: a record is an object with a member per field (a field
// with a default may be left out; a member that is no field is a
// mismatch, so a misspelt field is not dropped); int and long are integral
// numbers in range; float and double numbers; string, enum (one of its
// symbols) strings; bytes and fixed strings in Avro's JSON encoding (each
// character one byte, U+0000 to U+00FF); arrays and maps JSON arrays and
// objects. A union takes null for its null branch and otherwise a value of
// its first branch the value fits, or, as in Avro's JSON encoding, an
// object of one member named after the branch ({"string": "x"},
// {"com.example.Address": {...}}). Logical types take their underlying
// type's JSON, and also: timestamps (millis, micros, local) an RFC 3339
// string, a date a "2006-01-02" string, a decimal a number or a decimal
// string (exact; more digits than its scale is a mismatch).
type avroCodec struct {
	schema avro.Schema
}

func compileAvro(text string) (*avroCodec, error) {
	// A cache of its own per schema: hamba/avro's default one is shared by
	// the whole process and keyed by full name, so a schema naming a type
	// it does not define would find another subject's type there.
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	return &avroCodec{schema: s}, nil
}

func (c *avroCodec) encode(payload []byte) ([]byte, *mismatch) {
	v, m := decodeJSON(payload)
	if m != nil {
		return nil, m
	}
	native, m := avroValue(c.schema, v, "$")
	if m != nil {
		return nil, m
	}
	b, err := avro.Marshal(c.schema, native)
	if err != nil {
		// avroValue produced only values the schema takes; hamba/avro
		// refusing one is a gap in avroValue, reported as a mismatch of
		// the whole so that the event is not lost silently.
		return nil, &mismatch{"$", "avro encoding: " + err.Error()}
	}
	return b, nil
}

// avroValue reads the decoded JSON v at path by schema s.
func avroValue(s avro.Schema, v any, path string) (any, *mismatch) {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	want := func() *mismatch {
		return &mismatch{path, fmt.Sprintf("want %s, got %s", avroTypeName(s), jsonKind(v))}
	}
	logical := avroLogical(s)
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, want()
		}
		return nil, nil
	case avro.Boolean:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, want()
	case avro.Int:
		if str, ok := v.(string); ok && logical == avro.Date {
			t, err := time.Parse(time.DateOnly, str)
			if err != nil {
				return nil, &mismatch{path, fmt.Sprintf("want a date (2006-01-02): %v", err)}
			}
			return int32(t.Unix() / 86400), nil
		}
		n, m := integer(v, path, math.MinInt32, math.MaxInt32, "int")
		if m != nil {
			return nil, m
		}
		if logical == avro.TimeMillis {
			return time.Duration(n) * time.Millisecond, nil
		}
		return int32(n), nil
	case avro.Long:
		if str, ok := v.(string); ok && isTimestamp(logical) {
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil {
				return nil, &mismatch{path, fmt.Sprintf("want a timestamp (RFC 3339) or a number: %v", err)}
			}
			return t, nil
		}
		n, m := integer(v, path, math.MinInt64, math.MaxInt64, "long")
		if m != nil {
			return nil, m
		}
		if logical == avro.TimeMicros {
			return time.Duration(n) * time.Microsecond, nil
		}
		return n, nil
	case avro.Float, avro.Double:
		num, ok := v.(json.Number)
		if !ok {
			return nil, want()
		}
		f, err := num.Float64()
		if err != nil {
			return nil, &mismatch{path, fmt.Sprintf("%s is out of range of %s", num, s.Type())}
		}
		if s.Type() == avro.Float {
			if math.Abs(f) > math.MaxFloat32 {
				return nil, &mismatch{path, fmt.Sprintf("%s is out of range of float", num)}
			}
			return float32(f), nil
		}
		return f, nil
	case avro.String:
		if str, ok := v.(string); ok {
			return str, nil
		}
		return nil, want()
	case avro.Bytes:
		if logical == avro.Decimal {
			return decimal(s, v, path)
		}
		return avroBytes(v, path, -1)
	case avro.Fixed:
		if logical == avro.Decimal {
			return decimal(s, v, path)
		}
		size := s.(*avro.FixedSchema).Size()
		b, m := avroBytes(v, path, size)
		if m != nil {
			return nil, m
		}
		// hamba/avro encodes a fixed from a byte array of its size.
		arr := reflect.New(reflect.ArrayOf(size, reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	case avro.Enum:
		str, ok := v.(string)
		if !ok {
			return nil, want()
		}
		if !slices.Contains(s.(*avro.EnumSchema).Symbols(), str) {
			return nil, &mismatch{path, fmt.Sprintf("%q is no symbol of enum %s (%s)", str, avroTypeName(s), strings.Join(s.(*avro.EnumSchema).Symbols(), ", "))}
		}
		return str, nil
	case avro.Array:
		items, ok := v.([]any)
		if !ok {
			return nil, want()
		}
		out := make([]any, len(items))
		for i, item := range items {
			var m *mismatch
			if out[i], m = avroValue(s.(*avro.ArraySchema).Items(), item, element(path, i)); m != nil {
				return nil, m
			}
		}
		return out, nil
	case avro.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, want()
		}
		out := make(map[string]any, len(obj))
		for _, k := range sortedKeys(obj) {
			var m *mismatch
			if out[k], m = avroValue(s.(*avro.MapSchema).Values(), obj[k], field(path, k)); m != nil {
				return nil, m
			}
		}
		return out, nil
	case avro.Record:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, want()
		}
		rec := s.(*avro.RecordSchema)
		out := make(map[string]any, len(rec.Fields()))
		for _, f := range rec.Fields() {
			fv, present := obj[f.Name()]
			if !present {
				if !f.HasDefault() {
					return nil, &mismatch{field(path, f.Name()), fmt.Sprintf("missing: field %q of record %s has no default", f.Name(), rec.FullName())}
				}
				continue // hamba/avro writes the default
			}
			var m *mismatch
			if out[f.Name()], m = avroValue(f.Type(), fv, field(path, f.Name())); m != nil {
				return nil, m
			}
		}
		for _, k := range sortedKeys(obj) {
			if !slices.ContainsFunc(rec.Fields(), func(f *avro.Field) bool { return f.Name() == k }) {
				return nil, &mismatch{field(path, k), fmt.Sprintf("no field %q in record %s", k, rec.FullName())}
			}
		}
		return out, nil
	case avro.Union:
		return avroUnion(s.(*avro.UnionSchema), v, path)
	}
	return nil, &mismatch{path, fmt.Sprintf("avro type %s is not supported", s.Type())}
}

// avroUnion picks the union's branch for v: the null branch for null; the
// branch an object of one member names (Avro's JSON encoding); else the
// first branch v fits. hamba/avro takes the choice as a one-entry map
// keyed by the branch's name.
func avroUnion(u *avro.UnionSchema, v any, path string) (any, *mismatch) {
	branches := u.Types()
	if v == nil {
		if u.Nullable() || slices.ContainsFunc(branches, func(b avro.Schema) bool { return b.Type() == avro.Null }) {
			return map[string]any{"null": nil}, nil
		}
		return nil, &mismatch{path, fmt.Sprintf("null, but union %s has no null", avroTypeName(u))}
	}
	if obj, ok := v.(map[string]any); ok && len(obj) == 1 {
		for k, inner := range obj {
			for _, b := range branches {
				if k == avroBranchName(b) || k == string(b.Type()) && avroLogical(b) != "" {
					val, m := avroValue(b, inner, field(path, k))
					if m != nil {
						return nil, m
					}
					return map[string]any{avroBranchName(b): val}, nil
				}
			}
		}
	}
	var nonNull []avro.Schema
	for _, b := range branches {
		if b.Type() != avro.Null {
			nonNull = append(nonNull, b)
		}
	}
	var first *mismatch
	for _, b := range nonNull {
		val, m := avroValue(b, v, path)
		if m == nil {
			return map[string]any{avroBranchName(b): val}, nil
		}
		if first == nil {
			first = m
		}
	}
	if len(nonNull) == 1 {
		// A nullable type: its own mismatch says more than the union's.
		return nil, first
	}
	return nil, &mismatch{path, fmt.Sprintf("%s fits no branch of union %s", jsonKind(v), avroTypeName(u))}
}

// avroBranchName is the name hamba/avro knows a union branch by: the full
// name of a named type, else the type with its logical type
// ("long.timestamp-millis").
func avroBranchName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema().FullName()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if lt := avroLogical(s); lt != "" {
		return string(s.Type()) + "." + string(lt)
	}
	return string(s.Type())
}

func avroTypeName(s avro.Schema) string {
	if u, ok := s.(*avro.UnionSchema); ok {
		names := make([]string, len(u.Types()))
		for i, b := range u.Types() {
			names[i] = avroTypeName(b)
		}
		return "[" + strings.Join(names, ", ") + "]"
	}
	return avroBranchName(s)
}

func avroLogical(s avro.Schema) avro.LogicalType {
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return l.Logical().Type()
	}
	return ""
}

func isTimestamp(lt avro.LogicalType) bool {
	switch lt {
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		return true
	}
	return false
}

// integer reads an integral JSON number within [lo, hi].
func integer(v any, path string, lo, hi int64, typ string) (int64, *mismatch) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, &mismatch{path, fmt.Sprintf("want %s, got %s", typ, jsonKind(v))}
	}
	n, err := num.Int64()
	if err != nil {
		if _, ferr := num.Float64(); ferr == nil && !strings.ContainsAny(num.String(), ".eE") {
			return 0, &mismatch{path, fmt.Sprintf("%s is out of range of %s", num, typ)}
		}
		return 0, &mismatch{path, fmt.Sprintf("want %s (an integer), got %s", typ, num)}
	}
	if n < lo || n > hi {
		return 0, &mismatch{path, fmt.Sprintf("%s is out of range of %s", num, typ)}
	}
	return n, nil
}

// avroBytes reads bytes in Avro's JSON encoding: a string whose characters
// are the bytes, U+0000 to U+00FF. size >= 0 is a fixed's size.
func avroBytes(v any, path string, size int) ([]byte, *mismatch) {
	str, ok := v.(string)
	if !ok {
		return nil, &mismatch{path, fmt.Sprintf("want bytes (a string of characters U+0000 to U+00FF), got %s", jsonKind(v))}
	}
	b := make([]byte, 0, len(str))
	for _, r := range str {
		if r > 0xff {
			return nil, &mismatch{path, fmt.Sprintf("character %q is no byte: bytes are written one character per byte, U+0000 to U+00FF", r)}
		}
		b = append(b, byte(r))
	}
	if size >= 0 && len(b) != size {
		return nil, &mismatch{path, fmt.Sprintf("%d bytes, but the fixed type holds %d", len(b), size)}
	}
	return b, nil
}

// decimal reads a decimal logical value, a number or a decimal string,
// exactly: a value with more fractional digits than the scale would be
// rounded, so it is a mismatch.
func decimal(s avro.Schema, v any, path string) (any, *mismatch) {
	var text string
	switch x := v.(type) {
	case json.Number:
		text = x.String()
	case string:
		text = x
	default:
		return nil, &mismatch{path, fmt.Sprintf("want a decimal (a number or a decimal string), got %s", jsonKind(v))}
	}
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, &mismatch{path, fmt.Sprintf("%q is no decimal", text)}
	}
	dec := s.(avro.LogicalTypeSchema).Logical().(*avro.DecimalLogicalSchema)
	scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(dec.Scale())), nil)))
	if !scaled.IsInt() {
		return nil, &mismatch{path, fmt.Sprintf("%s has more than %d fractional digits (the decimal's scale)", text, dec.Scale())}
	}
	if digits := len(strings.TrimPrefix(scaled.Num().String(), "-")); digits > dec.Precision() {
		return nil, &mismatch{path, fmt.Sprintf("%s has more than %d digits (the decimal's precision)", text, dec.Precision())}
	}
	return r, nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
