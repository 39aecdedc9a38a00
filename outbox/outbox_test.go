package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/cdc-outbox/cdc-outbox/outbox"
	"github.com/cdc-outbox/cdc-outbox/outbox/internal/pgtest"
	"github.com/cdc-outbox/cdc-outbox/outbox/topic"
)

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// setup returns a fresh database with the outbox table and publication of
// sql/publication.sql and a business table, payments.
func setup(t *testing.T) string {
	t.Helper()
	url := pgtest.Database(t)
	ddl, err := os.ReadFile("../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, string(ddl))
	pgtest.Exec(t, url, `CREATE TABLE payments (id text PRIMARY KEY, amount int NOT NULL)`)
	return url
}

func openSQL(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func paymentEvent(id string) outbox.Event {
	return outbox.Event{
		AggregateType: "payment",
		AggregateID:   id,
		EventType:     "PaymentCreated",
		Payload:       json.RawMessage(`{"amount": 1200, "currency": "EUR"}`),
	}
}

type row struct {
	aggType, aggID, eventType, payload string
	headers                            *string
}

func readRow(t *testing.T, conn *pgx.Conn, id string) (row, bool) {
	t.Helper()
	var r row
	err := conn.QueryRow(pgtest.Context(t), `SELECT aggregate_type, aggregate_id, event_type, payload::text, headers::text
		FROM outbox WHERE id::text = $1`, id).Scan(&r.aggType, &r.aggID, &r.eventType, &r.payload, &r.headers)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

func count(t *testing.T, conn *pgx.Conn, query string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(pgtest.Context(t), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The row has exactly the shape docs/records.md shows: the columns the streamer maps,
// headers as a jsonb object, and the event id returned.
func TestWritePgx(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	conn := pgtest.Connect(t, url)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ('pay-42', 1200)`); err != nil {
		t.Fatal(err)
	}
	e := paymentEvent("pay-42")
	e.Headers = outbox.WithTraceparent(outbox.ContextWithTraceparent(ctx, tp), map[string]string{"tenant": "acme"})
	id, err := outbox.Write(ctx, tx, e)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := outbox.Write(ctx, tx, paymentEvent("pay-42")) // no headers: NULL
	if err != nil {
		t.Fatal(err)
	}
	if id != "1" || id2 != "2" {
		t.Fatalf("event ids %q, %q: want the bigserial's 1 and 2, as text", id, id2)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	r, ok := readRow(t, conn, id)
	if !ok {
		t.Fatalf("event %s not in the table after commit", id)
	}
	if r.aggType != "payment" || r.aggID != "pay-42" || r.eventType != "PaymentCreated" ||
		r.payload != `{"amount": 1200, "currency": "EUR"}` || r.headers == nil ||
		*r.headers != `{"tenant": "acme", "traceparent": "`+tp+`"}` {
		t.Errorf("row = %+v (headers %v)", r, deref(r.headers))
	}
	if r, _ := readRow(t, conn, id2); r.headers != nil {
		t.Errorf("event without headers stored headers %q, want NULL", *r.headers)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}

func TestWriteSQL(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	db := openSQL(t, url)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO payments VALUES ('pay-7', 700)`); err != nil {
		t.Fatal(err)
	}
	e := paymentEvent("pay-7")
	e.Headers = map[string]string{"traceparent": tp}
	id, err := outbox.WriteSQL(ctx, tx, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r, ok := readRow(t, pgtest.Connect(t, url), id)
	if !ok || r.aggID != "pay-7" || r.payload != `{"amount": 1200, "currency": "EUR"}` || deref(r.headers) != `{"traceparent": "`+tp+`"}` {
		t.Errorf("row %s = %+v (found %v, headers %s)", id, r, ok, deref(r.headers))
	}
}

// The event exists if and only if the business write committed.
func TestRollbackLeavesNoRow(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	conn := pgtest.Connect(t, url)
	db := openSQL(t, url)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = tx.Exec(ctx, `INSERT INTO payments VALUES ('pay-1', 1)`)
	idPgx, err := outbox.Write(ctx, tx, paymentEvent("pay-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = stx.ExecContext(ctx, `INSERT INTO payments VALUES ('pay-2', 2)`)
	idSQL, err := outbox.WriteSQL(ctx, stx, paymentEvent("pay-2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Rollback(); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{idPgx, idSQL} {
		if _, ok := readRow(t, conn, id); ok {
			t.Errorf("event %s exists after its transaction rolled back", id)
		}
	}
	if n := count(t, conn, `SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM payments)`); n != 0 {
		t.Errorf("%d rows after rollback, want 0", n)
	}
}

// With DeleteAfterInsert the table stays empty, yet the insert reaches the
// WAL and the insert-only publication: a pgoutput slot on cdc_outbox, as
// the streamer uses, decodes one Insert and no Delete per event.
func TestDeleteAfterInsert(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	conn := pgtest.Connect(t, url)
	db := openSQL(t, url)
	slot := pgtest.Name("outbox")
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Config{DeleteAfterInsert: true})
	if err != nil {
		t.Fatal(err)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id1, err := w.Write(ctx, tx, paymentEvent("pay-del-pgx"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := w.WriteSQL(ctx, stx, paymentEvent("pay-del-sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if id1 != "1" || id2 != "2" {
		t.Errorf("event ids %q, %q: want the inserted rows' ids, 1 and 2", id1, id2)
	}
	if n := count(t, conn, `SELECT count(*) FROM outbox`); n != 0 {
		t.Errorf("outbox has %d rows after delete-after-insert, want 0", n)
	}

	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'cdc_outbox')`, slot)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	var inserts, deletes int
	for _, m := range msgs {
		switch m[0] {
		case 'I':
			inserts++
			if !bytes.Contains(m, []byte("pay-del-")) || !bytes.Contains(m, []byte(`"currency": "EUR"`)) {
				t.Errorf("decoded insert %q lacks the event's columns", m)
			}
		case 'D':
			deletes++
		}
	}
	if inserts != 2 || deletes != 0 {
		t.Errorf("the publication decoded %d inserts and %d deletes, want 2 and 0", inserts, deletes)
	}
}

// An invalid event is rejected before any statement: the transaction stays
// usable and nothing is written.
func TestInvalidEventRejected(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	conn := pgtest.Connect(t, url)
	db := openSQL(t, url)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := paymentEvent("pay-x")
	bad.Payload = json.RawMessage(`{"amount": 12`)
	if _, err := outbox.Write(ctx, tx, bad); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("pgx: invalid JSON: err = %v, want ErrInvalidPayload", err)
	}
	noType := paymentEvent("pay-x")
	noType.EventType = ""
	if _, err := outbox.Write(ctx, tx, noType); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Errorf("pgx: empty event type: err = %v, want ErrInvalidEvent", err)
	}
	badTopic := paymentEvent("pay-x")
	badTopic.AggregateType = "payments/eu"
	var te *topic.Error
	if _, err := outbox.Write(ctx, tx, badTopic); !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &te) {
		t.Errorf("pgx: aggregate type with a slash: err = %v, want ErrInvalidEvent and a *topic.Error", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ('pay-x', 1)`); err != nil {
		t.Fatalf("transaction unusable after a rejected event: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.WriteSQL(ctx, stx, bad); !errors.Is(err, outbox.ErrInvalidPayload) {
		t.Errorf("database/sql: invalid JSON: err = %v, want ErrInvalidPayload", err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, `SELECT count(*) FROM outbox`); n != 0 {
		t.Errorf("%d outbox rows after rejected events, want 0", n)
	}
}

// Table and column names are quoted identifiers, so any name works; the
// payload column may be json or text (stored byte for byte) as well as
// jsonb; and the string arguments work in pgx's simple protocol too (as
// behind PgBouncer).
func TestCustomNames(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	ctx := pgtest.Context(t)
	pgtest.Exec(t, url, `CREATE SCHEMA "Billing Ops";
		CREATE TABLE "Billing Ops"."Event ""Log""" (
			"event id" bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			"Type" text NOT NULL, "Key" text NOT NULL, "kind" text NOT NULL,
			"body" json NOT NULL, "meta" jsonb, "body text" text);`)
	cfg := outbox.Config{
		Table:               `"Billing Ops"."Event ""Log"""`,
		IDColumn:            "event id",
		AggregateTypeColumn: "Type",
		AggregateIDColumn:   "Key",
		EventTypeColumn:     "kind",
		PayloadColumn:       "body",
		HeadersColumn:       "meta",
		Topic:               "outbox.event.{Type}",
	}
	w, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PayloadColumn = "body text"
	cfg.HeadersColumn = "meta"
	wText, err := outbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// "body" is NOT NULL, so the text writer needs a default there.
	pgtest.Exec(t, url, `ALTER TABLE "Billing Ops"."Event ""Log""" ALTER "body" SET DEFAULT 'null'`)

	payload := json.RawMessage(`{"b": 2,   "a": [1, 2]}`)
	e := outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "OrderPlaced", Payload: payload,
		Headers: map[string]string{"x": "y"}}

	conn := pgtest.Connect(t, url)
	cfgSimple, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfgSimple.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	simple, err := pgx.ConnectConfig(ctx, cfgSimple)
	if err != nil {
		t.Fatal(err)
	}
	defer simple.Close(context.Background())
	db := openSQL(t, url)

	for _, c := range []*pgx.Conn{conn, simple} {
		for _, wr := range []*outbox.Writer{w, wText} {
			err := pgx.BeginTxFunc(ctx, c, pgx.TxOptions{}, func(tx pgx.Tx) error {
				_, err := wr.Write(ctx, tx, e)
				return err
			})
			if err != nil {
				t.Fatalf("pgx write: %v", err)
			}
		}
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	sqlID, err := w.WriteSQL(ctx, stx, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}

	rows, err := conn.Query(ctx, `SELECT "event id", "Type", "Key", "kind", "body"::text, coalesce("body text", ''), "meta"::text
		FROM "Billing Ops"."Event ""Log""" ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id int64
		var typ, key, kind, body, bodyText, meta string
		if err := rows.Scan(&id, &typ, &key, &kind, &body, &bodyText, &meta); err != nil {
			t.Fatal(err)
		}
		n++
		stored := body
		if n%2 == 0 && n < 5 { // the text writer's rows
			stored = bodyText
		}
		if typ != "order" || key != "o-1" || kind != "OrderPlaced" || stored != string(payload) || meta != `{"x": "y"}` {
			t.Errorf("row %d: %q %q %q body %q text %q meta %q", id, typ, key, kind, body, bodyText, meta)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 5 || sqlID != "5" {
		t.Errorf("%d rows, database/sql event id %q; want 5 rows, the last (id 5) from database/sql", n, sqlID)
	}
}

// Write returns the id as the streamer's "id" header carries it, for a uuid
// id column as for a bigserial one: through pgx, pgx in the simple protocol
// (PgBouncer) and database/sql, with and without DeleteAfterInsert (whose
// DELETE finds the row by that text).
func TestUUIDIDs(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	ctx := pgtest.Context(t)
	pgtest.Exec(t, url, `CREATE TABLE uuid_outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
		payload jsonb NOT NULL, headers jsonb)`)
	keep, err := outbox.New(outbox.Config{Table: "uuid_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	del, err := outbox.New(outbox.Config{Table: "uuid_outbox", DeleteAfterInsert: true})
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	cfgSimple, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfgSimple.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	simple, err := pgx.ConnectConfig(ctx, cfgSimple)
	if err != nil {
		t.Fatal(err)
	}
	defer simple.Close(context.Background())
	db := openSQL(t, url)

	uuidText := func(id string) bool {
		var parsed string
		err := conn.QueryRow(ctx, `SELECT $1::uuid::text`, id).Scan(&parsed)
		return err == nil && parsed == id
	}
	var kept []string
	for _, w := range []*outbox.Writer{keep, del} {
		for _, c := range []*pgx.Conn{conn, simple} {
			var id string
			err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				var err error
				id, err = w.Write(ctx, tx, paymentEvent("pay-u"))
				return err
			})
			if err != nil || !uuidText(id) {
				t.Fatalf("pgx write: id %q, %v; want a UUID's text", id, err)
			}
			if w == keep {
				kept = append(kept, id)
			}
		}
		stx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id, err := w.WriteSQL(ctx, stx, paymentEvent("pay-u"))
		if err != nil || !uuidText(id) {
			t.Fatalf("database/sql write: id %q, %v; want a UUID's text", id, err)
		}
		if err := stx.Commit(); err != nil {
			t.Fatal(err)
		}
		if w == keep {
			kept = append(kept, id)
		}
	}
	var left []string
	rows, err := conn.Query(ctx, `SELECT id::text FROM uuid_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	slices.Sort(kept)
	if !slices.Equal(left, kept) {
		t.Errorf("rows left %q, want exactly the 3 written without DeleteAfterInsert %q", left, kept)
	}
}
