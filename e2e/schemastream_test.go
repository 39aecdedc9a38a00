package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// schemaRegistry is the Apicurio Registry of TestSchemasInTheStream,
// started through CDC_OUTBOX_TEST_REGISTRY_CTL with its storage in a file
// of the test's (APICURIO_DATASOURCE_URL, which Quarkus reads as
// apicurio.datasource.url), so that it can be stopped and started again
// mid-stream and still hold its schemas.
type schemaRegistry struct {
	t           *testing.T
	ctl         string
	environ     []string
	ccompat, v3 string
	client      *schema.Registry
}

func startSchemaRegistry(t *testing.T) *schemaRegistry {
	t.Helper()
	r := &schemaRegistry{t: t, ctl: testenv.RegistryCtl(t),
		environ: append(os.Environ(), "APICURIO_DATASOURCE_URL=jdbc:h2:file:"+filepath.Join(t.TempDir(), "registry"))}
	r.control("stop") // one started by another test keeps its storage in memory
	r.control("start")
	t.Cleanup(func() { r.control("stop") })
	r.ccompat = r.control("url")
	r.v3 = strings.Replace(r.ccompat, "/apis/ccompat/v7", "/apis/registry/v3", 1)
	var err error
	if r.client, err = schema.NewRegistry(schema.RegistryConfig{URL: r.ccompat}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *schemaRegistry) control(action string) string {
	r.t.Helper()
	cmd := exec.Command(r.ctl, action)
	cmd.Env = r.environ
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("%s %s: %v\n%s", r.ctl, action, err, out)
	}
	return strings.TrimSpace(string(out))
}

// register registers text under subject and returns its id.
func (r *schemaRegistry) register(subject string, f schema.Format, text string) int {
	r.t.Helper()
	s, err := r.client.Register(testenv.Context(r.t), subject, f, text)
	if err != nil {
		r.t.Fatalf("register %s: %v", subject, err)
	}
	return s.ID
}

// deleteSubject deletes subject for good (soft, then permanently).
func (r *schemaRegistry) deleteSubject(subject string) {
	r.t.Helper()
	for _, q := range []string{"", "?permanent=true"} {
		req, _ := http.NewRequest(http.MethodDelete, r.ccompat+"/subjects/"+subject+q, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			r.t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			r.t.Fatalf("DELETE subject %s%s: %s", subject, q, resp.Status)
		}
	}
}

// registryArgs are the streamer's flags of the registry.
func (r *schemaRegistry) args(extra ...string) []string {
	return append([]string{"--schema-registry-url", r.ccompat}, extra...)
}

// TestSchemasInTheStream: the streamer writes values in the registry's
// formats end to end, through one real Apicurio Registry shared by the
// subtests (it starts in 10 to 20 s): what the Java world reads, bad
// payloads, a subject deleted under the stream, and the registry stopped
// and started again under load.
func TestSchemasInTheStream(t *testing.T) {
	reg := startSchemaRegistry(t)
	t.Run("formats read by the Java consumer", func(t *testing.T) { schemaFormats(t, reg) })
	t.Run("payload that does not fit", func(t *testing.T) { schemaMismatch(t, reg) })
	t.Run("subject deleted under the stream", func(t *testing.T) { schemaSubjectDeleted(t, reg) })
	t.Run("registry outage under load", func(t *testing.T) {
		// One after the other: each stops and starts the one registry.
		for _, delivery := range []string{"at-least-once", "exactly-once"} {
			t.Run(delivery, func(t *testing.T) { schemaRegistryOutage(t, reg, delivery) })
		}
	})
}

