// Package consumeotel runs package consume's handlers inside OpenTelemetry
// consumer spans that continue the trace each record carries: the
// traceparent and tracestate headers cdc-outbox writes (its own span's
// context when it traces, else the one the service stored with the event).
//
// It is a module of its own,
// github.com/cdc-outbox/cdc-outbox/consume/consumeotel, so that package
// consume does not bring OpenTelemetry to services that do not use it.
//
//	cfg.Handler = consumeotel.Handler(handle, consumeotel.Config{Group: cfg.Group})
//
// The span, "process <topic>", is of kind consumer with the messaging
// semantic conventions' attributes (system kafka, destination, partition,
// offset, consumer group, message id); the handler's context holds it, so
// spans the handler starts are its children. Each attempt of a retried
// record is a span of its own, and a failed attempt's span has the error.
package consumeotel

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/cdc-outbox/cdc-outbox/consume"
)

// Config is how the spans are made.
type Config struct {
	// Group is the consumer group, an attribute of every span.
	Group string
	// TracerProvider makes the spans; nil means OpenTelemetry's global one
	// (otel.SetTracerProvider).
	TracerProvider trace.TracerProvider
}

// Handler returns h wrapped in a consumer span per call.
func Handler(h consume.Handler, cfg Config) consume.Handler {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracer := tp.Tracer("github.com/cdc-outbox/cdc-outbox/consume/consumeotel")
	var prop propagation.TraceContext
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		ctx = prop.Extract(ctx, carrier{r})
		ctx, span := tracer.Start(ctx, "process "+r.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationName("process"),
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingDestinationName(r.Topic),
				semconv.MessagingDestinationPartitionID(strconv.Itoa(int(r.Partition))),
				semconv.MessagingKafkaOffset(int(r.Offset)),
				semconv.MessagingConsumerGroupName(cfg.Group),
				semconv.MessagingMessageID(eventID(r)),
			))
		defer span.End()
		err := h(ctx, tx, r)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return err
	}
}

// eventID is the record's event id header: id in cdc-outbox's native
// format, ce_id in the CloudEvents binary mode ("" in the structured mode,
// whose id is in the value).
func eventID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == consume.HeaderEventID || h.Key == consume.HeaderCloudEventsID {
			return string(h.Value)
		}
	}
	return ""
}

// carrier reads the record's headers for the propagator.
type carrier struct{ r *kgo.Record }

func (c carrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set is not used: a consumer only extracts.
func (c carrier) Set(string, string) {}

func (c carrier) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
