package consumeotel

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestHandlerRunsInConsumerSpan: the handler runs inside a consumer span,
// the child of the record's traceparent, and a failure marks the span.
func TestHandlerRunsInConsumerSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	boom := errors.New("boom")
	var inside trace.SpanContext
	h := Handler(func(ctx context.Context, _ pgx.Tx, r *kgo.Record) error {
		inside = trace.SpanContextFromContext(ctx)
		if string(r.Value) == "fail" {
			return boom
		}
		return nil
	}, Config{Group: "billing", TracerProvider: tp})
	rec := func(v, traceparent string) *kgo.Record {
		return &kgo.Record{Topic: "outbox.event.order", Partition: 1, Offset: 9, Value: []byte(v), Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte("42")}, {Key: "traceparent", Value: []byte(traceparent)}}}
	}
	if err := h(context.Background(), nil, rec("ok", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")); err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), nil, rec("fail", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the handler's", err)
	}
	if err := h(context.Background(), nil, rec("ok", "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (the unsampled parent's none)", len(spans))
	}
	s := spans[0]
	if s.Name != "process outbox.event.order" || s.SpanKind != trace.SpanKindConsumer ||
		s.Parent.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || s.Parent.SpanID().String() != "b7ad6b7169203331" {
		t.Errorf("span %q kind %v parent %v", s.Name, s.SpanKind, s.Parent)
	}
	attrs := map[string]string{}
	for _, a := range s.Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	for k, v := range map[string]string{"messaging.system": "kafka", "messaging.consumer.group.name": "billing", "messaging.message.id": "42",
		"messaging.destination.partition.id": "1", "messaging.kafka.offset": "9"} {
		if attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
		}
	}
	if spans[1].Status.Description != "boom" {
		t.Errorf("failed attempt's span status %+v", spans[1].Status)
	}
	if inside.TraceID().String() != "1af7651916cd43dd8448eb211c80319c" {
		t.Errorf("the handler's context holds trace %s, want the record's", inside.TraceID())
	}
}
