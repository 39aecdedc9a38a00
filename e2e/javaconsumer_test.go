package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// registry starts Apicurio Registry through the control script that
// CDC_OUTBOX_TEST_REGISTRY_CTL names (scripts/with-servers.sh names
// scripts/apicurio.sh) for the test, and returns its Confluent-compatible
// URL and its own (v3) API's.
func registry(t *testing.T) (ccompat, v3 string) {
	t.Helper()
	ctl := testenv.RegistryCtl(t)
	run := func(arg string) string {
		out, err := exec.Command(ctl, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", ctl, arg, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("start")
	t.Cleanup(func() { run("stop") })
	ccompat = run("url")
	return ccompat, strings.Replace(ccompat, "/apis/ccompat/v7", "/apis/registry/v3", 1)
}

// javaConsumer builds e2e/javaconsumer (once per content of its pom and
// source, into .local/javaconsumer) and returns a function that runs it
// with the machine's Java.
func javaConsumer(t *testing.T) func(ctx context.Context, args ...string) ([]byte, error) {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"javaconsumer/pom.xml", "javaconsumer/src/main/java/cdcoutbox/Consume.java"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	local := os.Getenv("CDC_OUTBOX_LOCAL")
	if local == "" {
		local = "../.local"
	}
	dir, err := filepath.Abs(filepath.Join(local, "javaconsumer"))
	if err != nil {
		t.Fatal(err)
	}
	built := filepath.Join(dir, ".built-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(built); err != nil {
		if _, err := exec.LookPath("mvn"); err != nil {
			t.Fatal("Maven is needed once to build e2e/javaconsumer (Apicurio's deserializers from Maven Central); install it (e.g. 'apt-get install maven')")
		}
		_ = os.RemoveAll(dir)
		start := time.Now()
		out, err := exec.Command("mvn", "-q", "-B", "-f", "javaconsumer/pom.xml", "compile", "dependency:copy-dependencies",
			"-DincludeScope=runtime", "-Djavaconsumer.build="+dir).CombinedOutput()
		if err != nil {
			t.Fatalf("building e2e/javaconsumer: %v\n%s", err, out)
		}
		if err := os.WriteFile(built, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("built e2e/javaconsumer in %s", time.Since(start).Round(time.Second))
	}
	java := "java"
	if home := os.Getenv("JAVA_HOME"); home != "" {
		java = filepath.Join(home, "bin", "java")
	}
	classpath := filepath.Join(dir, "classes") + string(os.PathListSeparator) + filepath.Join(dir, "dependency", "*")
	return func(ctx context.Context, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, java, append([]string{"-cp", classpath, "cdcoutbox.Consume"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, fmt.Errorf("%v: %s", err, stderr.String())
		}
		return out, nil
	}
}

const javaAvroSchema = `{
  "type": "record", "name": "PaymentCreated", "namespace": "com.example",
  "fields": [
    {"name": "id", "type": "string"},
    {"name": "amount", "type": "long"},
    {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "attrs", "type": {"type": "map", "values": "int"}, "default": {}},
    {"name": "payer", "type": ["null", {"type": "record", "name": "Payer", "fields": [
      {"name": "name", "type": "string"},
      {"name": "iban", "type": ["null", "string"], "default": null}
    ]}], "default": null}
  ]
}`

const javaProtoSchema = `syntax = "proto3";
package com.example;

message PaymentCreated {
  string id = 1;
  int64 amount = 2;
  Currency currency = 3;
  repeated Line lines = 4;
  map<string, int32> attrs = 5;
  optional string note = 6;

  message Line {
    string sku = 1;
    int32 quantity = 2;
  }
}

enum Currency {
  CURRENCY_UNSPECIFIED = 0;
  EUR = 1;
  USD = 2;
}
`

const javaJSONSchema = `{
  "type": "object",
  "properties": {
    "id": {"type": "string"},
    "amount": {"type": "integer"},
    "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}}}}
  },
  "required": ["id", "amount"]
}`

// TestJavaConsumerReadsSchemaValues: values package schema wrote in the
// Confluent wire format, Avro, Protobuf and JSON Schema, produced to the
// real Kafka by schemas registered in the real Apicurio Registry, are read
// by a Java consumer with Apicurio's own deserializers (Maven Central),
// and it sees the payloads' values.
func TestJavaConsumerReadsSchemaValues(t *testing.T) {
	ccompat, v3 := registry(t)
	consume := javaConsumer(t)
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t)

	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: ccompat})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	prefix := testenv.Name("schemas")

	// write registers the schema under the topic's subject, encodes each
	// payload and produces it.
	write := func(t *testing.T, f schema.Format, text string, payloads []string) string {
		t.Helper()
		topic := prefix + "." + f.String()
		subject, _ := schema.Subject(schema.TopicName, topic, "")
		if _, err := reg.Register(ctx, subject, f, text); err != nil {
			t.Fatal(err)
		}
		enc, err := schema.NewEncoder(reg, schema.Config{Format: f, Refresh: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range payloads {
			v, _, err := enc.Encode(ctx, schema.Event{Topic: topic, EventType: "PaymentCreated", Payload: []byte(p)})
			if err != nil {
				t.Fatalf("encoding payload %d: %v", i, err)
			}
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "pay-%d", i), Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		return topic
	}
	// read runs the Java consumer for n values of topic, one JSON line each.
	read := func(t *testing.T, f schema.Format, topic string, n int, extra ...string) []string {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		out, err := consume(rctx, append([]string{strings.Join(brokers, ","), v3, f.String(), topic, fmt.Sprint(n), "90"}, extra...)...)
		if err != nil {
			t.Fatalf("the Java consumer: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != n {
			t.Fatalf("the Java consumer printed %d lines, want %d:\n%s", len(lines), n, out)
		}
		return lines
	}
	at := time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)

	t.Run("avro", func(t *testing.T) {
		payloads := []string{
			`{"id":"p-1","amount":1200,"currency":"EUR","at":"2026-12-04T10:30:00Z"}`,
			`{"id":"p-2","amount":-7,"currency":"USD","note":"refund","at":0,"tags":["a","b"],"attrs":{"x":1},"payer":{"name":"Ann","iban":"DE1"}}`,
			`{"id":"p-3","amount":9007199254740993,"currency":"EUR","note":{"string":"wrapped"},"at":1,"payer":{"com.example.Payer":{"name":"Bo"}}}`,
		}
		// GenericRecord prints itself as JSON: unions unwrapped, enums and
		// strings as strings, a timestamp-millis as its long.
		want := []string{
			fmt.Sprintf(`{"id":"p-1","amount":1200,"currency":"EUR","note":null,"at":%d,"tags":[],"attrs":{},"payer":null}`, at.UnixMilli()),
			`{"id":"p-2","amount":-7,"currency":"USD","note":"refund","at":0,"tags":["a","b"],"attrs":{"x":1},"payer":{"name":"Ann","iban":"DE1"}}`,
			`{"id":"p-3","amount":9007199254740993,"currency":"EUR","note":"wrapped","at":1,"tags":[],"attrs":{},"payer":{"name":"Bo","iban":null}}`,
		}
		topic := write(t, schema.Avro, javaAvroSchema, payloads)
		for i, line := range read(t, schema.Avro, topic, len(payloads)) {
			if !sameJSON(t, line, want[i]) {
				t.Errorf("record %d: the Java consumer read\n%s\nwant\n%s", i, line, want[i])
			}
		}
	})

	t.Run("protobuf", func(t *testing.T) {
		payloads := []string{
			`{"id":"p-1","amount":"1200","currency":"EUR"}`,
			// (Not "note":"": the field is proto3 optional, and Apicurio's
			// Java side reads the registry's text without the presence of
			// such a field, so an empty string written explicitly reads as
			// one not written; docs/schemas.md.)
			`{"id":"p-2","amount":-7,"currency":"USD","lines":[{"sku":"a","quantity":2},{"sku":"b"}],"attrs":{"x":1}}`,
			`{"id":"p-3","amount":"9007199254740993","note":"n"}`,
		}
		topic := write(t, schema.Protobuf, javaProtoSchema, payloads)
		md := compileMessage(t, javaProtoSchema, "com.example.PaymentCreated")
		for i, line := range read(t, schema.Protobuf, topic, len(payloads), "PaymentCreated") {
			got, want := dynamicpb.NewMessage(md), dynamicpb.NewMessage(md)
			if err := protojson.Unmarshal([]byte(line), got); err != nil {
				t.Fatalf("record %d: the Java consumer printed %s: %v", i, line, err)
			}
			if err := protojson.Unmarshal([]byte(payloads[i]), want); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("record %d: the Java consumer read\n%s\nwant the payload\n%s", i, line, payloads[i])
			}
		}
	})

	t.Run("json-schema", func(t *testing.T) {
		payloads := []string{
			`{"id":"p-1","amount":1200}`,
			`{"id":"p-2","amount":-7,"lines":[{"sku":"a","quantity":2}],"extra":{"deep":[1,2.5,null,true]}}`,
			`{"amount":3,"id":"p-3"}`,
		}
		topic := write(t, schema.JSONSchema, javaJSONSchema, payloads)
		for i, line := range read(t, schema.JSONSchema, topic, len(payloads)) {
			if !sameJSON(t, line, payloads[i]) {
				t.Errorf("record %d: the Java consumer read\n%s\nwant\n%s", i, line, payloads[i])
			}
		}
	})
}

// sameJSON says whether a and b are the same JSON value (numbers compared
// as written, so that a long past 2^53 is not rounded).
func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	decode := func(s string) any {
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("not JSON: %s: %v", s, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// compileMessage compiles a .proto text and returns the named message.
func compileMessage(t *testing.T, text, name string) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{"p.proto": text})}}
	files, err := c.Compile(context.Background(), "p.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName(protoreflect.FullName(name).Name())
	if md == nil {
		t.Fatalf("no message %s", name)
	}
	return md
}
