package schema

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"time"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// maxMessageIndexes bounds the Protobuf message indexes of a header: a
// message nested deeper than this is not one a registry serves, and the
// bound keeps a corrupt header from asking for a huge slice.
const maxMessageIndexes = 64

// Decoder reads record values in the Confluent wire format back into JSON,
// by the schema whose id each value's header names: the consumer's half of
// the Encoder. A schema is fetched by id once and kept (Registry), so a
// stream of values costs one request per schema, not per value.
type Decoder struct {
	registry *Registry
}

// NewDecoder makes a Decoder over the registry's cache.
func NewDecoder(registry *Registry) *Decoder { return &Decoder{registry: registry} }

// Decode reads value, a record value in the Confluent wire format, and
// returns it as JSON with the schema it was written by (its ID and
// Format; Subject and Version are not in the wire format and stay empty).
//
// The JSON is the shape the Encoder reads, so a payload encoded and
// decoded again means what it meant: Avro records as objects in the
// schema's field order, a union's value as the value of its branch (null
// for null), bytes and fixed as strings of one character per byte,
// timestamps as RFC 3339 strings, dates as "2006-01-02", time-millis and
// time-micros as numbers, decimals as exact decimal strings; Protobuf as
// protojson writes the message (lowerCamelCase names, 64-bit integers as
// strings, unset fields left out); JSON Schema values as they are, once
// the schema accepted them.
//
// Its errors: *WireError (value is not in the wire format), *NotFoundError
// (no schema with the id), *SchemaError (the schema cannot be used),
// *DecodeError (the bytes do not decode by the schema), *MismatchError (a
// JSON Schema value the schema refuses), *RegistryError (Retryable says
// whether waiting may help).
func (d *Decoder) Decode(ctx context.Context, value []byte) ([]byte, Schema, error) {
	id, body, err := header.DecodeID(value)
	if err != nil {
		return nil, Schema{}, &WireError{Len: len(value), Err: err}
	}
	s := Schema{ID: id}
	c, err := d.registry.schemaByID(ctx, id)
	if err != nil {
		return nil, s, err
	}
	s.Format = c.format
	if c.err != nil {
		return nil, s, c.err
	}
	var out []byte
	switch c.format {
	case Avro:
		out, err = c.avro.decode(body)
	case Protobuf:
		out, err = c.proto.decode(body)
	case JSONSchema:
		if m := c.json.validate(body); m != nil {
			return nil, s, &MismatchError{SchemaID: id, Format: JSONSchema, Path: m.path, Reason: m.reason}
		}
		out = body
	}
	if err != nil {
		return nil, s, &DecodeError{SchemaID: id, Format: c.format, Err: err}
	}
	return out, s, nil
}

// decode reads Avro binary by the codec's schema into JSON.
func (c *avroCodec) decode(body []byte) ([]byte, error) {
	r := avro.NewReader(nil, 0).Reset(body)
	v := r.ReadNext(c.schema)
	if r.Error != nil {
		return nil, r.Error
	}
	j, err := avroJSON(c.schema, v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(j)
}

// avroJSON turns a value hamba/avro's Reader.ReadNext read by s into the
// JSON the Encoder reads (see Decoder.Decode).
func avroJSON(s avro.Schema, v any) (any, error) {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	logical := avroLogical(s)
	switch s.Type() {
	case avro.Union:
		if v == nil {
			return nil, nil
		}
		// ReadNext gives a branch's value as {branch name: value}.
		m, ok := v.(map[string]any)
		if !ok || len(m) != 1 {
			return nil, fmt.Errorf("union %s: unexpected value %T", avroTypeName(s), v)
		}
		for name, inner := range m {
			for _, b := range s.(*avro.UnionSchema).Types() {
				if avroBranchName(b) == name {
					return avroJSON(b, inner)
				}
			}
			return nil, fmt.Errorf("union %s has no branch %q", avroTypeName(s), name)
		}
	case avro.Record:
		m, _ := v.(map[string]any)
		fields := s.(*avro.RecordSchema).Fields()
		obj := make(orderedObject, len(fields))
		for i, f := range fields {
			fv, err := avroJSON(f.Type(), m[f.Name()])
			if err != nil {
				return nil, err
			}
			obj[i] = member{f.Name(), fv}
		}
		return obj, nil
	case avro.Array:
		items, _ := v.([]any)
		out := make([]any, len(items))
		for i, item := range items {
			var err error
			if out[i], err = avroJSON(s.(*avro.ArraySchema).Items(), item); err != nil {
				return nil, err
			}
		}
		return out, nil
	case avro.Map:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for k, item := range m {
			var err error
			if out[k], err = avroJSON(s.(*avro.MapSchema).Values(), item); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	switch x := v.(type) {
	case time.Time:
		if logical == avro.Date {
			return x.UTC().Format(time.DateOnly), nil
		}
		return x.UTC().Format(time.RFC3339Nano), nil
	case time.Duration:
		if logical == avro.TimeMillis {
			return x.Milliseconds(), nil
		}
		return x.Microseconds(), nil
	case int64:
		// ReadNext leaves local timestamps as their number.
		switch logical {
		case avro.LocalTimestampMillis:
			return time.UnixMilli(x).UTC().Format(time.RFC3339Nano), nil
		case avro.LocalTimestampMicros:
			return time.UnixMicro(x).UTC().Format(time.RFC3339Nano), nil
		}
		return x, nil
	case *big.Rat:
		return x.FloatString(s.(avro.LogicalTypeSchema).Logical().(*avro.DecimalLogicalSchema).Scale()), nil
	case []byte:
		return avroBytesJSON(x), nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 {
		b := make([]byte, rv.Len()) // a fixed, as a byte array of its size
		reflect.Copy(reflect.ValueOf(b), rv)
		return avroBytesJSON(b), nil
	}
	return v, nil // null, boolean, int, float, double, string, enum
}

// avroBytesJSON is bytes in Avro's JSON encoding: one character per byte.
func avroBytesJSON(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

// orderedObject is a JSON object whose members keep their order (a
// record's fields in the schema's order; encoding/json sorts a map's).
type orderedObject []member

type member struct {
	key   string
	value any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(m.key)
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// decode reads a Protobuf value (message indexes, then the message) into
// protojson's JSON.
func (c *protoCodec) decode(body []byte) ([]byte, error) {
	index, rest, err := header.DecodeIndex(body, maxMessageIndexes)
	if err != nil {
		return nil, fmt.Errorf("message indexes: %w", err)
	}
	md, err := c.messageAt(index)
	if err != nil {
		return nil, err
	}
	msg := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(rest, msg); err != nil {
		return nil, fmt.Errorf("message %s: %s", md.FullName(), protoReason(err))
	}
	out, err := protojson.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("message %s: %s", md.FullName(), protoReason(err))
	}
	// protojson varies its whitespace on purpose; compact it, so that the
	// same message is always the same bytes.
	var b bytes.Buffer
	if err := json.Compact(&b, out); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// messageAt is the message the wire format's indexes name: messageIndex
// read backwards.
func (c *protoCodec) messageAt(index []int) (protoreflect.MessageDescriptor, error) {
	if len(index) == 0 {
		return nil, errors.New("no message index")
	}
	ms := c.file.Messages()
	var md protoreflect.MessageDescriptor
	for depth, i := range index {
		if i < 0 || i >= ms.Len() {
			return nil, fmt.Errorf("message index %v: no message %d at depth %d (%d there)", index, i, depth, ms.Len())
		}
		md = ms.Get(i)
		ms = md.Messages()
	}
	return md, nil
}
