package schema

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// calls counts a Registry's requests by op.
type calls struct {
	mu     sync.Mutex
	n      map[string]int
	failed int
}

func (c *calls) RegistryCall(op string, _ time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
	if err != nil {
		c.failed++
	}
}

func (c *calls) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

func (c *calls) failures() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *calls) total() int {
	n := 0
	for _, v := range c.get() {
		n += v
	}
	return n
}

const orderV1 = `{"type":"record","name":"Order","namespace":"com.example","fields":[{"name":"id","type":"string"},{"name":"total","type":"long"}]}`
const orderV2 = `{"type":"record","name":"Order","namespace":"com.example","fields":[{"name":"id","type":"string"},{"name":"total","type":"long"},{"name":"note","type":["null","string"],"default":null}]}`

// fakeRegistry is srfake's registry with a Registry on it whose clock the
// test moves.
func fakeRegistry(t testing.TB, cfg RegistryConfig, opts ...srfake.Option) (*srfake.Registry, *Registry, *calls, *time.Time) {
	t.Helper()
	fake := srfake.New(opts...)
	t.Cleanup(fake.Close)
	c := &calls{}
	cfg.URL, cfg.Observer = fake.URL(), c
	r, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	r.now = func() time.Time { return now }
	return fake, r, c, &now
}

