package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cdc-outbox/cdc-outbox/schema"
)

// The value formats against raw (bench -value-formats avro,protobuf; make
// bench-formats): one backlog of single-event transactions, drained by the
// streamer once with raw values and once per format, each from a slot made
// before the backlog was written, in the same run, against a real Apicurio
// Registry that scripts/apicurio.sh (or CDC_OUTBOX_TEST_REGISTRY_CTL)
// starts. For each: events/s and its ratio to raw, CPU per event, peak RSS,
// and the registry requests the stream made (its metrics): once per schema,
// not per event. Then a steady load with each, for commit→ack latency.
// Writes formats.md.

// The schemas of the backlog's payloads (backlogProcedure), one per format.
var benchSchemas = map[schema.Format]string{
	schema.Avro: `{"type": "record", "name": "OrderUpdated", "namespace": "bench", "fields": [
		{"name": "order", "type": "string"}, {"name": "seq", "type": "long"}, {"name": "amount", "type": "double"},
		{"name": "currency", "type": "string"}, {"name": "customer", "type": "string"}, {"name": "status", "type": "string"},
		{"name": "note", "type": "string"}]}`,
	schema.Protobuf: `syntax = "proto3";
package bench;
message OrderUpdated {
  string order = 1;
  int64 seq = 2;
  double amount = 3;
  string currency = 4;
  string customer = 5;
  string status = 6;
  string note = 7;
}
`,
	schema.JSONSchema: `{"type": "object", "required": ["order", "seq", "amount"], "properties": {
		"order": {"type": "string"}, "seq": {"type": "integer"}, "amount": {"type": "number"}, "currency": {"type": "string"},
		"customer": {"type": "string"}, "status": {"type": "string"}, "note": {"type": "string"}}}`,
}

// formatRun is one drain of the backlog.
type formatRun struct {
	format   string // raw or a schema format
	wall     time.Duration
	events   int
	cpu      time.Duration
	rssMiB   float64
	requests float64 // to the registry
}

func (r formatRun) rate() float64 { return float64(r.events) / r.wall.Seconds() }

// registryCtl is the script that runs Apicurio Registry.
func registryCtl(root string) string {
	if ctl := os.Getenv("CDC_OUTBOX_TEST_REGISTRY_CTL"); ctl != "" {
		return ctl
	}
	return filepath.Join(root, "scripts", "apicurio.sh")
}

func runFormats(ctx context.Context, o options, b *bench, root string, info runInfo) int {
	ctl := registryCtl(root)
	control := func(arg string) (string, error) {
		out, err := exec.CommandContext(ctx, ctl, arg).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", ctl, arg, err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	progress("formats: starting Apicurio Registry (%s)", ctl)
	if _, err := control("start"); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer func() { _, _ = exec.Command(ctl, "stop").CombinedOutput() }()
	url, err := control("url")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var runs []formatRun
	var steady []formatSteady
	var failed error
	incomplete := measured(ctx, &info, func() error {
		if runs, failed = b.formats(ctx, url, o.formats, o.formatEvents); failed != nil {
			return failed
		}
		if o.formatSteady > 0 {
			steady, failed = b.formatsSteady(ctx, url, o.formats, o.formatRate, o.formatSteady)
		}
		return failed
	})
	text := formatsReport(info, o, url, runs, steady, incomplete)
	fmt.Println()
	fmt.Print(text)
	if incomplete != "" || failed != nil {
		progress("incomplete run: %s not written", filepath.Join(o.out, "formats.md"))
		return 1
	}
	path := filepath.Join(o.out, "formats.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench: write report:", err)
		return 1
	}
	progress("wrote %s", path)
	return 0
}

