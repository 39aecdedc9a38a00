package mapping

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// TestMessageIsTheRowsRecord maps pairs of a row and the message of the
// same values: the records must be equal field by field (topic, key,
// value, headers in order, timestamp), under the default mapping, a
// template over several columns and renamed columns with a source.
func TestMessageIsTheRowsRecord(t *testing.T) {
	renamed := DefaultConfig()
	renamed.AggregateTypeColumn, renamed.EventTypeColumn = "kind", "what"
	renamed.Topic = "events.{kind}.{what}"
	renamed.Source = "db1/5/16385"
	for _, tc := range []struct {
		name    string
		cfg     Config
		row     map[string]Column
		message string
	}{
		{"default", DefaultConfig(), defaultRow(),
			`{"v":1,"id":42,"aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload":{"a": 1},"created_at":"2026-12-01T00:22:33.123456+00:00"}`},
		{"headers, no created_at", DefaultConfig(), map[string]Column{
			"id": col(oidText, "e-7"), "aggregate_type": col(oidText, "order"), "aggregate_id": col(oidText, "o-1"),
			"event_type": col(oidText, "created"), "payload": col(oidJSONB, `[1, "x", {"b": null}]`),
			"headers": col(oidJSONB, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": 3, "esc": "a\"b\u00e9"}`), "created_at": null(oidTimestamptz)},
			`{"v":1,"id":"e-7","aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload":[1, "x", {"b": null}],` +
				`"headers":{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": 3, "esc": "a\"b\u00e9"},"created_at":null}`},
		{"binary payload", DefaultConfig(), map[string]Column{
			"id": col(20, "9"), "aggregate_type": col(oidText, "blob"), "aggregate_id": col(oidText, "b"),
			"event_type": col(oidText, "stored"), "payload": col(oidBytea, `\x00ff10`), "headers": null(oidJSONB),
			"created_at": col(oidTimestamptz, "2026-12-01 02:22:33+02")},
			`{"v":1,"id":9,"aggregate_type":"blob","aggregate_id":"b","event_type":"stored","payload_base64":"AP8Q","created_at":"2026-12-01T00:22:33Z"}`},
		{"renamed columns, template, source", renamed, map[string]Column{
			"id": col(20, "1"), "kind": col(oidText, "order"), "aggregate_id": col(oidText, "o-1"),
			"what": col(oidText, "paid"), "payload": col(oidJSON, `{}`), "headers": null(oidJSONB), "created_at": null(oidTimestamptz)},
			`{"v":1,"id":"1","aggregate_type":"order","aggregate_id":"o-1","event_type":"paid","payload":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.cfg)
			var fromRow, fromMsg kgo.Record
			if err := m.Map(colsFor(m, tc.row), &fromRow); err != nil {
				t.Fatalf("row: %v", err)
			}
			if err := m.MapMessage([]byte(tc.message), make([]Column, len(m.Columns())), &fromMsg); err != nil {
				t.Fatalf("message: %v", err)
			}
			if !reflect.DeepEqual(fromRow, fromMsg) {
				t.Errorf("records differ:\nrow     %+v\nmessage %+v", fromRow, fromMsg)
			}
		})
	}
}

