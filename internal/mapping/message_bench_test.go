package mapping

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkMapMessage maps the envelope outbox.Emit writes, beside
// BenchmarkMap's row of the same event.
func BenchmarkMapMessage(b *testing.B) {
	m := mustNew(b, DefaultConfig())
	content := []byte(`{"v":1,"id":"0192f0c1-7a3e-7b4c-9d2e-5f6a7b8c9d0e","aggregate_type":"payment","aggregate_id":"acct-42","event_type":"PaymentCreated",` +
		`"payload":{"account": "acct-42", "amount": 1200, "currency": "EUR", "payment_id": "0192f0c1-7a3e-7b4c-9d2e-5f6a7b8c9d0e"},"created_at":"2026-12-01T21:00:00.123456+00:00"}`)
	cols := make([]Column, len(m.Columns()))
	var rec kgo.Record
	b.ReportAllocs()
	for b.Loop() {
		if err := m.MapMessage(content, cols, &rec); err != nil {
			b.Fatal(err)
		}
	}
}
