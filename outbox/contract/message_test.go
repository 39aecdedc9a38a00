package contract_test

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// TestEnvelopeRoundTrip: what AppendEnvelope writes, ParseEnvelope reads
// back as it was, the payload byte for byte.
func TestEnvelopeRoundTrip(t *testing.T) {
	for _, e := range []contract.Envelope{
		{ID: "0192f0c1-7a3e-7b4c-9d2e-5f6a7b8c9d0e", AggregateType: "payment", AggregateID: "p-1", EventType: "payment.captured",
			Payload: []byte(`{ "amount" : 100, "note": "<&>" }`), Headers: []byte(`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`),
			CreatedAt: time.Date(2026, 12, 1, 21, 0, 0, 123456000, time.UTC)},
		{ID: "1", AggregateType: "blob", AggregateID: "\"quoted\" ü", EventType: "stored", Payload: []byte{0, 0xff, '"'}, Binary: true},
		{ID: "2", AggregateType: "a", AggregateID: "b", EventType: "c", Payload: []byte(`null`)},
	} {
		b := contract.AppendEnvelope(nil, e)
		got, err := contract.ParseEnvelope(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("%s:\n got %+v\nwant %+v", b, got, e)
		}
	}
}

// TestEnvelopeAsPostgreSQLWritesIt reads what json_build_object writes
// (spaces after the colons, a bigint id as a number, timestamptz with an
// offset, NULLs as null): the form of the plain-SQL example.
func TestEnvelopeAsPostgreSQLWritesIt(t *testing.T) {
	content := []byte(`{"v" : 1, "\u0069d" : 42, "aggregate_type" : "order", "aggregate_id" : "o-1", "event_type" : "created", ` +
		`"payload" : {"total": 10.50, "items": [1, 2]}, "headers" : null, "created_at" : "2026-12-01T22:00:00.5+01:00"}`)
	e, err := contract.ParseEnvelope(content)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != "42" || e.AggregateID != "o-1" || !bytes.Equal(e.Payload, []byte(`{"total": 10.50, "items": [1, 2]}`)) || e.Headers != nil ||
		!e.CreatedAt.Equal(time.Date(2026, 12, 1, 21, 0, 0, 500_000_000, time.UTC)) {
		t.Errorf("%+v", e)
	}
}
