package mapping

import (
	"strings"
	"testing"
)

// TestSourceHeader: with a Source, every record carries it as the "source"
// header right after the streamer's own three and before the headers
// column's; without one, there is no such header.
func TestSourceHeader(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Source = "7312345678901234567/16384/16390"
	rec, err := mapRow(t, cfg, map[string]Column{"headers": col(oidJSONB, `{"traceparent": "tp"}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := "id=42 event_type=created aggregate_type=order source=7312345678901234567/16384/16390 traceparent=tp"
	if got := strings.Join(headerMap(rec.Headers), " "); got != want {
		t.Errorf("headers %q, want %q", got, want)
	}

	rec, err = mapRow(t, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(headerMap(rec.Headers), " "); strings.Contains(got, "source") {
		t.Errorf("without a Source: headers %q", got)
	}

	for _, bad := range []string{"\xff", strings.Repeat("s", DefaultConfig().MaxHeaderBytes+1)} {
		cfg.Source = bad
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Source") {
			t.Errorf("Source of %d bytes, valid UTF-8 %v: New = %v, want an error", len(bad), bad != "\xff", err)
		}
	}
}
