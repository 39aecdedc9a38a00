package tracing

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func record(traceparent string) *kgo.Record {
	r := &kgo.Record{Topic: "outbox.event.order", Key: []byte("o-1"), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("42")}}}
	if traceparent != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte(traceparent)})
	}
	return r
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// TestSpanIsChildOfStoredContext: the producer span continues the row's
// trace, runs from the commit to the ack with the messaging attributes,
// and its own context replaces the row's traceparent in the record.
func TestSpanIsChildOfStoredContext(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := NewWith(tp, Config{Version: "test"})
	commit := time.Now().Add(-time.Second)
	r := record("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	end := tr.Start(r, "42", "s/1/2", 0x1D84D38, commit.UnixNano())
	r.Partition, r.Offset = 2, 17
	end(r, nil)

	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Parent.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || s.Parent.SpanID().String() != "b7ad6b7169203331" || !s.Parent.IsRemote() {
		t.Errorf("parent %v", s.Parent)
	}
	if s.Name != "send outbox.event.order" || s.SpanKind != trace.SpanKindProducer || !s.StartTime.Equal(time.Unix(0, commit.UnixNano())) {
		t.Errorf("span %q kind %v start %v", s.Name, s.SpanKind, s.StartTime)
	}
	attrs := map[attribute.Key]string{}
	for _, a := range s.Attributes {
		attrs[a.Key] = a.Value.String()
	}
	for k, v := range map[attribute.Key]string{"messaging.system": "kafka", "messaging.destination.name": "outbox.event.order", "messaging.kafka.message.key": "o-1",
		"messaging.message.id": "42", "cdc_outbox.source": "s/1/2", "cdc_outbox.commit_lsn": "0/1D84D38", "messaging.destination.partition.id": "2",
		"messaging.kafka.offset": "17", "messaging.operation.type": "send"} {
		if attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
		}
	}
	want := "00-0af7651916cd43dd8448eb211c80319c-" + s.SpanContext.SpanID().String() + "-01"
	if got := header(r, "traceparent"); got != want {
		t.Errorf("record traceparent %q, want the span's %q", got, want)
	}
	if n := len(r.Headers); n != 2 {
		t.Errorf("%d headers, want 2 (the traceparent replaced, not added)", n)
	}
}

// TestUnsampledParentMakesNoSpan: with the default sampler a parent whose
// sampled flag is off gives a span nobody exports, and the record still
// carries a context, unsampled, for the consumer.
func TestUnsampledParentMakesNoSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := NewWith(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), Config{})
	r := record("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
	tr.Start(r, "42", "s/1/2", 1, time.Now().UnixNano())(r, nil)
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans exported, want 0", n)
	}
	if got := header(r, "traceparent"); len(got) != 55 || got[:36] != "00-0af7651916cd43dd8448eb211c80319c-" || got[53:] != "00" {
		t.Errorf("traceparent %q: want the same trace, unsampled", got)
	}
}

// TestNoParentStartsTrace: a row without a trace context starts a trace
// of its own (as the sampler decides), and the record gets its context.
func TestNoParentStartsTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := NewWith(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), Config{})
	r := record("")
	tr.Start(r, "42", "s/1/2", 1, time.Now().UnixNano())(r, errors.New("refused"))
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Parent.IsValid() || spans[0].Status.Description != "refused" {
		t.Fatalf("spans %+v", spans)
	}
	if header(r, "traceparent") != "00-"+spans[0].SpanContext.TraceID().String()+"-"+spans[0].SpanContext.SpanID().String()+"-01" {
		t.Errorf("traceparent %q", header(r, "traceparent"))
	}
}

func TestEnabled(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		if got := Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("Enabled(%v) = %v", c.env, got)
		}
	}
	for env, bad := range map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
		"OTEL_TRACES_EXPORTER":        "zipkin",
		"OTEL_TRACES_SAMPLER":         "sometimes",
	} {
		if err := CheckEnv(func(k string) string {
			if k == env {
				return bad
			}
			return ""
		}); err == nil {
			t.Errorf("CheckEnv accepts %s=%s", env, bad)
		}
	}
	if err := CheckEnv(func(string) string { return "" }); err != nil {
		t.Errorf("CheckEnv of nothing: %v", err)
	}
}
