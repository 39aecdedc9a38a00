package outbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox/topic"
)

func TestValidateTraceparent(t *testing.T) {
	t.Parallel()
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{good, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", false}, // version 00 is exactly 55
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false}, // upper case
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", false}, // misplaced dash
		{"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false},
		{"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", false},
		{"", false},
	} {
		err := ValidateTraceparent(tc.s)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateTraceparent(%q) = %v, want ok=%v", tc.s, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidTraceparent) {
			t.Errorf("ValidateTraceparent(%q) = %v, want it to wrap ErrInvalidTraceparent", tc.s, err)
		}
	}
}

func TestWithTraceparent(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	bg := context.Background()

	if got := WithTraceparent(bg, nil); got != nil {
		t.Errorf("no traceparent in ctx: got %v, want nil (NULL headers)", got)
	}
	if _, ok := TraceparentFromContext(ContextWithTraceparent(bg, "garbage")); ok {
		t.Error("an invalid traceparent was stored in the context")
	}

	ctx := ContextWithTraceparent(bg, " "+tp+"\t")
	if got, ok := TraceparentFromContext(ctx); !ok || got != tp {
		t.Fatalf("TraceparentFromContext = %q, %v; want %q (trimmed)", got, ok, tp)
	}
	if got := WithTraceparent(ctx, nil); len(got) != 1 || got[TraceparentHeader] != tp {
		t.Errorf("WithTraceparent(nil) = %v", got)
	}
	in := map[string]string{"tenant": "t1"}
	got := WithTraceparent(ctx, in)
	if len(got) != 2 || got[TraceparentHeader] != tp || got["tenant"] != "t1" {
		t.Errorf("WithTraceparent = %v", got)
	}
	if len(in) != 1 {
		t.Errorf("WithTraceparent modified its argument: %v", in)
	}
	own := map[string]string{TraceparentHeader: "00-11111111111111111111111111111111-2222222222222222-00"}
	if got := WithTraceparent(ctx, own); got[TraceparentHeader] != own[TraceparentHeader] {
		t.Errorf("WithTraceparent replaced the caller's own traceparent: %v", got)
	}
}

// TestContextWithTraceContext: the tracestate travels with its
// traceparent; a bad one is left out, never stored.
func TestContextWithTraceContext(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	bg := context.Background()
	got := WithTraceparent(ContextWithTraceContext(bg, tp, " congo=t61rcWkgMzE,rojo=00f067aa0ba902b7 "), map[string]string{"tenant": "t1"})
	if len(got) != 3 || got[TraceparentHeader] != tp || got[TracestateHeader] != "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7" {
		t.Errorf("WithTraceparent = %v", got)
	}
	for _, bad := range []string{"", strings.Repeat("a=b,", 200), "a=\x01"} {
		if got := WithTraceparent(ContextWithTraceContext(bg, tp, bad), nil); len(got) != 1 || got[TraceparentHeader] != tp {
			t.Errorf("tracestate %q: WithTraceparent = %v, want the traceparent alone", bad, got)
		}
	}
	if _, ok := TraceparentFromContext(ContextWithTraceContext(bg, "garbage", "a=b")); ok {
		t.Error("an invalid traceparent was stored with its tracestate")
	}
}

