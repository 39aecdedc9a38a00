package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/republish"
)

// TestRepublishValidation: wrong selections stop republish at start with
// exit code 2 and a message naming the flag.
func TestRepublishValidation(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--after-id", "abc"}, `--after-id "abc": give an integer id`},
		{[]string{"--until-id", "1.5"}, `--until-id "1.5": give an integer id`},
		{[]string{"--since", "yesterday"}, `--since "yesterday": use RFC 3339`},
		{[]string{"--since", "2026-02-01T00:00:00Z", "--until", "2026-01-01 00:00:00+00"}, "--since must be before --until"},
		{[]string{"--batch-size", "0"}, "--batch-size 0: must be positive"},
		{[]string{"--on-bad-event", "skip"}, `--on-bad-event "skip"`},
		{[]string{"--value-format", "avro"}, `--value-format "avro": republish writes raw values only`},
	} {
		var out, errOut bytes.Buffer
		code := cli(append([]string{"republish", "--postgres-url", "postgres://u@h/db"}, c.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("republish %v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut.String(), c.want)
		}
	}
	var out bytes.Buffer
	if code := cli([]string{"republish", "--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "CDC_OUTBOX_AFTER_ID") {
		t.Errorf("republish --help: exit %d, want 0 and the flags with their variables:\n%s", code, out.String())
	}
}

// TestResumeHintIsAccepted: the resume hint repeats created_at as
// PostgreSQL prints it in republish's session, for a timestamptz column
// (always with its offset, +00 there) and for a timestamp column (none);
// --since must accept every such hint, and read it as PostgreSQL does.
func TestResumeHintIsAccepted(t *testing.T) {
	for _, c := range []struct {
		printed string
		want    time.Time
	}{
		{"2026-01-02 15:04:05.123456", time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)},
		{"2026-01-02 15:04:05", time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2026-01-02 15:04:05.1", time.Date(2026, 1, 2, 15, 4, 5, 100000000, time.UTC)},
		{"2026-01-02 15:04:05.123456+00", time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)},
		{"2026-01-02 15:04:05+00", time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)},
		{"2026-01-02 15:04:05.5+05:30", time.Date(2026, 1, 2, 9, 34, 5, 500000000, time.UTC)},
		{"1890-01-02 15:04:05+00:53:28", time.Date(1890, 1, 2, 14, 10, 37, 0, time.UTC)},
	} {
		hint := resumeFlag(republish.Resume{Since: c.printed})
		value, ok := strings.CutPrefix(hint, "--since ")
		if !ok {
			t.Fatalf("resume hint %q is not a --since", hint)
		}
		var out, errOut bytes.Buffer
		// The shell removes the hint's quotes.
		args := []string{"republish", "--postgres-url", "postgres://u@h/db", "--since", strings.Trim(value, "'"), "--batch-size", "0"}
		if cli(args, &out, &errOut); strings.Contains(errOut.String(), "--since") {
			t.Errorf("resume hint %s refused: %s", hint, errOut.String())
		}
		got, err := parseTime(c.printed)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("parseTime(%q) = %s, %v; want %s", c.printed, got, err, c.want)
		}
	}
}