// schemaFormats: three outboxes of one stream, from the configuration
// file, in Avro, Protobuf (the message by event type) and JSON Schema in
// CloudEvents binary records; Apicurio's Java deserializers read the rows'
// payloads, and the CloudEvents records name their schema.
func schemaFormats(t *testing.T, reg *schemaRegistry) {
	e := newEnv(t)
	testenv.Exec(t, e.url, tenantOutbox("public.avro_outbox")+"; "+tenantOutbox("public.proto_outbox")+"; "+tenantOutbox("public.json_outbox"))
	topics := map[schema.Format]string{schema.Avro: e.prefix + ".avro", schema.Protobuf: e.prefix + ".protobuf", schema.JSONSchema: e.prefix + ".json"}
	reg.register(topics[schema.Avro]+"-value", schema.Avro, javaAvroSchema)
	reg.register(topics[schema.Protobuf]+"-value", schema.Protobuf, javaProtoSchema)
	jsonID := reg.register(topics[schema.JSONSchema]+"-value", schema.JSONSchema, javaJSONSchema)
	config := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	if err := os.WriteFile(config, []byte(`
outboxes:
  - table: public.avro_outbox
    topic: `+topics[schema.Avro]+`
    value-format: avro
  - table: public.proto_outbox
    topic: `+topics[schema.Protobuf]+`
    value-format: protobuf
    schema-protobuf-message: event-type
    schema-record-namespace: com.example
  - table: public.json_outbox
    topic: `+topics[schema.JSONSchema]+`
    value-format: json-schema
    record-format: cloudevents-binary
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e.start(reg.args("--config", config, "--publication", e.slot)...)
	e.waitStreaming()

	avro := []string{
		`{"id":"p-1","amount":1200,"currency":"EUR","at":"2026-12-04T10:30:00Z"}`,
		`{"id":"p-2","amount":-7,"currency":"USD","note":"refund","at":0,"tags":["a","b"],"attrs":{"x":1},"payer":{"name":"Ann","iban":"DE1"}}`,
	}
	avroWant := []string{
		fmt.Sprintf(`{"id":"p-1","amount":1200,"currency":"EUR","note":null,"at":%d,"tags":[],"attrs":{},"payer":null}`, time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC).UnixMilli()),
		`{"id":"p-2","amount":-7,"currency":"USD","note":"refund","at":0,"tags":["a","b"],"attrs":{"x":1},"payer":{"name":"Ann","iban":"DE1"}}`,
	}
	protobuf := []string{
		`{"id":"p-1","amount":"1200","currency":"EUR"}`,
		`{"id":"p-2","amount":-7,"currency":"USD","lines":[{"sku":"a","quantity":2},{"sku":"b"}],"attrs":{"x":1}}`,
	}
	jsonPayloads := []string{
		`{"id":"p-1","amount":1200}`,
		`{"id":"p-2","amount":-7,"lines":[{"sku":"a","quantity":2}],"extra":{"deep":[1,2.5,null,true]}}`,
	}
	ctx := testenv.Context(t)
	for table, payloads := range map[string][]string{"avro_outbox": avro, "proto_outbox": protobuf, "json_outbox": jsonPayloads} {
		for i, p := range payloads {
			if _, err := e.pool.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'PaymentCreated', $2)`,
				fmt.Sprintf("pay-%d", i), p); err != nil {
				t.Fatal(err)
			}
		}
	}

	consume := javaConsumer(t)
	read := func(f schema.Format, n int, extra ...string) []string {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		out, err := consume(rctx, append([]string{strings.Join(e.brokers, ","), reg.v3, f.String(), topics[f], fmt.Sprint(n), "90"}, extra...)...)
		if err != nil {
			t.Fatalf("the Java consumer of %s: %v\n%s", topics[f], err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != n {
			t.Fatalf("the Java consumer printed %d lines, want %d:\n%s", len(lines), n, out)
		}
		return lines
	}
	for i, line := range read(schema.Avro, len(avro)) {
		if !sameJSON(t, line, avroWant[i]) {
			t.Errorf("avro record %d: the Java consumer read\n%s\nwant\n%s", i, line, avroWant[i])
		}
	}
	md := compileMessage(t, javaProtoSchema, "com.example.PaymentCreated")
	for i, line := range read(schema.Protobuf, len(protobuf), "PaymentCreated") {
		got, want := dynamicpb.NewMessage(md), dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal([]byte(line), got); err != nil {
			t.Fatalf("protobuf record %d: the Java consumer printed %s: %v", i, line, err)
		}
		if err := protojson.Unmarshal([]byte(protobuf[i]), want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("protobuf record %d: the Java consumer read\n%s\nwant the payload\n%s", i, line, protobuf[i])
		}
	}
	for i, line := range read(schema.JSONSchema, len(jsonPayloads)) {
		if !sameJSON(t, line, jsonPayloads[i]) {
			t.Errorf("json-schema record %d: the Java consumer read\n%s\nwant\n%s", i, line, jsonPayloads[i])
		}
	}

	// The CloudEvents binary records: content type of the format, the
	// schema's URL in the registry as dataschema.
	for _, r := range readValues(t, topics[schema.JSONSchema], len(jsonPayloads)) {
		wantSchema := fmt.Sprintf("%s/schemas/ids/%d", reg.ccompat, jsonID)
		if header(r, "content-type") != "application/json" || header(r, "ce_dataschema") != wantSchema || header(r, "ce_type") != "PaymentCreated" {
			t.Errorf("CloudEvents record %s: content-type %q, dataschema %q, type %q; want application/json, %s, PaymentCreated",
				header(r, "ce_id"), header(r, "content-type"), header(r, "ce_dataschema"), header(r, "ce_type"), wantSchema)
		}
	}
	s.stop()
}

// readValues reads n records of topic from its start.
func readValues(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation(),
		kgo.MetadataMinAge(250*time.Millisecond))
	ctx, cancel := context.WithTimeout(testenv.Context(t), time.Minute)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	if len(out) < n {
		t.Fatalf("read %d records of %s within a minute, want %d", len(out), topic, n)
	}
	return out
}