func TestEventValidation(t *testing.T) {
	t.Parallel()
	ok := Event{AggregateType: "payment", AggregateID: "pay-1", EventType: "PaymentCreated", Payload: []byte(`{"a":1}`)}
	if err := Validate(ok); err != nil {
		t.Fatalf("valid event rejected: %v", err)
	}
	for name, tc := range map[string]struct {
		mod  func(*Event)
		want error
		text string
	}{
		"empty aggregate type":   {func(e *Event) { e.AggregateType = "" }, ErrInvalidEvent, "AggregateType is empty"},
		"empty aggregate id":     {func(e *Event) { e.AggregateID = "" }, ErrInvalidEvent, "AggregateID is empty"},
		"empty event type":       {func(e *Event) { e.EventType = "" }, ErrInvalidEvent, "EventType is empty"},
		"NUL in aggregate id":    {func(e *Event) { e.AggregateID = "a\x00b" }, ErrInvalidEvent, "NUL"},
		"bad UTF-8":              {func(e *Event) { e.EventType = "\xff" }, ErrInvalidEvent, "UTF-8"},
		"nil payload":            {func(e *Event) { e.Payload = nil }, ErrInvalidPayload, "not valid JSON"},
		"truncated payload":      {func(e *Event) { e.Payload = []byte(`{"a":`) }, ErrInvalidPayload, `"{\"a\":"`},
		"reserved header id":     {func(e *Event) { e.Headers = map[string]string{"id": "7"} }, ErrInvalidEvent, `"id" is reserved`},
		"reserved header source": {func(e *Event) { e.Headers = map[string]string{"source": "x"} }, ErrInvalidEvent, `"source" is reserved`},
		"empty header key":       {func(e *Event) { e.Headers = map[string]string{"": "x"} }, ErrInvalidEvent, "empty key"},
		"NUL in header":          {func(e *Event) { e.Headers = map[string]string{"k": "\x00"} }, ErrInvalidEvent, "NUL"},
		"huge header":            {func(e *Event) { e.Headers = map[string]string{"k": strings.Repeat("x", MaxHeaderBytes+1)} }, ErrInvalidEvent, "header limit"},
		"huge event type":        {func(e *Event) { e.EventType = strings.Repeat("x", MaxHeaderBytes+1) }, ErrInvalidEvent, "header limit"},
	} {
		e := ok
		tc.mod(&e)
		err := Validate(e)
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: err = %v; want %v containing %q", name, err, tc.want, tc.text)
		}
	}
}