// formats writes one backlog of n single-event transactions and drains it
// with raw values, then with each format.
func (b *bench) formats(ctx context.Context, registryURL string, formats []string, n int) ([]formatRun, error) {
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: registryURL})
	if err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return nil, err
	}
	// Raw first and last, so that neither a cold nor a warm page cache
	// favours the formats; each drain has its own slot and topic.
	order := append(append([]string{"raw"}, formats...), rawAgain)
	slots := map[string]string{}
	for _, f := range order {
		aggType := formatTag(f)
		if err := b.createTopic(ctx, aggType); err != nil {
			return nil, err
		}
		defer b.deleteTopic(context.Background(), aggType)
		if sf, err := schema.ParseFormat(f); err == nil {
			if _, err := reg.Register(ctx, b.topic(aggType)+"-value", sf, benchSchemas[sf]); err != nil {
				return nil, fmt.Errorf("register the %s schema: %w", f, err)
			}
		}
		slots[f] = b.slot(aggType)
		if err := b.createSlot(ctx, slots[f]); err != nil {
			return nil, fmt.Errorf("create slot: %w", err)
		}
		defer func() { _ = b.dropSlot(context.Background(), slots[f]) }()
	}
	progress("formats: writing %d events, one per transaction", n)
	t0 := time.Now()
	stop := heartbeat("writing the backlog")
	err = writeBacklog(ctx, b.dbURL, n, 1, "formats")
	stop()
	if err != nil {
		return nil, fmt.Errorf("write backlog: %w", err)
	}
	progress("formats: backlog written in %.1fs", time.Since(t0).Seconds())
	var runs []formatRun
	for _, f := range order {
		// Every backlog row has the aggregate type "formats": each drain's
		// topic is fixed by --topic instead.
		topic := b.topic(formatTag(f))
		flags := []string{"--value-format", "raw"}
		if _, err := schema.ParseFormat(f); err == nil {
			flags = []string{"--value-format", f, "--schema-registry-url", registryURL}
		}
		progress("formats: %s draining", f)
		r, err := b.drainFormat(ctx, slots[f], topic, n, flags)
		if err != nil {
			return runs, fmt.Errorf("%s: %w", f, err)
		}
		r.format = f
		runs = append(runs, r)
		progress("formats: %s done in %.2fs: %.0f events/s, CPU %.1fs, %0.f registry requests", f, r.wall.Seconds(), r.rate(), r.cpu.Seconds(), r.requests)
	}
	return runs, nil
}

// rawAgain is the second drain with raw values, the last.
const rawAgain = "raw, again"

// formatTag names a drain's slot and topic.
func formatTag(f string) string {
	if f == rawAgain {
		return "fmt_raw2"
	}
	return "fmt_" + strings.ReplaceAll(f, "-", "_")
}

// drainFormat times the streamer from its start until its metrics say
// Kafka acknowledged the whole backlog, as drainStreamer does.
func (b *bench) drainFormat(ctx context.Context, slot, topic string, n int, flags []string) (formatRun, error) {
	var r formatRun
	s, err := b.startStreamerTo(slot, topic, flags...)
	if err != nil {
		return r, err
	}
	defer func() { _ = b.stopStreamer(s, 60*time.Second) }()
	ms, wall, err := s.waitDrained(ctx, n, 0)
	if err != nil {
		return r, err
	}
	r.wall, r.events = wall, int(ms.sum("cdc_outbox_events_total"))
	r.requests = ms.sum("cdc_outbox_schema_registry_requests_total")
	u, err := readUsage(s.pid())
	if err != nil {
		return r, err
	}
	r.cpu, r.rssMiB = u.cpu, mib(u.hwmKiB)
	return r, b.stopStreamer(s, 60*time.Second)
}

// formatSteady is one steady load with a value format.
type formatSteady struct {
	format string
	steadyResult
}

