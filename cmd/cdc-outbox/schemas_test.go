package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// TestValidateValues: the value format's settings are checked at start,
// each message naming the flag (or the entry) and what to change.
func TestValidateValues(t *testing.T) {
	schemaFile := filepath.Join(t.TempDir(), "payment.avsc")
	if err := os.WriteFile(schemaFile, []byte(`{"type":"record","name":"P","fields":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	const url = "http://127.0.0.1:8081"
	for _, tc := range []struct {
		name string
		edit func(c *runConfig)
		want []string // each must be in the error; none means valid
	}{
		{"raw by default", func(c *runConfig) {}, nil},
		{"avro with a registry", func(c *runConfig) { c.Value.Format, c.Registry.URL = "avro", url }, nil},
		{"protobuf by event type, CloudEvents binary", func(c *runConfig) {
			c.Value.Format, c.Value.ProtobufMessage, c.Registry.URL = "protobuf", "event-type", url
			c.Mapping.Format = mapping.FormatCloudEventsBinary
		}, nil},
		{"registering a file under the topic's subject", func(c *runConfig) {
			c.Value.Format, c.Registry.URL, c.Mapping.Topic, c.Value.RegisterFile = "avro", url, "payments", schemaFile
		}, nil},
		{"unknown format", func(c *runConfig) { c.Value.Format = "thrift" },
			[]string{`--value-format "thrift": use raw, avro, protobuf or json-schema`}},
		{"no registry", func(c *runConfig) { c.Value.Format = "json-schema" },
			[]string{"--value-format avro, protobuf or json-schema needs --schema-registry-url"}},
		{"a registry for nothing", func(c *runConfig) { c.Registry.URL = url },
			[]string{"--schema-registry-url is given, but no outbox has a --value-format that uses it"}},
		{"structured CloudEvents", func(c *runConfig) {
			c.Value.Format, c.Registry.URL, c.Mapping.Format = "avro", url, mapping.FormatCloudEventsStructured
		}, []string{"--value-format avro with record-format cloudevents-structured: a structured CloudEvent carries its data in a JSON envelope"}},
		{"strategy, pins and refresh", func(c *runConfig) {
			c.Value.Format, c.Registry.URL = "avro", url
			c.Value.Strategy, c.Value.ID, c.Value.Version, c.Value.Refresh = "record-name", 3, 2, 0
		}, []string{`unknown subject naming strategy "record-name" (topic, record, topic-record)`, "schema-id 3 and schema-version 2: pin one"}},
		{"refresh of the latest", func(c *runConfig) { c.Value.Format, c.Registry.URL, c.Value.Refresh = "avro", url, 0 },
			[]string{"schema-refresh 0s: must be positive"}},
		{"protobuf message for avro", func(c *runConfig) {
			c.Value.Format, c.Registry.URL, c.Value.ProtobufMessage = "avro", url, "event-type"
		}, []string{"schema-protobuf-message event-type is for --value-format protobuf"}},
		{"register without a subject", func(c *runConfig) {
			c.Value.Format, c.Registry.URL, c.Value.RegisterFile = "avro", url, schemaFile
		}, []string{"schema-register-file needs schema-register-subject"}},
		{"register for raw", func(c *runConfig) { c.Value.RegisterFile = schemaFile },
			[]string{"is raw, but --schema-register-file"}},
		{"two ways to authenticate", func(c *runConfig) {
			c.Value.Format, c.Registry.URL = "avro", url
			c.Registry.Username, c.Registry.PasswordFile, c.Registry.BearerTokenFile = "cdc", "/pw", "/token"
		}, []string{"give one way to authenticate"}},
		{"user without a password", func(c *runConfig) {
			c.Value.Format, c.Registry.URL, c.Registry.Username = "avro", url, "cdc"
		}, []string{"--schema-registry-username needs --schema-registry-password-file"}},
		{"credentials in the URL", func(c *runConfig) {
			c.Value.Format, c.Registry.URL = "avro", "https://cdc:"+secretPassword+"@registry:8081"
		},
			[]string{"--schema-registry-url https://cdc:xxxxx@registry:8081 holds credentials"}},
		{"not a URL", func(c *runConfig) { c.Value.Format, c.Registry.URL = "avro", "registry:8081" },
			[]string{`--schema-registry-url "registry:8081"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := withKafkaSecurity(t, tc.edit).validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("validate() = %v, want nil", err)
				}
				return
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("validate() = %v\nwant it to contain %q", err, w)
				}
			}
			if err != nil && strings.Contains(err.Error(), secretPassword) {
				t.Errorf("validate() quotes the password: %v", err)
			}
		})
	}
}