func mustEncoder(t testing.TB, r *Registry, cfg Config) *Encoder {
	t.Helper()
	e, err := NewEncoder(r, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func decodeAvro(t *testing.T, value []byte, text string) (int, map[string]any) {
	t.Helper()
	id, body, err := header.DecodeID(value)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(avro.MustParse(text), body, &got); err != nil {
		t.Fatal(err)
	}
	return id, got
}

// TestEncodeOncePerSchema: a thousand events of one subject cost one
// request, until the latest version is older than Refresh; a new latest
// version is then used from the next request on.
func TestEncodeOncePerSchema(t *testing.T) {
	fake, r, c, now := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
	e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Minute})
	ctx := context.Background()
	for i := range 1000 {
		v, s, err := e.Encode(ctx, Event{Topic: "orders", EventType: "OrderPlaced", Payload: fmt.Appendf(nil, `{"id":"o-%d","total":%d}`, i, i)})
		if err != nil {
			t.Fatal(err)
		}
		if s != (Schema{ID: 11, Subject: "orders-value", Version: 1, Format: Avro}) {
			t.Fatalf("schema %+v", s)
		}
		if id, got := decodeAvro(t, v, orderV1); id != 11 || got["id"] != fmt.Sprintf("o-%d", i) || got["total"] != int64(i) {
			t.Fatalf("decoded id %d, %v", id, got)
		}
	}
	if got := c.get(); got[OpLatestVersion] != 1 || c.total() != 1 {
		t.Fatalf("registry calls for 1000 events of one schema: %v, want one latest_version", got)
	}

	fake.SeedSchema("orders-value", 2, 12, sr.Schema{Schema: orderV2})
	*now = now.Add(59 * time.Second)
	if _, s, _ := e.Encode(ctx, Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)}); s.ID != 11 {
		t.Errorf("before Refresh passed: schema %d, want 11 still", s.ID)
	}
	*now = now.Add(time.Second)
	v, s, err := e.Encode(ctx, Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1,"note":"n"}`)})
	if err != nil || s.ID != 12 || s.Version != 2 {
		t.Fatalf("after Refresh: %+v, %v; want id 12, version 2", s, err)
	}
	if _, got := decodeAvro(t, v, orderV2); unwrapUnion(got["note"]) != "n" {
		t.Errorf("decoded %v", got)
	}
	if got := c.get(); got[OpLatestVersion] != 2 || c.total() != 2 {
		t.Errorf("registry calls: %v, want two latest_version", got)
	}
}

// TestEncodeByVersionAndID: a version or an id, named by the configuration
// or by the event, is asked for once and kept.
func TestEncodeByVersionAndID(t *testing.T) {
	fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
	fake.SeedSchema("orders-value", 2, 12, sr.Schema{Schema: orderV2})
	ctx := context.Background()
	pinned := mustEncoder(t, r, Config{Format: Avro, Version: 1})
	latest := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour})
	for range 10 {
		if _, s, err := pinned.Encode(ctx, Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)}); err != nil || s.ID != 11 || s.Version != 1 {
			t.Fatalf("pinned version 1: %+v, %v", s, err)
		}
		if _, s, err := latest.Encode(ctx, Event{Topic: "orders", Version: 1, Payload: []byte(`{"id":"o","total":1}`)}); err != nil || s.ID != 11 {
			t.Fatalf("event naming version 1: %+v, %v", s, err)
		}
		if _, s, err := latest.Encode(ctx, Event{Topic: "orders", ID: 12, Payload: []byte(`{"id":"o","total":1}`)}); err != nil || s.ID != 12 || s.Subject != "" {
			t.Fatalf("event naming id 12: %+v, %v", s, err)
		}
	}
	if got := c.get(); got[OpSubjectVersion] != 1 || got[OpSchemaByID] != 1 || c.total() != 2 {
		t.Errorf("registry calls: %v, want one subject_version and one schema_by_id", got)
	}
}

// TestEncodeMismatchError: the error names the subject, the schema's id and
// version, and where the payload went wrong; it is not retryable.
func TestEncodeMismatchError(t *testing.T) {
	fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("orders-value", 3, 13, sr.Schema{Schema: orderV1})
	e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour})
	_, _, err := e.Encode(context.Background(), Event{Topic: "orders", Payload: []byte(`{"id":"o","total":"12"}`)})
	var me *MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("got %v, want a *MismatchError", err)
	}
	want := MismatchError{Subject: "orders-value", SchemaID: 13, Version: 3, Format: Avro, Path: "$.total", Reason: "want long, got a string"}
	if *me != want {
		t.Errorf("got %+v\nwant %+v", *me, want)
	}
	if Retryable(err) {
		t.Error("a mismatch is retryable")
	}
	if s := err.Error(); !strings.Contains(s, `subject "orders-value"`) || !strings.Contains(s, "schema 13") || !strings.Contains(s, "version 3") || !strings.Contains(s, "$.total") {
		t.Errorf("message %q lacks a fact", s)
	}
}

// TestEncodeSubjectDeleted: a subject deleted under the encoder is a
// *NotFoundError once the latest version is asked again: a stop, not a
// retry, and never the old schema or the raw JSON.
func TestEncodeSubjectDeleted(t *testing.T) {
	fake, r, _, now := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
	e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Minute})
	ctx := context.Background()
	ev := Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)}
	if _, _, err := e.Encode(ctx, ev); err != nil {
		t.Fatal(err)
	}
	client, _ := sr.NewClient(sr.URLs(fake.URL()))
	if _, err := client.DeleteSubject(ctx, "orders-value", sr.SoftDelete); err != nil {
		t.Fatal(err)
	}
	*now = now.Add(time.Minute)
	v, _, err := e.Encode(ctx, ev)
	var nf *NotFoundError
	// Registries differ in the code: srfake says the subject has no
	// version (40402), Apicurio that there is no subject (40401).
	if !errors.As(err, &nf) || nf.Subject != "orders-value" || (nf.Code != 40401 && nf.Code != 40402) || v != nil {
		t.Fatalf("after the subject's deletion: %q, %v; want a *NotFoundError for orders-value", v, err)
	}
	if Retryable(err) {
		t.Error("a deleted subject is retryable")
	}
	if _, _, err := e.Encode(ctx, Event{Topic: "orders", Version: 9, Payload: ev.Payload}); !errors.As(err, &nf) || nf.Version != 9 {
		t.Errorf("a version that does not exist: %v; want a *NotFoundError naming version 9", err)
	}
	if _, _, err := e.Encode(ctx, Event{Topic: "orders", ID: 99, Payload: ev.Payload}); !errors.As(err, &nf) || nf.ID != 99 || nf.Code != 40403 {
		t.Errorf("an id that does not exist: %v; want a *NotFoundError naming id 99", err)
	}
}

// TestEncodeRegistryFaults: a registry that is gone, slow, failing or
// refusing the credentials is a retryable *RegistryError with the URL and
// the status, never a mismatch.
func TestEncodeRegistryFaults(t *testing.T) {
	ev := Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)}
	ctx := context.Background()
	check := func(t *testing.T, err error, status int, retryable bool, text string) {
		t.Helper()
		var re *RegistryError
		if !errors.As(err, &re) {
			t.Fatalf("got %v, want a *RegistryError", err)
		}
		var me *MismatchError
		if errors.As(err, &me) {
			t.Fatalf("a registry fault reads as a mismatch: %v", err)
		}
		if re.Status != status || Retryable(err) != retryable || !strings.Contains(err.Error(), text) || !strings.HasPrefix(re.URL, "http://127.0.0.1:") {
			t.Errorf("got %v (status %d, retryable %v, URL %s); want status %d, retryable %v, %q", err, re.Status, Retryable(err), re.URL, status, retryable, text)
		}
	}
	t.Run("gone", func(t *testing.T) {
		fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
		fake.Close()
		_, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev)
		check(t, err, 0, true, "no response")
		if n := c.failures(); n != 1 {
			t.Errorf("observer saw %d failed calls, want 1", n)
		}
	})
	t.Run("slow", func(t *testing.T) {
		fake, r, _, _ := fakeRegistry(t, RegistryConfig{Timeout: 100 * time.Millisecond})
		fake.Intercept(func(w http.ResponseWriter, req *http.Request) bool {
			<-req.Context().Done() // answers only when the client gave up
			return true
		})
		_, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev)
		check(t, err, 0, true, "no answer within 100ms")
	})
	t.Run("failing", func(t *testing.T) {
		fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
		fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error_code":50003,"message":"forwarding failed"}`)
			return true
		})
		_, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev)
		check(t, err, 503, true, "HTTP 503 Service Unavailable: forwarding failed")
	})
	t.Run("bad request", func(t *testing.T) {
		fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
		fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			w.WriteHeader(http.StatusNotFound) // a wrong base URL: no registry error code
			return true
		})
		_, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev)
		check(t, err, 404, false, "HTTP 404")
	})
	for name, cfg := range map[string]RegistryConfig{
		"no credentials":   {},
		"wrong token":      {BearerToken: "wrong"},
		"wrong basic auth": {Username: "u", Password: "wrong"},
	} {
		t.Run(name, func(t *testing.T) {
			fake, r, _, _ := fakeRegistry(t, cfg, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte("u:p"))))
			fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
			_, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev)
			status := http.StatusForbidden
			if cfg == (RegistryConfig{}) {
				status = http.StatusUnauthorized
			}
			check(t, err, status, true, fmt.Sprintf("HTTP %d", status))
		})
	}
	t.Run("right basic auth", func(t *testing.T) {
		fake, r, _, _ := fakeRegistry(t, RegistryConfig{Username: "u", Password: "p"}, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte("u:p"))))
		fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
		if _, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("right token", func(t *testing.T) {
		fake, r, _, _ := fakeRegistry(t, RegistryConfig{BearerToken: "t0k"}, srfake.WithAuth("Bearer t0k"))
		fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
		if _, _, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(ctx, ev); err != nil {
			t.Fatal(err)
		}
	})
}

