package mapping

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// refHeaders is the obvious json.Decoder implementation of the headers rule,
// the oracle for the hand scanner (and its benchmark baseline).
func refHeaders(doc []byte) ([]kgo.RecordHeader, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var out []kgo.RecordHeader
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		v := []byte(raw)
		if raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			v = []byte(s)
		}
		out = append(out, kgo.RecordHeader{Key: tok.(string), Value: v})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data")
	}
	return out, nil
}

// FuzzHeaders checks the headers scanner never panics and agrees with
// json.Decoder on every document it accepts. A text column is checked in
// full; a jsonb column, which PostgreSQL already parsed, is only scanned:
// on any input the scanner must not panic, and on valid JSON it must agree
// with the text path.
func FuzzHeaders(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a":"b"}`, `{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tenant":"acme"}`,
		`{"n": 1.5e3, "o": {"x": [1, {"y": "}]"}]}, "t": true, "z": null}`, ` { "a" : "\u00e9\ud83d\ude00\n" } `,
		`{"a":}`, `[1]`, `null`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":1}{`, `{"a" 1}`, `{"a":"b",}`,
	} {
		f.Add([]byte(s))
	}
	m := mustNew(f, DefaultConfig())
	f.Fuzz(func(t *testing.T, doc []byte) {
		row := defaultRow()
		row["headers"] = Column{Data: doc, TypeOID: oidText}
		var rec kgo.Record
		err := m.Map(colsFor(m, row), &rec)
		row["headers"] = Column{Data: doc, TypeOID: oidJSONB}
		var jrec kgo.Record
		jerr := m.Map(colsFor(m, row), &jrec) // must not panic
		if json.Valid(doc) && (err == nil) != (jerr == nil) {
			t.Fatalf("%q: as text %v, as jsonb %v", doc, err, jerr)
		}
		ref, refErr := refHeaders(doc)
		switch {
		case err == nil && refErr != nil:
			t.Fatalf("accepted %q, json.Decoder says %v", doc, refErr)
		case err == nil:
			got := rec.Headers[3:]
			if len(got) != len(ref) {
				t.Fatalf("%q: %d headers, json.Decoder %d", doc, len(got), len(ref))
			}
			for i := range got {
				if got[i].Key != ref[i].Key || !bytes.Equal(got[i].Value, ref[i].Value) {
					t.Fatalf("%q: header %d is %q=%q, json.Decoder %q=%q", doc, i, got[i].Key, got[i].Value, ref[i].Key, ref[i].Value)
				}
			}
		case refErr == nil && utf8.Valid(doc) && !strings.Contains(string(doc), `\u`) && !strings.Contains(string(doc), `\U`):
			// Only bad UTF-8 and lone surrogates, which encoding/json
			// would replace with U+FFFD, may be refused; the fuzz
			// documents are too small for the size limit.
			t.Fatalf("refused %q (%v), json.Decoder accepts it", doc, err)
		}
	})
}

// FuzzParseTimestamp checks the timestamp parser never panics and agrees
// with time.Parse whenever both accept an input.
func FuzzParseTimestamp(f *testing.F) {
	for _, s := range []string{
		"2026-12-01 00:22:33.123456+00", "2026-12-01 00:22:33+05:30", "2026-12-01 00:22:33.5-08",
		"2026-12-01 00:22:33.123456", "1883-11-18 12:00:00-04:56:02", "0044-03-15 12:00:00+00 BC",
		"294276-12-31 23:59:59.999999+00", "infinity", "", "2026-02-29 00:00:00+00",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, withZone bool) {
		got, ok := parseTimestamp(b, withZone)
		if !ok {
			return
		}
		if want, err := goParse(string(b), withZone); err == nil && !got.Equal(want) {
			t.Fatalf("parseTimestamp(%q) = %v, time.Parse = %v", b, got, want)
		}
	})
}
