package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeotel"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// jaeger starts the local Jaeger (scripts/jaeger.sh, testenv.JaegerCtl)
// for the test and returns its OTLP/HTTP endpoint and query API.
func jaeger(t *testing.T) (otlp, query string) {
	t.Helper()
	ctl := testenv.JaegerCtl(t)
	run := func(arg string) string {
		out, err := exec.Command(ctl, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", ctl, arg, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("start")
	t.Cleanup(func() { run("stop") })
	return run("otlp-endpoint"), run("query-url")
}

// jaegerSpan is a span as Jaeger's query API returns it.
type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	ProcessID     string `json:"processID"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
}

// trace returns the spans of traceID that Jaeger holds, by service.
func jaegerTrace(t *testing.T, query, traceID string) map[string][]jaegerSpan {
	t.Helper()
	resp, err := http.Get(query + "/api/traces/" + traceID)
	if err != nil {
		t.Fatalf("query Jaeger: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var doc struct {
		Data []struct {
			Spans     []jaegerSpan `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &doc) != nil {
		t.Fatalf("Jaeger answers %s: %s", resp.Status, body)
	}
	out := map[string][]jaegerSpan{}
	for _, d := range doc.Data {
		for _, s := range d.Spans {
			svc := d.Processes[s.ProcessID].ServiceName
			out[svc] = append(out[svc], s)
		}
	}
	return out
}

// TestTracingThroughJaeger: a service's span, stored with its event by the
// outbox library through OpenTelemetry's propagator, is continued by the
// streamer's producer span (OTEL_* variables, exported to a real Jaeger
// over OTLP) and by the consumer's span (consumeotel): one trace of three
// spans, each the child of the one before, as Jaeger's query API returns
// it. An event whose service span was not sampled gives no spans at all.
func TestTracingThroughJaeger(t *testing.T) {
	t.Parallel()
	otlp, query := jaeger(t)
	e := newEnv(t)
	ctx := testenv.Context(t)
	adm := kadm.NewClient(testenv.KafkaClient(t))
	if resp, err := adm.CreateTopic(ctx, 1, 1, nil, e.topic("order")); err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}

	newProvider := func(service string, sampler sdktrace.Sampler) *sdktrace.TracerProvider {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(otlp+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		res := resource.NewSchemaless(attribute.String("service.name", service))
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithSampler(sampler))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	service := newProvider("checkout-"+e.prefix, sdktrace.AlwaysSample())
	unsampled := newProvider("checkout-"+e.prefix, sdktrace.NeverSample())
	consumer := newProvider("billing-"+e.prefix, sdktrace.ParentBased(sdktrace.AlwaysSample()))

	s := e.startEnv([]string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp, "OTEL_SERVICE_NAME=cdc-outbox-" + e.prefix, "OTEL_BSP_SCHEDULE_DELAY=100"})
	e.waitStreaming()

	// The service: a span around its transaction, the event's headers
	// filled by the propagator.
	write := func(tp *sdktrace.TracerProvider, id string) (traceID, spanID string) {
		sctx, span := tp.Tracer("checkout").Start(ctx, "place order")
		defer span.End()
		headers := map[string]string{}
		propagation.TraceContext{}.Inject(sctx, propagation.MapCarrier(headers))
		tx, err := e.pool.Begin(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Write(sctx, tx, outbox.Event{AggregateType: "order", AggregateID: id, EventType: "order.placed",
			Payload: []byte(`{"order":"` + id + `"}`), Headers: headers}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(sctx); err != nil {
			t.Fatal(err)
		}
		return span.SpanContext().TraceID().String(), span.SpanContext().SpanID().String()
	}
	traceID, serviceSpan := write(service, "o-1")
	quietTrace, _ := write(unsampled, "o-2")
	if err := service.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}

	// The consumer: consume's handler wrapped in consumeotel.
	applySQLFiles(t, e.url, "../sql/processed_events.sql")
	var processed atomic.Int64
	c, err := consume.New(consume.Config{
		Brokers: e.brokers,
		Group:   testenv.Name("grp"),
		Topics:  []string{e.topic("order")},
		DB:      e.pool,
		Handler: consumeotel.Handler(func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
			consumeotel.Config{Group: "billing", TracerProvider: consumer}),
		Hooks: consume.HooksFunc(func(o consume.Observation) {
			if o.Outcome == consume.Processed {
				processed.Add(1)
			}
		}),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	eventually(t, 60*time.Second, "the consumer to process both events", func() bool { return processed.Load() >= 2 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := consumer.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	s.stop() // flushes the streamer's spans

	var spans map[string][]jaegerSpan
	eventually(t, 30*time.Second, "Jaeger to hold the three spans of trace "+traceID, func() bool {
		spans = jaegerTrace(t, query, traceID)
		return len(spans["checkout-"+e.prefix]) == 1 && len(spans["cdc-outbox-"+e.prefix]) == 1 && len(spans["billing-"+e.prefix]) == 1
	})
	parent := func(s jaegerSpan) string {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && r.TraceID == traceID {
				return r.SpanID
			}
		}
		return ""
	}
	svc, relay, cons := spans["checkout-"+e.prefix][0], spans["cdc-outbox-"+e.prefix][0], spans["billing-"+e.prefix][0]
	if svc.SpanID != serviceSpan || parent(svc) != "" {
		t.Errorf("service span %+v, want %s without a parent", svc, serviceSpan)
	}
	if relay.OperationName != "send "+e.topic("order") || parent(relay) != serviceSpan {
		t.Errorf("cdc-outbox span %q has parent %q, want send %s, child of the service's %s", relay.OperationName, parent(relay), e.topic("order"), serviceSpan)
	}
	if cons.OperationName != "process "+e.topic("order") || parent(cons) != relay.SpanID {
		t.Errorf("consumer span %q has parent %q, want process %s, child of cdc-outbox's %s", cons.OperationName, parent(cons), e.topic("order"), relay.SpanID)
	}
	// Everything is exported by now (the streamer flushed when it stopped,
	// the consumer's provider was flushed, and Jaeger holds the sampled
	// trace that went the same way): the unsampled trace has nothing.
	if got := jaegerTrace(t, query, quietTrace); len(got) != 0 {
		t.Errorf("the unsampled event's trace %s has spans: %v", quietTrace, got)
	}
	t.Logf("trace %s: %s → %s → %s", traceID, fmt.Sprint(svc.OperationName), relay.OperationName, cons.OperationName)
}
