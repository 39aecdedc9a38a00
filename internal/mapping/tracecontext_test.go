package mapping

import (
	"strings"
	"testing"
)

const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// TestTracingSpanContextColumn: Debezium's tracingspancontext column
// (java.util.Properties text) becomes traceparent and tracestate headers;
// a traceparent of the headers column wins; a malformed one is a bad event.
func TestTracingSpanContextColumn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TracingSpanContextColumn = "tracingspancontext"
	props := "#Tue Dec 01 10:00:00 UTC 2026\ntraceparent=" + tp + "\ntracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\n"
	for _, c := range []struct {
		name    string
		span    Column
		headers Column
		want    string
	}{
		{"properties", col(oidText, props), null(oidJSONB), "traceparent=" + tp + " tracestate=congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		{"crlf, colon, spaces", col(oidVarchar, "traceparent : "+tp+"\r\n"), null(oidJSONB), "traceparent=" + tp},
		{"headers column wins", col(oidText, props), col(oidJSONB, `{"traceparent": "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}`),
			"traceparent=00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"},
		{"null", null(oidText), null(oidJSONB), ""},
		{"no traceparent", col(oidText, "#only a comment\n"), null(oidJSONB), ""},
	} {
		rec, err := mapRow(t, cfg, map[string]Column{"tracingspancontext": c.span, "headers": c.headers})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := strings.Join(headerMap(rec.Headers[3:]), " ")
		if got != c.want {
			t.Errorf("%s: headers %q, want %q", c.name, got, c.want)
		}
	}
	_, err := mapRow(t, cfg, map[string]Column{"tracingspancontext": col(oidText, "traceparent=00-xyz")})
	wantBad(t, err, "tracingspancontext", "not a W3C traceparent")
	_, err = mapRow(t, cfg, map[string]Column{"tracingspancontext": col(oidJSONB, `{}`)})
	wantBad(t, err, "tracingspancontext", "must be text or varchar")
	// Without the setting, the column is not read at all.
	rec, err := mapRow(t, DefaultConfig(), map[string]Column{"tracingspancontext": col(oidText, "traceparent=bad")})
	if err != nil || len(rec.Headers) != 3 {
		t.Errorf("column not configured: %v, headers %v", err, headerMap(rec.Headers))
	}
}

func TestValidTraceparent(t *testing.T) {
	for s, ok := range map[string]bool{
		tp: true,
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra": true,
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra": false,
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01":       false,
		"00-00000000000000000000000000000000-b7ad6b7169203331-01":       false,
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01":       false,
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01":       false,
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331":          false,
	} {
		if validTraceparent([]byte(s)) != ok {
			t.Errorf("validTraceparent(%q) = %v", s, !ok)
		}
	}
}
