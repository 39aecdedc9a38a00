package main

import (
	"bytes"
	"strings"
	"testing"
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
