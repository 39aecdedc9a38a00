package outboxschema_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox"
	"github.com/cdc-outbox/cdc-outbox/outbox/outboxschema"
	"github.com/cdc-outbox/cdc-outbox/outbox/outboxschema/internal/pgtest"
	"github.com/cdc-outbox/cdc-outbox/outbox/outboxschema/internal/regtest"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

const paymentAvro = `{"type":"record","name":"PaymentCreated","namespace":"com.example","fields":[
  {"name":"id","type":"string"},{"name":"amount","type":"long"},
  {"name":"payer","type":{"type":"record","name":"Payer","fields":[{"name":"name","type":"string"}]}}]}`

const paymentProto = `syntax = "proto3";
package com.example;
message PaymentCreated {
  string id = 1;
  int64 amount = 2;
  repeated Line lines = 3;
  message Line { string sku = 1; int32 quantity = 2; }
}`

const paymentJSONSchema = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer","minimum":0}},
  "required":["id","amount"],"additionalProperties":false}`

// TestCheckedBeforeCommit: against a real Apicurio Registry and a real
// PostgreSQL, an event whose payload fits its subject's schema is written
// and committed; one that does not is refused inside the transaction,
// before the insert, with the subject, the schema's id and version and
// the path of the mismatch, so that after COMMIT its row is absent. Then
// the registry is stopped: a cached schema still checks, an uncached one
// is ErrRegistryUnavailable (no row), or, under AllowWhenUnreachable, the
// event is written unchecked.
func TestCheckedBeforeCommit(t *testing.T) {
	ctl, url := regtest.Start(t)
	db := pgtest.Database(t)
	ddl, err := os.ReadFile("../../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, string(ddl))
	conn := pgtest.Connect(t, db)
	ctx := pgtest.Context(t)
	reg, err := schema.NewRegistry(schema.RegistryConfig{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ow, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Aggregate types (so topics and subjects) of this run alone: a
	// registry started by hand outlives runs.
	run := pgtest.Name("pay")

	cases := []struct {
		format    schema.Format
		text      string
		good, bad string
		path      string
	}{
		{schema.Avro, paymentAvro, `{"id":"p-1","amount":1200,"payer":{"name":"Ann"}}`, `{"id":"p-2","amount":1200,"payer":{"name":7}}`, "$.payer.name"},
		{schema.Protobuf, paymentProto, `{"id":"p-1","amount":"1200","lines":[{"sku":"a","quantity":2}]}`, `{"id":"p-2","lines":[{"sku":"a"},{"quantity":"many"}]}`, "$.lines[1].quantity"},
		{schema.JSONSchema, paymentJSONSchema, `{"id":"p-1","amount":1200}`, `{"id":"p-2","amount":-5}`, "$.amount"},
	}
	writers := map[schema.Format]*outboxschema.Writer{}
	for _, tc := range cases {
		aggregate := run + "_" + strings.ReplaceAll(tc.format.String(), "-", "_")
		subject := "outbox.event." + aggregate + "-value"
		registered, err := reg.Register(ctx, subject, tc.format, tc.text)
		if err != nil {
			t.Fatalf("registering the %s schema: %v", tc.format, err)
		}
		w, err := outboxschema.New(ow, reg, outboxschema.Config{Schema: schema.Config{Format: tc.format, Refresh: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		writers[tc.format] = w

		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(ctx, tx, event(aggregate, "p-1", tc.good)); err != nil {
			t.Fatalf("%s: a fitting event: %v", tc.format, err)
		}
		_, err = w.Write(ctx, tx, event(aggregate, "p-2", tc.bad))
		var me *schema.MismatchError
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &me) || me.Path != tc.path || me.Subject != subject ||
			me.SchemaID != registered.ID || me.Version != 1 {
			t.Errorf("%s: a payload that does not fit: %v\nwant ErrInvalidEvent and a mismatch at %s of subject %s, schema %d, version 1",
				tc.format, err, tc.path, subject, registered.ID)
		}
		t.Logf("%s: %v", tc.format, err)
		// Nothing reached the database: the transaction goes on and commits.
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("%s: commit after the refusal: %v", tc.format, err)
		}
		if ids := rows(t, conn, aggregate); len(ids) != 1 || ids[0] != "p-1" {
			t.Errorf("%s: rows after COMMIT %v, want only p-1's", tc.format, ids)
		}
	}

	t.Run("no subject", func(t *testing.T) {
		aggregate := run + "_unregistered"
		_, err := writers[schema.Avro].Write(ctx, mustBegin(t, conn), event(aggregate, "p-3", `{}`))
		var nf *schema.NotFoundError
		if !errors.As(err, &nf) || errors.Is(err, outbox.ErrInvalidEvent) || errors.Is(err, outboxschema.ErrRegistryUnavailable) {
			t.Errorf("an event of a subject never registered: %v; want a *schema.NotFoundError, neither invalid nor unavailable", err)
		}
	})

	t.Run("registry stopped", func(t *testing.T) {
		ctl("stop")
		avroAggregate := run + "_avro"
		// The schema is cached: the check needs no registry.
		tx := mustBegin(t, conn)
		if _, err := writers[schema.Avro].Write(ctx, tx, event(avroAggregate, "p-4", cases[0].good)); err != nil {
			t.Errorf("a cached schema with the registry stopped: %v", err)
		}
		// A service started now has nothing cached.
		cold, err := schema.NewRegistry(schema.RegistryConfig{URL: url, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		strict, _ := outboxschema.New(ow, cold, outboxschema.Config{Schema: schema.Config{Format: schema.Avro, Refresh: time.Hour}})
		_, err = strict.Write(ctx, tx, event(avroAggregate, "p-5", cases[0].good))
		var re *schema.RegistryError
		if !errors.Is(err, outboxschema.ErrRegistryUnavailable) || errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &re) || !strings.HasPrefix(re.URL, url) {
			t.Errorf("registry stopped, schema not cached: %v; want ErrRegistryUnavailable naming %s", err, url)
		}
		t.Logf("refused: %v", err)
		lenient, _ := outboxschema.New(ow, cold, outboxschema.Config{Schema: schema.Config{Format: schema.Avro, Refresh: time.Hour}, AllowWhenUnreachable: true})
		if _, err := lenient.Write(ctx, tx, event(avroAggregate, "p-6", cases[0].good)); err != nil {
			t.Errorf("AllowWhenUnreachable: %v, want the event written unchecked", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if ids := rows(t, conn, avroAggregate); strings.Join(ids, ",") != "p-1,p-4,p-6" {
			t.Errorf("rows %v, want p-1, p-4 (cached) and p-6 (allowed), not p-5 (refused)", ids)
		}
	})
}

func event(aggregate, id, payload string) outbox.Event {
	return outbox.Event{AggregateType: aggregate, AggregateID: id, EventType: "PaymentCreated", Payload: json.RawMessage(payload)}
}

func mustBegin(t *testing.T, conn *pgx.Conn) pgx.Tx {
	t.Helper()
	tx, err := conn.Begin(pgtest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// rows are the aggregate ids of the aggregate's outbox rows, in id order.
func rows(t *testing.T, conn *pgx.Conn, aggregate string) []string {
	t.Helper()
	rs, err := conn.Query(pgtest.Context(t), `SELECT aggregate_id FROM outbox WHERE aggregate_type = $1 ORDER BY id`, aggregate)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
