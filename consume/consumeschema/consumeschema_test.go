package consumeschema_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeschema"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeschema/internal/pgtest"
	"github.com/cdc-outbox/cdc-outbox/consume/consumeschema/internal/regtest"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

const paymentAvro = `{"type":"record","name":"PaymentCreated","namespace":"com.example","fields":[
  {"name":"id","type":"string"},{"name":"amount","type":"long"},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"note","type":["null","string"],"default":null}]}`

const paymentProto = `syntax = "proto3";
package com.example;
message PaymentCreated {
  string id = 1;
  int64 amount = 2;
  repeated Line lines = 3;
  message Line { string sku = 1; int32 quantity = 2; }
}`

const paymentJSONSchema = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer"}},"required":["id","amount"]}`

// TestDecodedValues: records written by the schema encoder in each format
// (against a real Apicurio Registry, through a real Kafka) reach the
// handler as the JSON the service wrote; a repeated event is skipped by
// consume's dedupe; a plain JSON value (no wire format) is dead-lettered
// with the reason. Then, with the registry stopped, a consumer with no
// schema cached stops with consume.ErrUnavailable and dead-letters
// nothing.
func TestDecodedValues(t *testing.T) {
	ctl, url := regtest.Start(t)
	ctx := pgtest.Context(t)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run := pgtest.Name("pay")
	encode := func(f schema.Format, text, payload string) []byte {
		t.Helper()
		topic := run + "." + f.String()
		if _, err := reg.Register(ctx, topic+"-value", f, text); err != nil {
			t.Fatalf("registering the %s schema: %v", f, err)
		}
		enc, err := schema.NewEncoder(reg, schema.Config{Format: f, Refresh: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		v, _, err := enc.Encode(ctx, schema.Event{Topic: topic, Payload: []byte(payload)})
		if err != nil {
			t.Fatalf("encoding %s: %v", f, err)
		}
		return v
	}
	values := map[string][]byte{
		"ev-avro":  encode(schema.Avro, paymentAvro, `{"id":"p-1","amount":1200,"at":"2026-12-04T10:30:00Z","note":"hi"}`),
		"ev-proto": encode(schema.Protobuf, paymentProto, `{"id":"p-2","amount":7,"lines":[{"sku":"a","quantity":2}]}`),
		"ev-json":  encode(schema.JSONSchema, paymentJSONSchema, `{"id":"p-3","amount":9}`),
		"ev-plain": []byte(`{"id":"p-4","amount":1}`),
	}
	want := map[string]string{
		"ev-avro":  `{"id":"p-1","amount":1200,"at":"2026-12-04T10:30:00Z","note":"hi"}`,
		"ev-proto": `{"id":"p-2","amount":"7","lines":[{"sku":"a","quantity":2}]}`,
		"ev-json":  `{"id":"p-3","amount":9}`,
	}

	db := pgtest.Database(t)
	script, err := os.ReadFile("../../sql/processed_events.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, string(script))
	pgtest.Exec(t, db, `CREATE TABLE seen (event_id text NOT NULL, value jsonb NOT NULL, schema_id int NOT NULL, format text NOT NULL)`)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	topic, dlt := newTopic(t, "pay"), newTopic(t, "dlq")
	produce(t, topic, []string{"ev-avro", "ev-proto", "ev-json", "ev-plain", "ev-avro"}, values)

	handle := func(ctx context.Context, tx pgx.Tx, r *kgo.Record, v consumeschema.Value) error {
		_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4)`, header(r, consume.HeaderEventID), string(v.JSON), v.Schema.ID, v.Schema.Format.String())
		return err
	}
	var n outcomes
	cfg := consume.Config{
		Brokers: brokers(t), Group: pgtest.Name("grp"), Topics: []string{topic}, DB: pool,
		Handler:   consumeschema.Handler(schema.NewDecoder(reg), handle),
		OnFailure: consume.DeadLetter, DeadLetterTopic: dlt, MaxAttempts: 2, Backoff: 10 * time.Millisecond,
		Hooks: &n, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if err := run1(t, cfg, func() bool { return n.processed.Load()+n.duplicate.Load()+n.deadLettered.Load() == 5 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p, d, dl := n.processed.Load(), n.duplicate.Load(), n.deadLettered.Load(); p != 3 || d != 1 || dl != 1 {
		t.Errorf("processed %d, duplicates %d, dead-lettered %d; want 3, 1, 1", p, d, dl)
	}
	rows, _ := pool.Query(ctx, `SELECT event_id, value::text, format FROM seen`)
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([3]string, error) {
		var s [3]string
		return s, row.Scan(&s[0], &s[1], &s[2])
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("the handler saw %v, want the three encoded events once each", got)
	}
	for _, s := range got {
		// jsonb normalizes both sides.
		var equal bool
		if err := pool.QueryRow(ctx, `SELECT $1::jsonb = $2::jsonb`, s[1], want[s[0]]).Scan(&equal); err != nil || !equal {
			t.Errorf("%s (%s): the handler saw %s, want %s", s[0], s[2], s[1], want[s[0]])
		}
	}
	dead := readAll(t, dlt, 1)
	if id, e := header(dead[0], consume.HeaderEventID), header(dead[0], consume.HeaderError); id != "ev-plain" ||
		!strings.Contains(e, "not in the Confluent wire format") || string(dead[0].Value) != string(values["ev-plain"]) {
		t.Errorf("dead letter: id %s, error %q, value %s; want ev-plain's, not in the wire format", id, e, dead[0].Value)
	}

	t.Run("registry stopped", func(t *testing.T) {
		ctl("stop")
		cold, err := schema.NewRegistry(schema.RegistryConfig{URL: url, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var n outcomes
		cfg.Group, cfg.Hooks = pgtest.Name("grp"), &n
		cfg.Handler = consumeschema.Handler(schema.NewDecoder(cold), handle)
		err = run1(t, cfg, func() bool { return n.deadLettered.Load() > 0 })
		var re *consume.RecordError
		var rerr *schema.RegistryError
		if !errors.As(err, &re) || !errors.Is(err, consume.ErrUnavailable) || !errors.As(err, &rerr) || re.EventID != "ev-avro" {
			t.Fatalf("Run: %v; want a *consume.RecordError for ev-avro wrapping consume.ErrUnavailable and the registry's error", err)
		}
		t.Logf("Run: %v", err)
		if dl := n.deadLettered.Load(); dl != 0 {
			t.Errorf("%d records dead-lettered while the registry was down, want none", dl)
		}
	})
}

type outcomes struct{ processed, duplicate, deadLettered atomic.Int64 }

func (o *outcomes) Observe(ob consume.Observation) {
	switch ob.Outcome {
	case consume.Processed:
		o.processed.Add(1)
	case consume.Duplicate:
		o.duplicate.Add(1)
	case consume.DeadLettered:
		o.deadLettered.Add(1)
	}
}

func brokers(t *testing.T) []string {
	return strings.Split(pgtest.Require(t, "CDC_OUTBOX_TEST_KAFKA_BROKERS"), ",")
}

func client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers(t)...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// newTopic creates a one-partition topic of the test's own, deleted at
// cleanup.
func newTopic(t *testing.T, prefix string) string {
	t.Helper()
	name := pgtest.Name(prefix)
	adm := kadm.NewClient(client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
	return name
}

// produce writes the events in order, each with its id and a source, as
// cdc-outbox does.
func produce(t *testing.T, topic string, ids []string, values map[string][]byte) {
	t.Helper()
	rs := make([]*kgo.Record, len(ids))
	for i, id := range ids {
		rs[i] = &kgo.Record{Topic: topic, Key: []byte("k"), Value: values[id], Headers: []kgo.RecordHeader{
			{Key: consume.HeaderEventID, Value: []byte(id)}, {Key: consume.HeaderSource, Value: []byte("payments")}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := client(t).ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// run1 runs a consumer of cfg until done says so (then returns nil) or Run
// returns.
func run1(t *testing.T, cfg consume.Config, done func() bool) error {
	t.Helper()
	c, err := consume.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Run(ctx) }()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case err := <-res:
			return err
		case <-deadline:
			cancel()
			<-res
			t.Fatal("timed out waiting for the consumer")
		case <-time.After(20 * time.Millisecond):
			if done() {
				cancel()
				return <-res
			}
		}
	}
}

// readAll reads n records of topic from its start.
func readAll(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatalf("read %s: %v (got %d of %d records)", topic, err, len(got), n)
		}
		got = append(got, fs.Records()...)
	}
	return got
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
