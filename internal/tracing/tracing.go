// Package tracing follows each event from its PostgreSQL commit to the
// broker's acknowledgement in an OpenTelemetry span, the child of the trace
// context the row carries (its traceparent and tracestate headers), and
// writes the new span's context into the record so consumers continue
// from it.
//
// It is off unless the standard OpenTelemetry environment variables name
// an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); the SDK and the exporter read the
// rest themselves (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER and its argument, headers, timeouts, TLS). The
// default sampler, parentbased_always_on, follows the stored context's
// sampled flag. When tracing is off there is no Tracer at all, so the data
// path does nothing for it.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether the environment asks for traces: an OTLP
// endpoint is set, and neither OTEL_SDK_DISABLED nor OTEL_TRACES_EXPORTER
// (none) turns them off.
func Enabled(getenv func(string) string) bool {
	if v, _ := strconv.ParseBool(getenv("OTEL_SDK_DISABLED")); v {
		return false
	}
	if getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// CheckEnv reports a setting of the environment the SDK would not follow:
// an OTLP protocol other than http/protobuf or grpc, an exporter other
// than otlp, or a sampler it does not know.
func CheckEnv(getenv func(string) string) error {
	if p := protocol(getenv); p != "http/protobuf" && p != "grpc" {
		return fmt.Errorf("OTLP protocol %q: use http/protobuf or grpc", p)
	}
	if e := getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" && e != "none" {
		return fmt.Errorf("OTEL_TRACES_EXPORTER %q: use otlp or none", e)
	}
	switch s := getenv("OTEL_TRACES_SAMPLER"); s {
	case "", "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio":
	default:
		return fmt.Errorf("OTEL_TRACES_SAMPLER %q: use always_on, always_off, traceidratio or parentbased_always_on, parentbased_always_off, parentbased_traceidratio", s)
	}
	return nil
}

func protocol(getenv func(string) string) string {
	if p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" {
		return p
	}
	if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" {
		return p
	}
	return "http/protobuf"
}

// Tracer starts the span of each event's delivery.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// Config is what the spans say beside the record.
type Config struct {
	Version string // the streamer's version, for the instrumentation scope
	// Log receives the SDK's errors (an export that failed), which it
	// would otherwise print on its own; nil discards them.
	Log *slog.Logger
}

// New sets up the SDK from the environment (Enabled must be true) and
// returns a Tracer and the function that flushes and stops the exporter.
func New(ctx context.Context, cfg Config) (*Tracer, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	if protocol(os.Getenv) == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(serviceName())))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if cfg.Log != nil {
		log := cfg.Log.With("component", "tracing")
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("OpenTelemetry: spans not exported", "error", err) }))
	}
	// The sampler is the SDK's default, which reads OTEL_TRACES_SAMPLER.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return NewWith(tp, cfg), tp.Shutdown, nil
}

// serviceName is OTEL_SERVICE_NAME, else cdc-outbox; WithFromEnv, applied
// first, lets OTEL_RESOURCE_ATTRIBUTES set it too, which this must not
// override.
func serviceName() string {
	if n := os.Getenv("OTEL_SERVICE_NAME"); n != "" {
		return n
	}
	for _, kv := range strings.Split(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == "service.name" {
			return strings.TrimSpace(v)
		}
	}
	return "cdc-outbox"
}

// NewWith is New with a tracer provider of the caller's (tests).
func NewWith(tp trace.TracerProvider, cfg Config) *Tracer {
	return &Tracer{
		tracer: tp.Tracer("github.com/cdc-outbox/cdc-outbox", trace.WithInstrumentationVersion(cfg.Version)),
	}
}

// Start begins the producer span of rec, an event of the transaction that
// committed at commitUnixNano with its row at lsn, as the child of the
// trace context in rec's traceparent and tracestate headers (a new trace
// when it has none, as the sampler decides), and writes the span's context
// into those headers. The returned function ends the span with the
// broker's answer; call it once.
func (t *Tracer) Start(rec *kgo.Record, eventID, source string, lsn pglogrepl.LSN, commitUnixNano int64) func(*kgo.Record, error) {
	carrier := kotel.NewRecordCarrier(rec)
	parent := t.prop.Extract(context.Background(), carrier)
	ctx, span := t.tracer.Start(parent, "send "+rec.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(time.Unix(0, commitUnixNano)),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingOperationName("send"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(rec.Topic),
			semconv.MessagingKafkaMessageKey(string(rec.Key)),
			semconv.MessagingMessageID(eventID),
			attribute.String("cdc_outbox.source", source),
			attribute.String("cdc_outbox.commit_lsn", lsn.String()),
		))
	if span.SpanContext().IsValid() {
		t.prop.Inject(ctx, carrier)
	}
	return func(r *kgo.Record, err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if span.IsRecording() {
			span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(int(r.Partition))), semconv.MessagingKafkaOffset(int(r.Offset)))
		}
		span.End()
	}
}
