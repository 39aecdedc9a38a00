package schema

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// TestDecodeRoundTrip: what the Encoder wrote, the Decoder reads back into
// JSON of the shapes its doc promises, which the Encoder takes again to the
// same bytes; each schema is fetched once for many values.
func TestDecodeRoundTrip(t *testing.T) {
	fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("pay.avro-value", 1, 21, sr.Schema{Schema: paymentAvro})
	fake.SeedSchema("pay.proto-value", 1, 22, sr.Schema{Schema: paymentProto, Type: sr.TypeProtobuf})
	fake.SeedSchema("pay.json-value", 1, 23, sr.Schema{Schema: paymentJSONSchema, Type: sr.TypeJSON})
	ctx := context.Background()
	for _, tc := range []struct {
		format          Format
		topic, record   string
		payload, want   string
		messageByRecord bool
	}{
		{Avro, "pay.avro", "",
			`{"id":"p-1","amount":1200,"currency":"EUR","note":"hi","at":"2026-12-04T10:30:00.5Z","day":"2026-12-04","price":"12.3","tags":["a"],"attrs":{"x":1},"digest":"ab\u00ffd","payer":{"name":"Ann"},"ref":{"string":"r"}}`,
			`{"id":"p-1","amount":1200,"currency":"EUR","note":"hi","ratio":1.5,"at":"2026-12-04T10:30:00.5Z","day":"2026-12-04","price":"12.30","tags":["a"],"attrs":{"x":1},"digest":"abÿd","payer":{"name":"Ann","iban":null},"ref":"r"}`, false},
		{Protobuf, "pay.proto", "",
			`{"id":"p-1","amount":1200,"currency":"EUR","at":"2026-12-04T10:30:00Z","lines":[{"sku":"a","quantity":2}],"bySku":{"a":{"sku":"a"}}}`,
			`{"id":"p-1","amount":"1200","currency":"EUR","at":"2026-12-04T10:30:00Z","lines":[{"sku":"a","quantity":2}],"bySku":{"a":{"sku":"a"}}}`, false},
		{Protobuf, "pay.proto", "com.example.PaymentCreated.Line", `{"sku":"z","quantity":3}`, `{"sku":"z","quantity":3}`, true},
		{JSONSchema, "pay.json", "", `{"id":"p-1", "amount":1200}`, `{"id":"p-1", "amount":1200}`, false},
	} {
		e := mustEncoder(t, r, Config{Format: tc.format, Refresh: time.Hour, MessageByRecordName: tc.messageByRecord})
		ev := Event{Topic: tc.topic, RecordName: tc.record, Payload: []byte(tc.payload)}
		value, s, err := e.Encode(ctx, ev)
		if err != nil {
			t.Fatalf("%s: encode: %v", tc.format, err)
		}
		d := NewDecoder(r)
		before := c.total()
		for range 50 {
			got, ds, err := d.Decode(ctx, value)
			if err != nil {
				t.Fatalf("%s: decode: %v", tc.format, err)
			}
			if string(got) != tc.want || ds.ID != s.ID || ds.Format != tc.format {
				t.Fatalf("%s: decoded %s by schema %+v\nwant     %s by schema %d", tc.format, got, ds, tc.want, s.ID)
			}
			again, _, err := e.Encode(ctx, Event{Topic: tc.topic, RecordName: tc.record, Payload: got})
			if err != nil || !bytes.Equal(again, value) {
				t.Fatalf("%s: the decoded JSON encodes to %x, %v; want %x", tc.format, again, err, value)
			}
		}
		// The encoder had the schema by id already; the decoder shares it.
		if n := c.total() - before; n != 0 {
			t.Errorf("%s: 50 decodes cost %d registry calls, want 0 (cached by id): %v", tc.format, n, c.get())
		}
	}

	// A decoder of its own registry fetches the id once.
	_, r2, c2, _ := fakeRegistry(t, RegistryConfig{})
	r2.client, r2.url = r.client, r.url
	value, _, _ := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, Event{Topic: "pay.avro",
		Payload: []byte(`{"id":"p","amount":1,"currency":"USD","at":0,"price":1}`)})
	d2 := NewDecoder(r2)
	for range 20 {
		if _, _, err := d2.Decode(ctx, value); err != nil {
			t.Fatal(err)
		}
	}
	if got := c2.get(); got[OpSchemaByID] != 1 || c2.total() != 1 {
		t.Errorf("20 decodes of one schema: %v, want one %s", got, OpSchemaByID)
	}
}

// TestDecodeErrors: each way a record value can be wrong is its own error.
func TestDecodeErrors(t *testing.T) {
	fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("pay.avro-value", 1, 21, sr.Schema{Schema: paymentAvro})
	fake.SeedSchema("pay.proto-value", 1, 22, sr.Schema{Schema: paymentProto, Type: sr.TypeProtobuf})
	fake.SeedSchema("pay.json-value", 1, 23, sr.Schema{Schema: paymentJSONSchema, Type: sr.TypeJSON})
	fake.SeedSchema("refers-value", 1, 24, sr.Schema{Schema: orderV1, References: []sr.SchemaReference{{Name: "x", Subject: "pay.avro-value", Version: 1}}})
	d := NewDecoder(r)
	ctx := context.Background()
	wire := func(id int, index []int, body string) []byte {
		b, err := appendWire(nil, id, index, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	var we *WireError
	for _, v := range [][]byte{[]byte(`{"amount":1}`), {0, 0, 1}, nil} {
		if _, _, err := d.Decode(ctx, v); !errors.As(err, &we) || we.Len != len(v) {
			t.Errorf("%q: %v; want a *WireError", v, err)
		}
	}
	var nf *NotFoundError
	if _, _, err := d.Decode(ctx, wire(99, nil, "x")); !errors.As(err, &nf) || nf.ID != 99 || Retryable(err) {
		t.Errorf("unknown id: %v; want a *NotFoundError for id 99", err)
	}
	var se *SchemaError
	if _, _, err := d.Decode(ctx, wire(24, nil, "x")); !errors.As(err, &se) || se.ID != 24 {
		t.Errorf("unusable schema: %v; want a *SchemaError", err)
	}
	var de *DecodeError
	for name, v := range map[string][]byte{
		"truncated avro":    wire(21, nil, "\x06p-1"),
		"no such message":   wire(22, []int{5}, ""),
		"bad protobuf body": wire(22, []int{0}, "\x0a\xff"),
	} {
		if _, _, err := d.Decode(ctx, v); !errors.As(err, &de) || de.SchemaID == 0 {
			t.Errorf("%s: %v; want a *DecodeError", name, err)
		}
	}
	var me *MismatchError
	if _, _, err := d.Decode(ctx, wire(23, nil, `{"id":"p","amount":-1}`)); !errors.As(err, &me) || me.Path != "$.amount" || me.SchemaID != 23 {
		t.Errorf("a JSON Schema value the schema refuses: %v; want a *MismatchError at $.amount", err)
	}

	fake.Close()
	var re *RegistryError
	if _, _, err := d.Decode(ctx, wire(25, nil, "{}")); !errors.As(err, &re) || !Retryable(err) {
		t.Errorf("registry gone: %v; want a retryable *RegistryError", err)
	}
}