// TestEncodeProtobufByRecordName: under the record name strategy the
// subject is the message's full name (the event type in the namespace),
// and that message is encoded, its indexes in the header.
func TestEncodeProtobufByRecordName(t *testing.T) {
	fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("com.example.PaymentRefunded", 1, 21, sr.Schema{Schema: paymentProto, Type: sr.TypeProtobuf})
	e := mustEncoder(t, r, Config{Format: Protobuf, Strategy: RecordName, Namespace: "com.example", Refresh: time.Hour})
	v, s, err := e.Encode(context.Background(), Event{Topic: "payments", EventType: "PaymentRefunded", Payload: []byte(`{"id":"p","amount":"5"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if s.Subject != "com.example.PaymentRefunded" || s.ID != 21 {
		t.Errorf("schema %+v", s)
	}
	if want := []byte{0, 0, 0, 0, 21, 2, 2}; string(v[:len(want)]) != string(want) {
		t.Errorf("header % x, want % x (id 21, indexes [1])", v[:len(want)], want)
	}
	_, _, err = e.Encode(context.Background(), Event{Topic: "payments", EventType: "PaymentRefunded", RecordName: "PaymentVoided", Payload: []byte(`{}`)})
	var nf *NotFoundError
	if !errors.As(err, &nf) || nf.Subject != "com.example.PaymentVoided" {
		t.Errorf("a record name column naming another subject: %v", err)
	}
}

// TestEncodeTopicStrategyProtobufMessage: under the topic strategy the
// first message is the default, and the event's record name picks another.
func TestEncodeTopicStrategyProtobufMessage(t *testing.T) {
	fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("payments-value", 1, 21, sr.Schema{Schema: paymentProto, Type: sr.TypeProtobuf})
	first := mustEncoder(t, r, Config{Format: Protobuf, Refresh: time.Hour})
	byType := mustEncoder(t, r, Config{Format: Protobuf, Refresh: time.Hour, MessageByRecordName: true})
	ctx := context.Background()
	ev := Event{Topic: "payments", EventType: "PaymentRefunded", Payload: []byte(`{"id":"p","amount":"5"}`)}
	if v, _, err := first.Encode(ctx, ev); err != nil || v[5] != 0 {
		t.Errorf("first message: % x, %v; want index byte 0", v, err)
	}
	if v, _, err := byType.Encode(ctx, ev); err != nil || v[5] != 2 || v[6] != 2 {
		t.Errorf("message by event type: % x, %v; want indexes [1]", v, err)
	}
	ev.EventType = "PaymentVoided"
	_, _, err := byType.Encode(ctx, ev)
	var me *MismatchError
	if !errors.As(err, &me) || !strings.Contains(me.Reason, `no message "PaymentVoided"`) {
		t.Errorf("an event type that is no message: %v", err)
	}
}

func TestEncodeJSONSchemaKeepsPayload(t *testing.T) {
	fake, r, _, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("payments-value", 1, 31, sr.Schema{Schema: paymentJSONSchema, Type: sr.TypeJSON})
	e := mustEncoder(t, r, Config{Format: JSONSchema, Refresh: time.Hour})
	payload := `{"amount": 3, "id": "p"}`
	v, _, err := e.Encode(context.Background(), Event{Topic: "payments", Payload: []byte(payload)})
	if err != nil || string(v) != "\x00\x00\x00\x00\x1f"+payload {
		t.Errorf("got %q, %v; want the header then the payload unchanged", v, err)
	}
}

// TestEncodeUnusableSchema: a schema of another format than the outbox's,
// or one with references, is a *SchemaError, fetched once.
func TestEncodeUnusableSchema(t *testing.T) {
	fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("payments-value", 1, 31, sr.Schema{Schema: paymentJSONSchema, Type: sr.TypeJSON})
	fake.SeedSchema("address-value", 1, 40, sr.Schema{Schema: `{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}`})
	fake.SeedSchema("people-value", 1, 41, sr.Schema{
		Schema:     `{"type":"record","name":"Person","fields":[{"name":"home","type":"Address"}]}`,
		References: []sr.SchemaReference{{Name: "Address", Subject: "address-value", Version: 1}},
	})
	e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour})
	ctx := context.Background()
	var se *SchemaError
	for range 3 {
		if _, _, err := e.Encode(ctx, Event{Topic: "payments", Payload: []byte(`{}`)}); !errors.As(err, &se) || se.ID != 31 || !strings.Contains(err.Error(), "json-schema") {
			t.Errorf("a JSON schema for an Avro outbox: %v", err)
		}
		if _, _, err := e.Encode(ctx, Event{Topic: "people", Payload: []byte(`{}`)}); !errors.As(err, &se) || se.Subject != "people-value" || !strings.Contains(err.Error(), "references") {
			t.Errorf("a schema with references: %v", err)
		}
	}
	if c.total() != 2 {
		t.Errorf("registry calls %v, want 2: an unusable schema is kept like a usable one", c.get())
	}
}

// TestRegistryTLS: an https registry is trusted through the CA file; without
// it the certificate does not verify, which waiting does not change.
func TestRegistryTLS(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
	srv := httptest.NewTLSServer(fake.Handler())
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	ev := Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)}
	for _, c := range []struct {
		ca string
		ok bool
	}{{ca, true}, {"", false}} {
		r, err := NewRegistry(RegistryConfig{URL: srv.URL, CAFile: c.ca})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(context.Background(), ev)
		var re *RegistryError
		switch {
		case c.ok && err != nil:
			t.Errorf("with the CA file: %v", err)
		case !c.ok && (!errors.As(err, &re) || re.Status != 0 || Retryable(err)):
			t.Errorf("without the CA file: %v (retryable %v); want a *RegistryError, not retryable", err, Retryable(err))
		}
	}
}

func TestNewEncoderChecks(t *testing.T) {
	r, err := NewRegistry(RegistryConfig{URL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{
		{},
		{Format: Avro, Strategy: Strategy(9), Refresh: time.Second},
		{Format: Avro},
		{Format: Avro, Version: -1},
	} {
		if _, err := NewEncoder(r, cfg); err == nil {
			t.Errorf("NewEncoder took %+v", cfg)
		}
	}
	for _, cfg := range []RegistryConfig{{URL: "127.0.0.1:8081"}, {URL: "ftp://x"}, {URL: "http://x", Username: "u", BearerToken: "t"}, {URL: "http://x", CAFile: "/nonexistent"}} {
		if _, err := NewRegistry(cfg); err == nil {
			t.Errorf("NewRegistry took %+v", cfg)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&RegistryError{Status: 0}, true},
		{&RegistryError{Status: 401}, true},
		{&RegistryError{Status: 403}, true},
		{&RegistryError{Status: 408}, true},
		{&RegistryError{Status: 429}, true},
		{&RegistryError{Status: 500}, true},
		{&RegistryError{Status: 503}, true},
		{&RegistryError{Status: 400}, false},
		{&RegistryError{Status: 404}, false},
		{&RegistryError{Status: 422}, false},
		{fmt.Errorf("wrapped: %w", &RegistryError{Status: 502}), true},
		{&NotFoundError{Subject: "s"}, false},
		{&MismatchError{}, false},
		{&SchemaError{}, false},
		{errors.New("other"), false},
	} {
		if got := Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestRegisterFile: the opt-in registration reads the schema from a file
// and registers it under the subject; the encoder then writes by it.
func TestRegisterFile(t *testing.T) {
	fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
	path := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(path, []byte(orderV1), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := r.RegisterFile(context.Background(), "orders-value", Avro, path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := fake.GetSchema("orders-value", s.Version); !ok || got.ID != s.ID {
		t.Fatalf("registered %+v; the registry has %+v, %v", s, got, ok)
	}
	v, used, err := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour}).Encode(context.Background(), Event{Topic: "orders", Payload: []byte(`{"id":"o","total":1}`)})
	if err != nil || used.ID != s.ID {
		t.Fatalf("encoded by %+v, %v; want id %d", used, err, s.ID)
	}
	if id, _ := decodeAvro(t, v, orderV1); id != s.ID {
		t.Errorf("header id %d, want %d", id, s.ID)
	}
	if got := c.get(); got[OpRegister] != 1 {
		t.Errorf("registry calls %v, want one register", got)
	}
	if _, err := r.RegisterFile(context.Background(), "orders-value", Avro, filepath.Join(t.TempDir(), "missing.avsc")); err == nil {
		t.Error("registered a file that does not exist")
	}
}

// TestEncodeConcurrently: one Encoder (and its Registry) used by several
// goroutines at once, under the race detector, each value right.
func TestEncodeConcurrently(t *testing.T) {
	fake, r, c, _ := fakeRegistry(t, RegistryConfig{})
	fake.SeedSchema("orders-value", 1, 11, sr.Schema{Schema: orderV1})
	fake.SeedSchema("refunds-value", 1, 12, sr.Schema{Schema: orderV1})
	e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Hour})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			topic := []string{"orders", "refunds"}[g%2]
			for i := range 100 {
				v, s, err := e.Encode(context.Background(), Event{Topic: topic, Payload: fmt.Appendf(nil, `{"id":"%d-%d","total":%d}`, g, i, i)})
				if err != nil {
					errs <- err
					return
				}
				if id, body, err := header.DecodeID(v); err != nil || id != s.ID || len(body) == 0 {
					errs <- fmt.Errorf("value % x: id %d, want %d (%v)", v, id, s.ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Goroutines missing the same entry at once may each ask; never more
	// than once per goroutine and subject.
	if n := c.total(); n < 2 || n > 8 {
		t.Errorf("%d registry calls for 800 events of 2 subjects by 8 goroutines, want 2 to 8", n)
	}
}
