package schema

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// The cost per event of each format with its schema cached (the registry
// is asked once, before the loop), to weigh against the raw payload's
// zero: go test -bench . -benchmem ./schema
func benchmarkEncode(b *testing.B, f Format, text string, payload string) {
	fake, r, _, _ := fakeRegistry(b, RegistryConfig{})
	fake.SeedSchema("payments-value", 1, 7, sr.Schema{Schema: text, Type: srType(f)})
	e, err := NewEncoder(r, Config{Format: f, Refresh: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	ev := Event{Topic: "payments", EventType: "PaymentCreated", Payload: []byte(payload)}
	ctx := context.Background()
	if _, _, err := e.Encode(ctx, ev); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := e.Encode(ctx, ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeAvro(b *testing.B) {
	benchmarkEncode(b, Avro, paymentAvro, `{"id":"p-1","amount":1200,"currency":"EUR","note":"hi","at":"2026-12-04T10:30:00Z","price":"12.30","tags":["a","b"],"payer":{"name":"Ann"}}`)
}

func BenchmarkEncodeProtobuf(b *testing.B) {
	benchmarkEncode(b, Protobuf, paymentProto, `{"id":"p-1","amount":"1200","currency":"EUR","at":"2026-12-04T10:30:00Z","lines":[{"sku":"a","quantity":2}],"note":"hi"}`)
}

func BenchmarkEncodeJSONSchema(b *testing.B) {
	benchmarkEncode(b, JSONSchema, paymentJSONSchema, `{"id":"p-1","amount":1200,"lines":[{"sku":"a","quantity":2}]}`)
}