// paymentSchema is the Avro schema of the mismatch subtest's payloads, and
// paymentSchemaWider its next version, which also takes a string.
const (
	paymentSchema      = `{"type":"record","name":"Payment","namespace":"com.example","fields":[{"name":"n","type":"long"}]}`
	paymentSchemaWider = `{"type":"record","name":"Payment","namespace":"com.example","fields":[{"name":"n","type":["long","string"]}]}`
)

// insertPayments inserts one payment event per payload, each in its own
// transaction, and returns their ids.
func insertPayments(t *testing.T, e *env, payloads ...string) []string {
	t.Helper()
	var ids []string
	for i, p := range payloads {
		var id string
		if err := e.pool.QueryRow(testenv.Context(t), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('payment', $1, 'PaymentCreated', $2) RETURNING id::text`, fmt.Sprintf("a-%d", i), p).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// schemaMismatch: a payload that does not fit its schema is a bad event.
// Under dead-letter its dead-letter record names the path, the subject
// and the schema id, and the events around it go on; under fail the
// stream stops before it, and once the subject has a version that takes
// it, a restart delivers it.
func schemaMismatch(t *testing.T, reg *schemaRegistry) {
	t.Run("dead-letter", func(t *testing.T) {
		e := newEnv(t)
		subject := e.topic("payment") + "-value"
		id := reg.register(subject, schema.Avro, paymentSchema)
		s := e.start(reg.args("--value-format", "avro", "--on-bad-event", "dead-letter", "--dead-letter-topic", e.prefix+".dlq")...)
		e.waitStreaming()
		ids := insertPayments(t, e, `{"n": 1}`, `{"n": "two"}`, `{"n": 3}`)
		good := readValues(t, e.topic("payment"), 2)
		if header(good[0], "id") != ids[0] || header(good[1], "id") != ids[2] {
			t.Fatalf("the topic holds events %s and %s, want %s and %s", header(good[0], "id"), header(good[1], "id"), ids[0], ids[2])
		}
		dead := readValues(t, e.prefix+".dlq", 1)[0]
		reason := header(dead, "error")
		for _, want := range []string{"event " + ids[1], "at $.n", fmt.Sprintf("avro schema %d", id), `subject "` + subject + `", version 1`} {
			if !strings.Contains(reason, want) {
				t.Errorf("the dead-letter record's error %q lacks %q", reason, want)
			}
		}
		s.stop()
	})

	t.Run("fail, then the schema fixed", func(t *testing.T) {
		e := newEnv(t)
		subject := e.topic("payment") + "-value"
		reg.register(subject, schema.Avro, paymentSchema)
		s := e.start(reg.args("--value-format", "avro")...)
		e.waitStreaming()
		ids := insertPayments(t, e, `{"n": 1}`, `{"n": "two"}`, `{"n": 3}`)
		after := e.currentLSN()
		if err := s.exited(60 * time.Second); err == nil {
			t.Fatal("the streamer exited 0 after a payload that does not fit, under fail")
		}
		log := strings.ReplaceAll(s.logText(), `\"`, `"`)
		for _, want := range []string{"bad event " + ids[1] + " at LSN ", "at $.n", `subject "` + subject + `"`, "--on-bad-event=dead-letter"} {
			if !strings.Contains(log, want) {
				t.Fatalf("the error lacks %q:\n%s", want, log)
			}
		}
		if pending := e.pendingIDs(); len(pending) != 2 || pending[0] != ids[1] {
			t.Fatalf("the slot streams %v next, want the bad event %s and the one after it", pending, ids[1])
		}
		if confirmed, _ := e.slotLSNs(); confirmed >= after {
			t.Fatalf("the slot confirmed %d, past the bad event", confirmed)
		}

		reg.register(subject, schema.Avro, paymentSchemaWider)
		s = e.start(reg.args("--value-format", "avro")...)
		got := readValues(t, e.topic("payment"), 3)
		seen := map[string]bool{}
		for _, r := range got {
			seen[header(r, "id")] = true
		}
		for _, id := range ids {
			if !seen[id] {
				t.Fatalf("event %s is not in the topic after the fix (it holds %d records)", id, len(got))
			}
		}
		s.stop()
	})
}

// schemaSubjectDeleted: a subject deleted under the stream stops it
// once its latest version is asked for again, with an error naming the
// subject and what to do; nothing past the event is confirmed, and it is
// never written as raw JSON.
func schemaSubjectDeleted(t *testing.T, reg *schemaRegistry) {
	e := newEnv(t)
	subject := e.topic("payment") + "-value"
	reg.register(subject, schema.Avro, paymentSchema)
	s := e.start(reg.args("--value-format", "avro", "--schema-refresh", "200ms")...)
	e.waitStreaming()
	first := insertPayments(t, e, `{"n": 1}`)
	readValues(t, e.topic("payment"), 1)
	reg.deleteSubject(subject)

	// The latest version is asked again 200 ms after it was fetched: write
	// until the stream stops.
	var written []string
	deadline := time.Now().Add(60 * time.Second)
	for stopped := false; !stopped; {
		if time.Now().After(deadline) {
			s.dump()
			t.Fatalf("the streamer still runs 60 s after subject %s was deleted", subject)
		}
		written = append(written, insertPayments(t, e, fmt.Sprintf(`{"n": %d}`, len(written)+2))...)
		select {
		case err := <-s.done:
			stopped = true
			if err == nil {
				t.Fatal("the streamer exited 0 when its subject was deleted")
			}
		case <-time.After(100 * time.Millisecond):
		}
	}
	log := strings.ReplaceAll(s.logText(), `\"`, `"`)
	for _, want := range []string{"cannot be encoded", `no subject "` + subject + `"`, "register the schema under the subject again",
		"the stream stopped before this event"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the error lacks %q:\n%s", want, log)
		}
	}
	pending := e.pendingIDs()
	if len(pending) == 0 || pending[0] == first[0] {
		t.Fatalf("the slot streams %v next: want the event it stopped at, after %s", pending, first[0])
	}
	// Every event after the one it stopped at is pending; none is in the
	// topic as raw JSON.
	for _, r := range readValues(t, e.topic("payment"), 1) {
		if len(r.Value) == 0 || r.Value[0] != 0 {
			t.Fatalf("a record of the topic is not in the wire format: %q", r.Value)
		}
	}
}

// outageSchema is the JSON Schema of the workload's payloads; with JSON
// Schema the verifier reads the values' JSON after the wire header, and
// checks their order.
const outageSchema = `{"type":"object","properties":{"aggregate":{"type":"string"},"seq":{"type":"integer"}},"required":["aggregate","seq"]}`

// schemaRegistryOutage: the registry stopped and started again while
// writers run is no bad event: the stream waits (the metric says so, the
// log names the registry), nothing is missing once it is back, and the
// repeats are counted; in exactly-once delivery there are none, the
// Kafka transaction open when the stream reads again being aborted.
func schemaRegistryOutage(t *testing.T, reg *schemaRegistry, delivery string) {
	e := newEnv(t)
	reg.register(e.topic("payment")+"-value", schema.JSONSchema, outageSchema)
	// The latest version is asked for every 300 ms: the outage is felt
	// within a second, as a subject's refresh or a new subject would be.
	s := e.start(reg.args("--delivery", delivery, "--value-format", "json-schema", "--schema-refresh", "300ms", "--schema-registry-timeout", "1s")...)
	e.waitStreaming()
	addr := s.httpAddr()
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	wait := wl.writeConcurrently(t, ctx, 4000, 1, 1, 5)
	eventually(t, 60*time.Second, "events to flow before the outage", func() bool {
		return scrape(t, addr)[`cdc_outbox_events_total{kind="row",topic="`+e.topic("payment")+`"}`] >= 300
	})
	reg.control("stop")
	// One more writer while the registry is away, should the others be
	// done already: the stream needs the schema again for its events.
	eventually(t, 30*time.Second, "cdc_outbox_schema_registry_waiting to say the stream waits", func() bool {
		if err := wl.write(ctx, 3, 1, 1, "payment", false); err != nil {
			t.Fatal(err)
		}
		return scrape(t, addr)["cdc_outbox_schema_registry_waiting"] == 1
	})
	during := scrape(t, addr)[`cdc_outbox_events_total{kind="row",topic="`+e.topic("payment")+`"}`]
	reg.control("start")
	if url := reg.control("url"); url != reg.ccompat {
		t.Fatalf("the registry came back at %s, not at %s where the streamer looks for it", url, reg.ccompat)
	}
	wait()
	wl.mu.Lock()
	written := len(wl.events)
	wl.mu.Unlock()
	what := fmt.Sprintf("%s, registry stopped after %.0f events (the writers wrote on to %d) and started again", delivery, during, written)
	if delivery == "exactly-once" {
		wl.checkExactlyOnce([]string{"payment"}, what)
	} else {
		v, _ := wl.verify([]string{"payment"}, 3*time.Minute)
		t.Logf("verifier, %s: %s", what, v)
		if v.missing != 0 || v.orderViolations != 0 {
			t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
		}
	}
	eventually(t, 30*time.Second, "cdc_outbox_schema_registry_waiting back to 0", func() bool {
		return scrape(t, addr)["cdc_outbox_schema_registry_waiting"] == 0
	})
	m := scrape(t, addr)
	t.Logf("encode failures while the registry was away: %v; registry requests: latest %v ok, %v errors",
		m[`cdc_outbox_schema_encode_failures_total{outbox="public.outbox",reason="unavailable"}`],
		m[`cdc_outbox_schema_registry_requests_total{op="latest_version",result="ok"}`], m[`cdc_outbox_schema_registry_requests_total{op="latest_version",result="error"}`])
	if bad := m[`cdc_outbox_bad_events_total{action="failed",kind="row"}`] + m[`cdc_outbox_bad_events_total{action="dead_lettered",kind="row"}`]; bad != 0 {
		t.Fatalf("%v bad events: an outage is none", bad)
	}
	if log := s.logText(); !strings.Contains(log, "the schema registry cannot give an event's schema now") || !strings.Contains(log, reg.ccompat) {
		t.Fatalf("no warning naming the registry %s in the log", reg.ccompat)
	}
	s.stop()
}
