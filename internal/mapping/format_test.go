package mapping

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

func ceConfig(f Format) Config {
	cfg := DefaultConfig()
	cfg.Source = "7312345678901234567/16384/16500"
	cfg.Format = f
	return cfg
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// TestNativeUnchangedByFormat: the default format, given or left empty,
// makes the record the native contract pins.
func TestNativeUnchangedByFormat(t *testing.T) {
	for _, f := range []Format{"", FormatNative} {
		cfg := DefaultConfig()
		cfg.Format = f
		cfg.Source = "s"
		rec, err := mapRow(t, cfg, map[string]Column{"headers": col(oidJSONB, `{"traceparent": "00-x", "content-type": "a/b"}`)})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(headerMap(rec.Headers), " ")
		if want := "id=42 event_type=created aggregate_type=order source=s traceparent=00-x content-type=a/b"; got != want {
			t.Errorf("format %q: headers %s, want %s", f, got, want)
		}
		if string(rec.Value) != `{"a": 1}` {
			t.Errorf("format %q: value %s", f, rec.Value)
		}
	}
}

func TestCloudEventsBinary(t *testing.T) {
	rec, err := mapRow(t, ceConfig(FormatCloudEventsBinary), map[string]Column{"headers": col(oidJSONB, `{"traceparent": "00-x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(headerMap(rec.Headers), " ")
	want := "ce_specversion=1.0 ce_id=42 ce_source=7312345678901234567/16384/16500 ce_type=created ce_time=2026-12-01T00:22:33.123456Z " +
		"ce_subject=o-1 ce_aggregatetype=order content-type=application/json traceparent=00-x"
	if got != want {
		t.Errorf("headers\n got %s\nwant %s", got, want)
	}
	if string(rec.Value) != `{"a": 1}` || string(rec.Key) != "o-1" || rec.Topic != "outbox.event.order" {
		t.Errorf("record %q %q %q", rec.Topic, rec.Key, rec.Value)
	}
	ev, err := testenv.CloudEvent(rec)
	if err != nil {
		t.Fatalf("the SDK refuses the record: %v", err)
	}
	if ev.ID() != "42" || ev.Source() != "7312345678901234567/16384/16500" || ev.Type() != "created" || ev.Subject() != "o-1" ||
		!ev.Time().Equal(time.Date(2026, 12, 1, 0, 22, 33, 123456000, time.UTC)) || ev.DataContentType() != "application/json" ||
		string(ev.Data()) != `{"a": 1}` || ev.Extensions()["aggregatetype"] != "order" {
		t.Errorf("the SDK reads %s", ev)
	}
}

// TestCloudEventsContentType: the payload's column type names its media
// type, and a content-type key of the headers column overrides it, in
// both modes; the SDK reads the same data back.
func TestCloudEventsContentType(t *testing.T) {
	cases := []struct {
		name    string
		payload Column
		headers Column
		ct      string
		data    string // what the SDK reads as the event's data
		inline  string // the structured value's "data" or "data_base64" member, as JSON
	}{
		{"jsonb", col(oidJSONB, `{"a": 1}`), null(oidJSONB), "application/json", `{"a": 1}`, `"data":{"a": 1}`},
		{"json", col(oidJSON, `[1, 2]`), null(oidJSONB), "application/json", `[1, 2]`, `"data":[1, 2]`},
		// A text payload holds JSON (the mapping refuses any other), so it is
		// application/json like a json one (it was text/plain, which
		// docs/records.md contradicted).
		{"text", col(oidText, `"hi\n"`), null(oidJSONB), "application/json", `"hi\n"`, `"data":"hi\n"`},
		{"varchar", col(oidVarchar, `{"a":1}`), null(oidJSONB), "application/json", `{"a":1}`, `"data":{"a":1}`},
		{"bytea", col(oidBytea, `\x00ff41`), null(oidJSONB), "application/octet-stream", "\x00\xffA", `"data_base64":"AP9B"`},
		{"bytea as protobuf", col(oidBytea, `\x0801`), col(oidJSONB, `{"content-type": "application/protobuf"}`), "application/protobuf", "\x08\x01", `"data_base64":"CAE="`},
		{"text as json", col(oidText, `{"b":2}`), col(oidJSONB, `{"content-type": "application/json; charset=utf-8"}`), "application/json; charset=utf-8", `{"b":2}`, `"data":{"b":2}`},
		{"vendor json", col(oidJSONB, `{"b": 2}`), col(oidJSONB, `{"content-type": "application/vnd.x+json"}`), "application/vnd.x+json", `{"b": 2}`, `"data":"{\"b\": 2}"`},
		{"jsonb as text", col(oidJSONB, `{"b": 2}`), col(oidJSONB, `{"content-type": "text/plain"}`), "text/plain", `{"b": 2}`, `"data":"{\"b\": 2}"`},
	}
	for _, c := range cases {
		for _, f := range []Format{FormatCloudEventsBinary, FormatCloudEventsStructured} {
			rec, err := mapRow(t, ceConfig(f), map[string]Column{"payload": c.payload, "headers": c.headers})
			if err != nil {
				t.Fatalf("%s %s: %v", c.name, f, err)
			}
			ct, _ := header(rec, HeaderContentType)
			n := 0
			for _, h := range rec.Headers {
				if h.Key == HeaderContentType {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s %s: %d content-type headers, want 1", c.name, f, n)
			}
			if f == FormatCloudEventsBinary && ct != c.ct {
				t.Errorf("%s %s: content-type %q, want %q", c.name, f, ct, c.ct)
			}
			if f == FormatCloudEventsStructured {
				if ct != ContentTypeStructured {
					t.Errorf("%s %s: content-type %q", c.name, f, ct)
				}
				if !json.Valid(rec.Value) || !strings.Contains(string(rec.Value), c.inline) {
					t.Errorf("%s %s: value %s, want valid JSON with %s", c.name, f, rec.Value, c.inline)
				}
			}
			ev, err := testenv.CloudEvent(rec)
			if err != nil {
				t.Fatalf("%s %s: the SDK refuses the record: %v\n%s", c.name, f, err, rec.Value)
			}
			if ev.DataContentType() != c.ct || string(ev.Data()) != c.data {
				t.Errorf("%s %s: the SDK reads content type %q data %q, want %q %q", c.name, f, ev.DataContentType(), ev.Data(), c.ct, c.data)
			}
		}
	}
}

func TestCloudEventsStructured(t *testing.T) {
	rec, err := mapRow(t, ceConfig(FormatCloudEventsStructured), map[string]Column{
		"id": col(20, `4"2`), "aggregate_id": col(oidText, "o\t1"), "created_at": null(oidTimestamptz),
		"headers": col(oidJSONB, `{"traceparent": "00-x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"specversion":"1.0","id":"4\"2","source":"7312345678901234567/16384/16500","type":"created","subject":"o\t1",` +
		`"aggregatetype":"order","datacontenttype":"application/json","data":{"a": 1}}`
	if string(rec.Value) != want {
		t.Errorf("value\n got %s\nwant %s", rec.Value, want)
	}
	if got := strings.Join(headerMap(rec.Headers), " "); got != "content-type="+ContentTypeStructured+" traceparent=00-x" {
		t.Errorf("headers %s", got)
	}
	ev, err := testenv.CloudEvent(rec)
	if err != nil {
		t.Fatalf("the SDK refuses the record: %v", err)
	}
	if ev.ID() != `4"2` || ev.Subject() != "o\t1" || !ev.Time().IsZero() {
		t.Errorf("the SDK reads %s", ev)
	}
	if id := RecordEventID(rec); id != `4"2` {
		t.Errorf("RecordEventID = %q", id)
	}
}

func TestCloudEventsBadHeaders(t *testing.T) {
	for _, f := range []Format{FormatCloudEventsBinary, FormatCloudEventsStructured} {
		for _, doc := range []string{`{"ce_id": "1"}`, `{"CE_Source": "x"}`, `{"\u0063e_type": "x"}`} {
			_, err := mapRow(t, ceConfig(f), map[string]Column{"headers": col(oidJSONB, doc)})
			wantBad(t, err, "headers", "collides with the CloudEvents attribute headers")
		}
		_, err := mapRow(t, ceConfig(f), map[string]Column{"headers": col(oidJSONB, `{"content-type": 3}`)})
		wantBad(t, err, "headers", `must be a string such as "application/json"`)
	}
	// The native format has no such attributes: the keys pass as today.
	if _, err := mapRow(t, DefaultConfig(), map[string]Column{"headers": col(oidJSONB, `{"ce_id": "1", "content-type": 3}`)}); err != nil {
		t.Errorf("native: %v", err)
	}
	_, err := mapRow(t, ceConfig(FormatCloudEventsStructured), map[string]Column{
		"payload": col(oidText, "\"\xff\""), "headers": col(oidJSONB, `{"content-type": "text/plain"}`)})
	wantBad(t, err, "payload", "not valid UTF-8")
}

func TestFormatConfig(t *testing.T) {
	for _, c := range []struct {
		f      Format
		source string
		err    string
	}{
		{FormatCloudEventsBinary, "", "a CloudEvents source must be a non-empty URI-reference"},
		{FormatCloudEventsStructured, "my service", "URI-reference"},
		{FormatCloudEventsBinary, "https://example.com/billing%20outbox", ""},
		{FormatCloudEventsBinary, "urn:billing:outbox", ""},
		{FormatCloudEventsBinary, "a%2", "URI-reference"},
		{"cloudevents", "s", `Format "cloudevents": use native, cloudevents-binary or cloudevents-structured`},
		{FormatNative, "my service", ""},
	} {
		cfg := DefaultConfig()
		cfg.Format, cfg.Source = c.f, c.source
		_, err := New(cfg)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s %q: err %v, want %q", c.f, c.source, err, c.err)
		}
	}
}

func TestRecordEventID(t *testing.T) {
	for _, f := range Formats() {
		rec, err := mapRow(t, ceConfig(f), nil)
		if err != nil {
			t.Fatal(err)
		}
		if id := RecordEventID(rec); id != "42" {
			t.Errorf("%s: RecordEventID = %q", f, id)
		}
	}
}

// TestReadRecordEvent: the event a record carries is read back from what
// Map wrote, in every format, and a native record whose row adds a ce_
// header of its own is still native; a record of no format is not read.
func TestReadRecordEvent(t *testing.T) {
	for _, f := range Formats() {
		rec, err := mapRow(t, ceConfig(f), map[string]Column{"headers": col(oidJSONB, `{"ce_id": "spoof", "content-type": "application/cloudevents+json; charset=UTF-8"}`)})
		if f != FormatNative {
			// A CloudEvents record refuses ce_ headers of the row's own.
			rec, err = mapRow(t, ceConfig(f), nil)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got, ok := ReadRecordEvent(rec)
		want := RecordEvent{Format: f, ID: "42", Source: "7312345678901234567/16384/16500", Type: "created"}
		if !ok || got != want {
			t.Errorf("%s: ReadRecordEvent = %+v, %v; want %+v", f, got, ok, want)
		}
	}
	for name, r := range map[string]*kgo.Record{
		"no headers":                  {Value: []byte(`{"id": "1"}`)},
		"structured, not JSON":        {Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: ctStructuredVal}}, Value: []byte("nope")},
		"structured, no id":           {Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: ctStructuredVal}}, Value: []byte(`{"source": "s"}`)},
		"another content type's JSON": {Headers: []kgo.RecordHeader{{Key: HeaderContentType, Value: ctJSON}}, Value: []byte(`{"id": "1"}`)},
	} {
		if ev, ok := ReadRecordEvent(r); ok {
			t.Errorf("%s: read %+v, want nothing", name, ev)
		}
	}
}