func TestNewConfig(t *testing.T) {
	t.Parallel()
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO "public"."outbox" ("aggregate_type", "aggregate_id", "event_type", "payload", "headers") VALUES ($1, $2, $3, $4, $5) RETURNING "id"::text`
	if w.insert != want || w.delete != "" {
		t.Errorf("default insert:\n got %s\nwant %s (delete %q)", w.insert, want, w.delete)
	}
	w, err = New(Config{Table: `"we""ird"`, IDColumn: "event id", DeleteAfterInsert: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(w.insert, `INSERT INTO "public"."we""ird" (`) || !strings.HasSuffix(w.insert, `RETURNING "event id"::text`) ||
		w.delete != `DELETE FROM "public"."we""ird" WHERE "event id" = $1` {
		t.Errorf("quoted names: insert %s, delete %s", w.insert, w.delete)
	}
	// Table is read as PostgreSQL and the streamer's --table read it: the
	// same text names the same table for the service and the streamer.
	for table, want := range map[string]string{
		"Outbox":                      `"public"."outbox"`,
		"Billing.Outbox":              `"billing"."outbox"`,
		` "Billing"."Outbox Events" `: `"Billing"."Outbox Events"`,
		`"odd.schema"."Out""box.v2"`:  `"odd.schema"."Out""box.v2"`,
	} {
		w, err := New(Config{Table: table})
		if err != nil {
			t.Errorf("Table %q: %v", table, err)
		} else if !strings.HasPrefix(w.insert, "INSERT INTO "+want+" (") {
			t.Errorf("Table %q: %s; want the table %s", table, w.insert, want)
		}
	}
	for _, tc := range []struct {
		cfg    Config
		fields []string // every field named, in order
	}{
		{Config{Table: "a.b.c"}, []string{"Table"}},
		{Config{Table: "a."}, []string{"Table"}},
		{Config{Table: `Billing Ops.outbox`}, []string{"Table"}},
		{Config{PayloadColumn: "x", HeadersColumn: "x"}, []string{"HeadersColumn"}},
		{Config{PayloadColumn: "id"}, []string{"PayloadColumn"}},
		{Config{EventTypeColumn: "\xff"}, []string{"EventTypeColumn"}},
		{Config{Topic: "outbox.{aggregate_type"}, []string{"Topic"}},
		{Config{Topic: "{tenant}.{aggregate_type}"}, []string{"Topic"}},
		// Everything at once: every problem is reported.
		{Config{Table: "a.b.c", PayloadColumn: "id", Topic: "{id}"}, []string{"PayloadColumn", "Table", "Topic"}},
	} {
		_, err := New(tc.cfg)
		var got []string
		for _, e := range unjoin(err) {
			var ce *ConfigError
			if !errors.As(e, &ce) {
				t.Errorf("New(%+v): %v is not a *ConfigError", tc.cfg, e)
				continue
			}
			got = append(got, ce.Field)
		}
		if strings.Join(got, ",") != strings.Join(tc.fields, ",") {
			t.Errorf("New(%+v) = %v; want problems with %v", tc.cfg, err, tc.fields)
		}
	}
	// A template over the columns Write knows, under their configured names.
	if _, err := New(Config{AggregateTypeColumn: "kind", Topic: "{kind}.{aggregate_id}.{event_type}"}); err != nil {
		t.Errorf("template over the event's columns: %v", err)
	}

	if _, err := Write(context.Background(), nil, Event{}); !errors.Is(err, ErrNoTx) {
		t.Errorf("Write(nil tx) = %v, want ErrNoTx", err)
	}
	if _, err := WriteSQL(context.Background(), nil, Event{}); !errors.Is(err, ErrNoTx) {
		t.Errorf("WriteSQL(nil tx) = %v, want ErrNoTx", err)
	}
	if _, err := WriteSQL(context.Background(), (*sql.Tx)(nil), Event{}); !errors.Is(err, ErrNoTx) {
		t.Errorf("WriteSQL((*sql.Tx)(nil)) = %v, want ErrNoTx", err)
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// The transactions of pgx and database/sql are what Write and WriteSQL
// take; pools and connections are not (they have no Commit).
var (
	_ Tx    = pgx.Tx(nil)
	_ SQLTx = (*sql.Tx)(nil)
)

// TestTopicRules: an aggregate type the streamer could not publish is
// refused before the insert, under the default template and others, with
// the rules of package topic.
func TestTopicRules(t *testing.T) {
	t.Parallel()
	e := Event{AggregateType: "payment", AggregateID: "pay-1", EventType: "PaymentCreated", Payload: []byte(`{}`)}
	for _, tc := range []struct {
		tmpl, aggregateType, eventType string
		bad                            string // "" when valid, else a substring of the error
	}{
		{"", "payment", "", ""},
		{"", "payments/eu", "", `contains '/'`},
		{"", "payment refund", "", `contains ' '`},
		{"", "paiement-reçu", "", "allow only a-z"},
		{"", strings.Repeat("p", 236), "", ""}, // outbox.event. + 236 = 249 bytes
		{"", strings.Repeat("p", 237), "", "over Kafka's 249-byte limit"},
		{"", strings.Repeat("p", 240), "", "over Kafka's 249-byte limit"},
		{"", "..", "", ""}, // outbox.event... is a legal name
		{"{aggregate_type}", "..", "", "does not allow"},
		{"{aggregate_type}", "payment", "", ""},
		{"events.{event_type}", "payments/eu", "", ""}, // the aggregate type is not in this topic
		{"events.{event_type}", "payment", "Payment Created", `contains ' '`},
	} {
		w, err := New(Config{Topic: tc.tmpl})
		if err != nil {
			t.Fatal(err)
		}
		ev := e
		ev.AggregateType = tc.aggregateType
		if tc.eventType != "" {
			ev.EventType = tc.eventType
		}
		err = w.Validate(ev)
		var te *topic.Error
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("template %q, aggregate type %q: %v, want it accepted", tc.tmpl, tc.aggregateType, err)
		case tc.bad != "" && (!errors.Is(err, ErrInvalidEvent) || !errors.As(err, &te) || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("template %q, aggregate type %q: %v, want ErrInvalidEvent and a *topic.Error containing %q", tc.tmpl, tc.aggregateType, err, tc.bad)
		}
		if _, terr := w.Topic(ev); (terr == nil) != (err == nil) {
			t.Errorf("template %q, aggregate type %q: Topic says %v, Validate %v", tc.tmpl, tc.aggregateType, terr, err)
		}
	}
	w, _ := New(Config{Topic: "events.{event_type}"})
	if got, err := w.Topic(e); got != "events.PaymentCreated" || err != nil {
		t.Errorf("Topic = %q, %v; want events.PaymentCreated", got, err)
	}
}