// formatsSteady runs the steady load at rate for d with raw values and
// with each format, one streamer after the other, on a topic (and subject)
// of each.
func (b *bench) formatsSteady(ctx context.Context, registryURL string, formats []string, rate int, d time.Duration) ([]formatSteady, error) {
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: registryURL})
	if err != nil {
		return nil, err
	}
	base := b.streamerFlags
	defer func() { b.streamerFlags = base }()
	var out []formatSteady
	for _, f := range append([]string{"raw"}, formats...) {
		aggType := "s" + formatTag(f)
		if err := b.createTopic(ctx, aggType); err != nil {
			return out, err
		}
		defer b.deleteTopic(context.Background(), aggType)
		flags := []string{"--value-format", "raw"}
		if sf, err := schema.ParseFormat(f); err == nil {
			if _, err := reg.Register(ctx, b.topic(aggType)+"-value", sf, benchSchemas[sf]); err != nil {
				return out, fmt.Errorf("register the %s schema: %w", f, err)
			}
			flags = []string{"--value-format", f, "--schema-registry-url", registryURL}
		}
		b.streamerFlags = append(base[:len(base):len(base)], flags...)
		progress("formats: steady %d/s with %s values", rate, f)
		r, err := b.steady(ctx, aggType, rate, d, readerStreamer)
		if err != nil {
			return out, fmt.Errorf("steady load, %s: %w", f, err)
		}
		out = append(out, formatSteady{format: f, steadyResult: r})
		progress("formats: steady %d/s with %s values: p99 %s, %.1f µs of CPU per event", rate, f, r.p99, r.cpuPerEvent)
	}
	return out, nil
}

func formatsReport(info runInfo, o options, registryURL string, runs []formatRun, steady []formatSteady, incomplete string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Value formats against raw\n\n")
	fmt.Fprintf(&sb, "%s; PostgreSQL %s, Kafka %s, Apicurio Registry (%s), %d cores (%s), %s. A backlog of %d events, one per transaction, "+
		"drained by the streamer once per value format from slots made before it was written. `go run ./bench -value-formats %s -formats-events %d`.\n\n",
		info.date, info.pgVersion, info.kafkaVersion, registryURL, info.cores, info.cpuModel, info.goVersion, o.formatEvents,
		strings.Join(o.formats, ","), o.formatEvents)
	fmt.Fprintf(&sb, "Backlog drain:\n\n")
	if incomplete != "" {
		fmt.Fprintf(&sb, "**Incomplete run:** %s\n\n", incomplete)
	}
	fmt.Fprintf(&sb, "| value format | events/s | of raw's (the mean of its two drains) | CPU per event | peak RSS | registry requests |\n|---|---|---|---|---|---|\n")
	// Raw's rate is the mean of its two drains.
	var raw float64
	var raws int
	for _, r := range runs {
		if r.format == "raw" || r.format == rawAgain {
			raw += r.rate()
			raws++
		}
	}
	if raws > 0 {
		raw /= float64(raws)
	}
	for _, r := range runs {
		ratio := "—"
		if raw > 0 {
			ratio = fmt.Sprintf("%.2f ×", r.rate()/raw)
		}
		fmt.Fprintf(&sb, "| %s | %.0f | %s | %.1f µs | %.0f MiB | %.0f |\n", r.format, r.rate(), ratio,
			float64(r.cpu.Microseconds())/float64(r.events), r.rssMiB, r.requests)
	}
	if len(steady) > 0 {
		fmt.Fprintf(&sb, "\nA steady load of %d events/s, one per transaction, %s warm-up and %s measured per format, one streamer after the other "+
			"(`-formats-rate %d -formats-steady %s`):\n\n", o.formatRate, warmup, o.formatSteady, o.formatRate, o.formatSteady)
		fmt.Fprintf(&sb, "| value format | achieved/s | p50 commit→ack | p99 | p99.9 | CPU per event | peak RSS | machine |\n|---|---|---|---|---|---|---|---|\n")
		for _, r := range steady {
			fmt.Fprintf(&sb, "| %s | %.0f | %s | %s | %s | %.1f µs | %.0f MiB | %s |\n", r.format, r.achieved, r.p50, r.p99, r.p999, r.cpuPerEvent, r.rssMiB, r.machine)
		}
	}
	return sb.String()
}
