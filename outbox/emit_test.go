package outbox_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/internal/pgtest"
)

var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestEmit: Emit and EmitSQL write a transactional message of the prefix
// that a pgoutput slot, as the streamer reads it, decodes into the
// envelope of the event: its id (a version 7 UUID), fields, payload byte
// for byte, headers and the transaction's created_at. A rolled-back
// transaction's message is never decoded; an invalid event sends nothing.
func TestEmit(t *testing.T) {
	t.Parallel()
	url := setup(t)
	ctx := pgtest.Context(t)
	conn := pgtest.Connect(t, url)
	db := openSQL(t, url)
	slot := pgtest.Name("outbox")
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	ev := paymentEvent("pay-emit")
	ev.Headers = map[string]string{"traceparent": tp}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var start time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	id1, err := outbox.Emit(ctx, tx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Emit(ctx, tx, paymentEvent("pay-rolled-back")); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Emit(ctx, tx, outbox.Event{AggregateType: "pay/ment", AggregateID: "x", EventType: "E", Payload: json.RawMessage(`{}`)}); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Errorf("an invalid event: %v, want ErrInvalidEvent", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(outbox.Config{MessagePrefix: "billing_events"})
	if err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := w.EmitSQL(ctx, stx, paymentEvent("pay-emit-sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
	if !uuidV7.MatchString(id1) || !uuidV7.MatchString(id2) || id1 == id2 {
		t.Fatalf("event ids %q, %q: want two version 7 UUIDs", id1, id2)
	}

	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'cdc_outbox', 'messages', 'true')`, slot)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	var got []contract.Envelope
	var prefixes []string
	for _, m := range msgs {
		if m[0] != 'M' {
			continue
		}
		// flags, LSN, prefix, content length, content
		if m[1] != 1 {
			t.Errorf("message %q is not transactional", m)
		}
		rest := m[10:]
		nul := bytes.IndexByte(rest, 0)
		prefixes = append(prefixes, string(rest[:nul]))
		content := rest[nul+5:]
		if n := binary.BigEndian.Uint32(rest[nul+1:]); int(n) != len(content) {
			t.Fatalf("content length %d, %d bytes", n, len(content))
		}
		e, err := contract.ParseEnvelope(content)
		if err != nil {
			t.Fatalf("%s: %v", content, err)
		}
		got = append(got, e)
	}
	if len(got) != 2 || prefixes[0] != "cdc_outbox" || prefixes[1] != "billing_events" {
		t.Fatalf("decoded %d messages, prefixes %v; want the two committed, of cdc_outbox and billing_events", len(got), prefixes)
	}
	e := got[0]
	if e.ID != id1 || e.AggregateType != "payment" || e.AggregateID != "pay-emit" || e.EventType != "PaymentCreated" ||
		string(e.Payload) != string(ev.Payload) || string(e.Headers) != `{"traceparent":"`+tp+`"}` || !e.CreatedAt.Equal(start) {
		t.Errorf("envelope %+v (created_at %s), want event %s with the transaction's start %s", e, e.CreatedAt, id1, start)
	}
	if got[1].ID != id2 || got[1].AggregateID != "pay-emit-sql" || got[1].Headers != nil {
		t.Errorf("EmitSQL's envelope %+v", got[1])
	}
}