// TestMessageBadEvents: content that is no envelope, and values a row
// could not publish either, are bad events naming the member and the id.
func TestMessageBadEvents(t *testing.T) {
	const ok = `"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload":{}`
	m := mustNew(t, DefaultConfig())
	for _, tc := range []struct{ content, id, sub string }{
		{`not json`, "", "is not valid JSON"},
		{"\xff", "", "is not valid UTF-8"},
		{`[1]`, "", "not an object"},
		{`{` + ok + `}`, "e1", `member "v" is missing`},
		{`{"v":2,` + ok + `}`, "e1", "reads envelope version 1"},
		{`{"v":1,` + ok + `,"header":{}}`, "e1", `member "header" is not a member`},
		{`{"v":1,` + ok + `,"id":"e2"}`, "e1", "appears twice"},
		{`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"created"}`, "e1", `"payload" is missing`},
		{`{"v":1,"aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload":{}}`, "", `"id" is missing`},
		{`{"v":1,` + ok + `,"payload_base64":"AA=="}`, "e1", "give one of them"},
		{`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload_base64":"!!"}`, "e1", "not standard base64"},
		{`{"v":1,` + ok + `,"created_at":"2026-12-01 00:00:00"}`, "e1", "not an RFC 3339 time"},
		{`{"v":1,` + ok + `,"created_at":"1960-01-01T00:00:00Z"}`, "e1", `member "created_at" is "1960-01-01 00:00:00+00:00", before 1970`},
		{`{"v":1,` + ok + `,"headers":[1]}`, "e1", `"headers" is not a JSON object`},
		{`{"v":1,` + ok + `,"headers":{"id":"x"}}`, "e1", `member "headers" has key "id", a header cdc-outbox sets itself`},
		{`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"","event_type":"created","payload":{}}`, "e1", `member "aggregate_id" is empty`},
		{`{"v":1,"id":"e1","aggregate_type":"a/b","aggregate_id":"o","event_type":"created","payload":{}}`, "e1", `member "aggregate_type" topic "outbox.event.a/b"`},
		{`{"v":1,"id":"e1","aggregate_type":true,"aggregate_id":"o","event_type":"created","payload":{}}`, "e1", `"aggregate_type" is not a string`},
		{`{"v":1,"id":"\ud800","aggregate_type":"o","aggregate_id":"o","event_type":"created","payload":{}}`, "", "lone surrogate"},
	} {
		var rec kgo.Record
		err := m.MapMessage([]byte(tc.content), make([]Column, len(m.Columns())), &rec)
		var be *BadEventError
		if !errors.As(err, &be) {
			t.Errorf("%s: error %v, want a *BadEventError", tc.content, err)
			continue
		}
		if be.EventID != tc.id || !strings.Contains(be.Error(), tc.sub) {
			t.Errorf("%s:\n got id %q, %v\nwant id %q, containing %q", tc.content, be.EventID, err, tc.id, tc.sub)
		}
	}
	// A template over a column no message carries.
	cfg := DefaultConfig()
	cfg.Topic = "t.{tenant}"
	tm := mustNew(t, cfg)
	var rec kgo.Record
	err := tm.MapMessage([]byte(`{"v":1,`+ok+`}`), make([]Column, len(tm.Columns())), &rec)
	if err == nil || !strings.Contains(err.Error(), "uses {tenant}, which is no member of a message") {
		t.Errorf("template over tenant: %v", err)
	}
}

// FuzzMapMessage: any content maps without panicking to a record or a
// *BadEventError; a record carries the envelope's id, key and payload.
//
//	go test -fuzz=FuzzMapMessage ./internal/mapping
func FuzzMapMessage(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"id":42,"aggregate_type":"order","aggregate_id":"o-1","event_type":"created","payload":{"a": 1},"created_at":"2026-12-01T00:22:33.123456+00:00"}`,
		`{"v":1,"id":"e","aggregate_type":"b","aggregate_id":"b","event_type":"s","payload_base64":"AP8Q","headers":{"k":"v","n":1}}`,
		`{"v":1,"id":"\u00e9","aggregate_type":"o","aggregate_id":"o","event_type":"c","payload":null}`,
		`{"v":2}`, `[]`, ``, `{"v":1,"id":"e1","id":"e2"}`,
	} {
		f.Add([]byte(s))
	}
	m := mustNew(f, DefaultConfig())
	f.Fuzz(func(t *testing.T, content []byte) {
		var rec kgo.Record
		err := m.MapMessage(content, make([]Column, len(m.Columns())), &rec)
		var be *BadEventError
		switch {
		case err == nil:
			e, perr := contract.ParseEnvelope(content)
			if perr != nil || headerValue(rec.Headers, "id") != e.ID || string(rec.Key) != e.AggregateID || (!e.Binary && !bytes.Equal(rec.Value, e.Payload)) {
				t.Fatalf("%q: record %+v from envelope %+v (%v)", content, rec, e, perr)
			}
		case !errors.As(err, &be):
			t.Fatalf("%q: error %v is not a *BadEventError", content, err)
		}
	})
}

func headerValue(hs []kgo.RecordHeader, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestMessageAggregateID: the aggregate id a shard hashes is the one the
// envelope gives the record (its key), escapes included; anything else is
// not an id.
func TestMessageAggregateID(t *testing.T) {
	for _, content := range []string{
		`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"order-1","event_type":"x","payload":{}}`,
		`{"aggregate_id":"caf\u00e9 \"q\" \\ \/ \n","v":1,"id":"e1","aggregate_type":"order","event_type":"x","payload":{}}`,
		`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"😀漢字","event_type":"x","payload":{}}`,
		`{"v":1,"id":"e1","aggregate_type":"order","aggregate_id":"\ud83d\ude00","event_type":"x","payload":{}}`,
	} {
		e, err := contract.ParseEnvelope([]byte(content))
		if err != nil {
			t.Fatalf("%s: %v", content, err)
		}
		got, ok := MessageAggregateID([]byte(content))
		if !ok || got != e.AggregateID {
			t.Errorf("MessageAggregateID(%s) = %q, %v; the envelope's is %q", content, got, ok, e.AggregateID)
		}
	}
	for _, content := range []string{`{"aggregate_id":42}`, `{"id":"e1"}`, `not json`, ``, `{"aggregate_id":null}`} {
		if got, ok := MessageAggregateID([]byte(content)); ok {
			t.Errorf("MessageAggregateID(%s) = %q, want none", content, got)
		}
	}
}