// TestValueKeysOfAnOutbox: an outboxes entry sets its own value format,
// with integers and durations typed as YAML; the flags are the defaults of
// what it leaves out, and a mistyped value names the line. (An entry in a
// CloudEvents format without a source has each table's identity as its
// source, which is valid.)
func TestValueKeysOfAnOutbox(t *testing.T) {
	var c runConfig
	f := runFlags(&c)
	path := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	doc := `schema-registry-url: http://127.0.0.1:8081
outboxes:
  - table: billing.outbox
    value-format: avro
    schema-version: 3
    schema-refresh: 30s
  - table: audit.outbox
    record-format: cloudevents-binary
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.parse([]string{"--config", path, "--postgres-url", "postgres://db/app"}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	values, _ := c.values()
	if values[0].Format != "avro" || values[0].Version != 3 || values[0].Refresh != 30*time.Second || values[1].Format != valueRaw {
		t.Fatalf("values %+v", values)
	}

	bad := "outboxes:\n  - table: billing.outbox\n    schema-version: three\n    schema-refresh: 30\n"
	if _, err := f.parseConfigFile("x.yaml", []byte(bad)); err == nil ||
		!strings.Contains(err.Error(), `x.yaml:3: outboxes: schema-version: want an integer, got "three"`) ||
		!strings.Contains(err.Error(), "x.yaml:4: outboxes: schema-refresh: want a duration string") {
		t.Fatalf("err = %v", err)
	}
}

// TestEncodeFault: which schema error is the event's, the registry's
// passing fault, or a stop.
func TestEncodeFault(t *testing.T) {
	for _, tc := range []struct {
		err    error
		named  bool
		fault  pipeline.Fault
		reason string
	}{
		{&schema.MismatchError{Subject: "p-value", Path: "$.n"}, false, pipeline.FaultEvent, "mismatch"},
		{&schema.SubjectError{Topic: "p", Err: errors.New("no record name")}, false, pipeline.FaultEvent, "subject"},
		{&schema.NotFoundError{Subject: "p-value", Version: 9, Code: 40402}, true, pipeline.FaultEvent, "not_found"},
		{&schema.NotFoundError{Subject: "p-value", Code: 40401}, false, pipeline.FaultSchema, "not_found"},
		{&schema.SchemaError{ID: 3, Err: errors.New("does not compile")}, false, pipeline.FaultSchema, "schema"},
		{&schema.RegistryError{URL: "http://r", Err: errors.New("connection refused")}, false, pipeline.FaultUnavailable, "unavailable"},
		{&schema.RegistryError{URL: "http://r", Status: 401, Err: errors.New("unauthorized")}, false, pipeline.FaultUnavailable, "unavailable"},
		{&schema.RegistryError{URL: "http://r", Status: 503, Err: errors.New("unavailable")}, false, pipeline.FaultUnavailable, "unavailable"},
		{&schema.RegistryError{URL: "http://r", Status: 404, Err: errors.New("not found")}, false, pipeline.FaultSchema, "registry"},
	} {
		fault, reason := encodeFault(tc.err, tc.named)
		if fault != tc.fault || reason != tc.reason {
			t.Errorf("encodeFault(%v, %v) = %v %s, want %v %s", tc.err, tc.named, fault, reason, tc.fault, tc.reason)
		}
	}
}

// countingObserver counts what an encoder tells metrics.
type countingObserver struct {
	failed  map[string]int
	waiting []bool
}

func (o *countingObserver) RegistryCall(string, time.Duration, error)    {}
func (o *countingObserver) EncodeFailed(_, reason string)                { o.failed[reason]++ }
func (o *countingObserver) RegistryWaiting(w bool)                       { o.waiting = append(o.waiting, w) }
func (o *countingObserver) SchemaInUse(string, string, string, int, int) {}

// TestValueEncoderColumns: a row's version column that holds no positive
// integer is the row's fault, named; a registry that does not answer is
// waited for, and the metric says so. (The encoding itself is package
// schema's, tested against a real registry there and end to end.)
func TestValueEncoderColumns(t *testing.T) {
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := schema.NewEncoder(reg, schema.Config{Format: schema.Avro, Refresh: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	obs := &countingObserver{failed: map[string]int{}}
	spec := outboxSpec{Mapping: mapping.DefaultConfig()}
	e := newValueEncoder(context.Background(), enc, reg.URL(), schema.Avro, spec, valueConfig{VersionColumn: "schema_version"}, obs)
	if got := e.Columns(); len(got) != 1 || got[0] != "schema_version" {
		t.Fatalf("columns %q", got)
	}
	rec := &kgo.Record{Topic: "payment", Value: []byte(`{}`)}
	err = e.Encode(rec, pipeline.EncodeEvent{EventType: []byte("Created"), Columns: [][]byte{[]byte("v2")}})
	var ee *pipeline.EncodeError
	if !errors.As(err, &ee) || ee.Fault != pipeline.FaultEvent || !strings.Contains(err.Error(), `column "schema_version": "v2" is no schema version`) {
		t.Fatalf("err = %v, want the row's fault naming the column", err)
	}
	err = e.Encode(rec, pipeline.EncodeEvent{EventType: []byte("Created"), Columns: [][]byte{nil}})
	if !errors.As(err, &ee) || ee.Fault != pipeline.FaultUnavailable {
		t.Fatalf("err = %v, want the registry's passing fault", err)
	}
	if obs.failed["column"] != 1 || obs.failed["unavailable"] != 1 || len(obs.waiting) != 1 || !obs.waiting[0] {
		t.Fatalf("told %v and waiting %v", obs.failed, obs.waiting)
	}
}

// TestSetDataSchema: a CloudEvents binary record's content type becomes
// the format's and dataschema names the schema.
func TestSetDataSchema(t *testing.T) {
	rec := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("1")}, {Key: mapping.HeaderContentType, Value: []byte("application/json")}}}
	mapping.SetDataSchema(rec, []byte("application/avro"), []byte("http://r/schemas/ids/7"))
	if string(rec.Headers[1].Value) != "application/avro" || rec.Headers[2].Key != "ce_dataschema" || string(rec.Headers[2].Value) != "http://r/schemas/ids/7" {
		t.Fatalf("headers %v", rec.Headers)
	}
}
