package schema

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

const paymentProto = `syntax = "proto3";
package com.example;

import "google/protobuf/timestamp.proto";

message PaymentCreated {
  string id = 1;
  int64 amount = 2;
  Currency currency = 3;
  google.protobuf.Timestamp at = 4;
  repeated Line lines = 5;
  map<string, Line> by_sku = 6;
  optional string note = 7;

  message Line {
    string sku = 1;
    int32 quantity = 2;
  }
}

message PaymentRefunded {
  string id = 1;
  int64 amount = 2;
}

enum Currency {
  CURRENCY_UNSPECIFIED = 0;
  EUR = 1;
  USD = 2;
}
`

func mustProto(t *testing.T, text string) *protoCodec {
	t.Helper()
	c, err := compileProtobuf(context.Background(), text)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestProtobufFromJSON: a payload in protojson's JSON is encoded as the
// named message (the first by default) with its message indexes, and the
// bytes decode to the same message.
func TestProtobufFromJSON(t *testing.T) {
	c := mustProto(t, paymentProto)
	for _, tc := range []struct {
		message string
		payload string
		index   []int
	}{
		{"", `{"id":"p-1","amount":"1200","currency":"EUR","at":"2026-12-04T10:30:00Z","lines":[{"sku":"a","quantity":2}],"bySku":{"a":{"sku":"a","quantity":2}},"note":"hi"}`, []int{0}},
		{"com.example.PaymentCreated", `{"id":"p-2","amount":5,"by_sku":{}}`, []int{0}},
		{"PaymentRefunded", `{"id":"p-3","amount":7}`, []int{1}},
		// Nested messages are counted as protoc's descriptors list them:
		// the entry message of the map field by_sku, declared before Line,
		// is the first.
		{"com.example.PaymentCreated.Line", `{"sku":"x"}`, []int{0, 1}},
	} {
		md, err := c.message(tc.message)
		if err != nil {
			t.Fatal(err)
		}
		b, index, m := c.encode([]byte(tc.payload), md)
		if m != nil {
			t.Fatalf("%s: mismatch at %s: %s", tc.payload, m.path, m.reason)
		}
		if !reflect.DeepEqual(index, tc.index) {
			t.Errorf("%s: index %v, want %v", md.FullName(), index, tc.index)
		}
		got, want := dynamicpb.NewMessage(md), dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(b, got); err != nil {
			t.Fatal(err)
		}
		if err := protojson.Unmarshal([]byte(tc.payload), want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("decoded %v, want %v", got, want)
		}
	}
}

func TestProtobufMessageByName(t *testing.T) {
	c := mustProto(t, paymentProto)
	for name, want := range map[string]string{
		"":                            "com.example.PaymentCreated",
		"PaymentRefunded":             "com.example.PaymentRefunded",
		"com.example.PaymentRefunded": "com.example.PaymentRefunded",
		"PaymentCreated.Line":         "com.example.PaymentCreated.Line",
		"Line":                        "com.example.PaymentCreated.Line",
	} {
		md, err := c.message(name)
		if err != nil || string(md.FullName()) != want {
			t.Errorf("message(%q) = %v, %v; want %s", name, md, err, want)
		}
	}
	if _, err := c.message("PaymentVoided"); err == nil || !strings.Contains(err.Error(), "com.example.PaymentRefunded") {
		t.Errorf("message(PaymentVoided): %v; want an error listing the messages", err)
	}
}

// TestProtobufMismatchPath: protojson judges, and the mismatch gains the
// JSON path it does not give.
func TestProtobufMismatchPath(t *testing.T) {
	c := mustProto(t, paymentProto)
	md, _ := c.message("")
	for _, tc := range []struct{ payload, path, reason string }{
		{`{"id":"p","amount":"x"}`, "$.amount", "invalid value for int64 field amount"},
		{`{"id":"p","amuont":1}`, "$.amuont", `no field "amuont" in message com.example.PaymentCreated`},
		{`{"id":"p","currency":"GBP"}`, "$.currency", "invalid value for enum"},
		{`{"lines":[{"sku":"a"},{"sku":"b","quantity":"many"}]}`, "$.lines[1].quantity", "int32"},
		{`{"lines":[{"sku":"a","colour":"red"}]}`, "$.lines[0].colour", `no field "colour"`},
		{`{"bySku":{"a":{"quantity":true}}}`, "$.bySku.a.quantity", "int32"},
		{`{"at":"yesterday"}`, "$.at", "Timestamp"},
		{`{"id":7}`, "$.id", "string"},
		{`["p"]`, "$", "want an object"},
		{`{"id":`, "$", "not JSON"},
	} {
		_, _, m := c.encode([]byte(tc.payload), md)
		if m == nil {
			t.Errorf("%s: encoded, want a mismatch at %s", tc.payload, tc.path)
			continue
		}
		if m.path != tc.path || !strings.Contains(m.reason, tc.reason) {
			t.Errorf("%s: mismatch at %s: %s\nwant at %s: ...%s...", tc.payload, m.path, m.reason, tc.path, tc.reason)
		}
		if strings.HasPrefix(m.reason, "proto:") || strings.Contains(m.reason, "line 1:") {
			t.Errorf("%s: reason %q keeps protojson's prefix or position", tc.payload, m.reason)
		}
	}
}

func TestProtobufCompileErrors(t *testing.T) {
	for _, text := range []string{`syntax = "proto3"; message {`, `syntax = "proto3"; enum E { A = 0; }`, `syntax = "proto3"; import "other.proto"; message M { Other o = 1; }`} {
		if _, err := compileProtobuf(context.Background(), text); err == nil {
			t.Errorf("compiled %q", text)
		}
	}
}
