package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/schema/internal/regtest"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// TestApicurio: the encoders against a real Apicurio Registry through its
// Confluent-compatible API: a schema of each format registered (the
// opt-in), payloads encoded and decoded back, a mismatch's path, the
// registry asked once per schema for many events, a deleted subject, and
// a registry stopped mid-test read as a retryable *RegistryError, never
// as a mismatch.
func TestApicurio(t *testing.T) {
	ctl, url := regtest.Start(t)
	c := &calls{}
	r, err := NewRegistry(RegistryConfig{URL: url, Observer: c, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Subjects of this run alone: a registry started by hand outlives runs.
	run := fmt.Sprintf("t%d", time.Now().UnixNano())
	topic := func(f Format) string { return run + "." + f.String() }

	texts := map[Format]string{Avro: paymentAvro, Protobuf: paymentProto, JSONSchema: paymentJSONSchema}
	encoders := map[Format]*Encoder{}
	for f, text := range texts {
		subject, _ := Subject(TopicName, topic(f), "")
		s, err := r.Register(ctx, subject, f, text)
		if err != nil {
			t.Fatalf("registering the %s schema: %v", f, err)
		}
		if s.ID <= 0 || s.Version != 1 {
			t.Errorf("registered %s: %+v", f, s)
		}
		encoders[f] = mustEncoder(t, r, Config{Format: f, Refresh: time.Hour})
	}

	avroPayload := `{"id":"p-1","amount":1200,"currency":"EUR","note":"hi","at":"2026-12-04T10:30:00Z","price":"12.30","payer":{"name":"Ann"},"ref":7}`
	protoPayload := `{"id":"p-1","amount":"1200","currency":"EUR","at":"2026-12-04T10:30:00Z","lines":[{"sku":"a","quantity":2}],"bySku":{"a":{"sku":"a","quantity":2}}}`
	jsonPayload := `{"id":"p-1","amount":1200,"lines":[{"sku":"a","quantity":2}]}`

	t.Run("round trip", func(t *testing.T) {
		before := c.total()
		for i := range 100 {
			v, s, err := encoders[Avro].Encode(ctx, Event{Topic: topic(Avro), Payload: []byte(avroPayload)})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				// The schema as the registry serves it, not as this test wrote it.
				text, err := mustClient(t, url).SchemaTextByID(ctx, s.ID)
				if err != nil {
					t.Fatal(err)
				}
				id, got := decodeAvro(t, v, text)
				if id != s.ID || got["id"] != "p-1" || got["amount"] != int64(1200) || unwrapUnion(got["note"]) != "hi" || unwrapUnion(got["ref"]) != int64(7) {
					t.Errorf("Avro decoded: id %d, %v", id, got)
				}
			}

			v, s, err = encoders[Protobuf].Encode(ctx, Event{Topic: topic(Protobuf), Payload: []byte(protoPayload)})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				id, rest, err := header.DecodeID(v)
				if err != nil || id != s.ID {
					t.Fatalf("Protobuf header: id %d, %v", id, err)
				}
				index, body, err := header.DecodeIndex(rest, 8)
				if err != nil || len(index) != 1 || index[0] != 0 {
					t.Fatalf("Protobuf indexes %v, %v", index, err)
				}
				text, _ := mustClient(t, url).SchemaTextByID(ctx, s.ID)
				pc := mustProto(t, text)
				md, _ := pc.message("")
				got, want := dynamicpb.NewMessage(md), dynamicpb.NewMessage(md)
				if err := proto.Unmarshal(body, got); err != nil {
					t.Fatal(err)
				}
				_ = protojson.Unmarshal([]byte(protoPayload), want)
				if !proto.Equal(got, want) {
					t.Errorf("Protobuf decoded %v, want %v", got, want)
				}
			}

			v, s, err = encoders[JSONSchema].Encode(ctx, Event{Topic: topic(JSONSchema), Payload: []byte(jsonPayload)})
			if err != nil {
				t.Fatal(err)
			}
			if id, body, err := header.DecodeID(v); err != nil || id != s.ID || string(body) != jsonPayload {
				t.Fatalf("JSON Schema value: id %d (want %d), %q, %v", id, s.ID, body, err)
			}
		}
		// Each subject's latest version once; its schema came with it.
		if n := c.total() - before; n != 3 {
			t.Errorf("300 events of 3 schemas cost %d registry calls, want 3: %v", n, c.get())
		}
	})

	t.Run("mismatch", func(t *testing.T) {
		for f, tc := range map[Format]struct{ payload, path string }{
			Avro:       {`{"id":"p","amount":1,"currency":"EUR","at":0,"price":"1","payer":{"name":7}}`, "$.payer.name"},
			Protobuf:   {`{"lines":[{"sku":"a"},{"quantity":"many"}]}`, "$.lines[1].quantity"},
			JSONSchema: {`{"id":"p","amount":1,"lines":[{"sku":"a"},{"quantity":2}]}`, "$.lines[1]"},
		} {
			_, _, err := encoders[f].Encode(ctx, Event{Topic: topic(f), Payload: []byte(tc.payload)})
			var me *MismatchError
			if !errors.As(err, &me) || me.Path != tc.path || me.Subject != topic(f)+"-value" || me.Version != 1 || me.SchemaID <= 0 {
				t.Errorf("%s: %v; want a mismatch at %s naming subject, id and version", f, err, tc.path)
			}
		}
	})

	t.Run("deleted subject", func(t *testing.T) {
		subject := run + ".deleted-value"
		if _, err := r.Register(ctx, subject, Avro, orderV1); err != nil {
			t.Fatal(err)
		}
		e := mustEncoder(t, r, Config{Format: Avro, Refresh: time.Nanosecond})
		ev := Event{Topic: run + ".deleted", Payload: []byte(`{"id":"o","total":1}`)}
		if _, _, err := e.Encode(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if _, err := mustClient(t, url).DeleteSubject(ctx, subject, sr.SoftDelete); err != nil {
			t.Fatal(err)
		}
		_, _, err := e.Encode(ctx, ev)
		var nf *NotFoundError
		if !errors.As(err, &nf) || nf.Subject != subject || Retryable(err) {
			t.Errorf("after deleting %s: %v; want a *NotFoundError, not retryable", subject, err)
		}
	})

	t.Run("registry stopped", func(t *testing.T) {
		ctl("stop")
		// Cached schemas need no registry.
		if _, _, err := encoders[Avro].Encode(ctx, Event{Topic: topic(Avro), Payload: []byte(avroPayload)}); err != nil {
			t.Errorf("a cached schema with the registry stopped: %v", err)
		}
		// A version not fetched yet, and a bad payload for it: the
		// registry's absence, not the payload, is the error.
		_, _, err := encoders[Avro].Encode(ctx, Event{Topic: topic(Avro), Version: 2, Payload: []byte(`{"amount":"bad"}`)})
		var re *RegistryError
		var me *MismatchError
		if !errors.As(err, &re) || errors.As(err, &me) || re.Status != 0 || !Retryable(err) || !strings.HasPrefix(re.URL, url) {
			t.Errorf("registry stopped: %v; want a retryable *RegistryError naming %s, no status", err, url)
		}
	})
}

func mustClient(t *testing.T, url string) *sr.Client {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
