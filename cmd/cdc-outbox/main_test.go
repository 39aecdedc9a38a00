package main

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("CDC_OUTBOX_SLOT", "from_env")
	t.Setenv("CDC_OUTBOX_STATUS_INTERVAL", "1s")
	t.Setenv("CDC_OUTBOX_KAFKA_BROKERS", "env:9092")
	var c runConfig
	if err := runFlags(&c).parse([]string{"--kafka-brokers", "flag:9092"}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if c.Slot != "from_env" || c.StatusInterval != time.Second {
		t.Fatalf("environment not applied: slot=%q status=%s", c.Slot, c.StatusInterval)
	}
	if c.KafkaBrokers != "flag:9092" {
		t.Fatalf("the command line must win over the environment: brokers=%q", c.KafkaBrokers)
	}
	if c.Publication != "cdc_outbox" || c.Table != "public.outbox" || c.Mapping.Topic != "outbox.event.{aggregate_type}" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestBadEnvironmentValueNamesTheVariable(t *testing.T) {
	t.Setenv("CDC_OUTBOX_STATUS_INTERVAL", "soon")
	var c runConfig
	err := runFlags(&c).parse(nil, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "CDC_OUTBOX_STATUS_INTERVAL") {
		t.Fatalf("err = %v, want it to name the variable", err)
	}
}

func TestHelpListsEveryFlagWithItsVariable(t *testing.T) {
	var c runConfig
	f := runFlags(&c)
	var out bytes.Buffer
	if err := f.parse([]string{"--help"}, &out); !errors.Is(err, errHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, name := range f.order {
		if !strings.Contains(out.String(), "--"+name) || !strings.Contains(out.String(), "env "+envName(name)) {
			t.Errorf("help lacks --%s or %s", name, envName(name))
		}
	}
	if !strings.Contains(out.String(), "default outbox.event.{aggregate_type}") {
		t.Errorf("help lacks defaults:\n%s", out.String())
	}
}

func TestValidateSaysWhatToChange(t *testing.T) {
	var c runConfig
	if err := runFlags(&c).parse(nil, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	c.Slot = "Bad-Slot"
	c.OnBadEvent = "ignore"
	c.KeepaliveInterval = time.Millisecond
	err := c.validate()
	for _, want := range []string{`--slot "Bad-Slot"`, `--on-bad-event "ignore": use fail or dead-letter`, "--keepalive-interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, in := range []string{
		"cannot parse `postgres://app:s3cret@db:5432/x`: bad",
		"cannot parse `host=db password=s3cret user=app`",
		"cannot parse `host=db password='s3 cret' user=app`",
	} {
		out := redact(errors.New(in)).Error()
		if strings.Contains(out, "s3") {
			t.Errorf("redact(%q) = %q", in, out)
		}
	}
	if got := redact(errors.New("postgres://db:5432/x")).Error(); got != "postgres://db:5432/x" {
		t.Errorf("a URL without a password changed: %q", got)
	}
}

func TestCLI(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := cli([]string{"version"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "cdc-outbox ") {
		t.Fatalf("version: code %d, %q", code, out.String())
	}
	if code := cli([]string{"frobnicate"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: code %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := cli([]string{"run", "--on-bad-event", "drop"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "invalid configuration") {
		t.Fatalf("invalid run: code %d, %q", code, errOut.String())
	}
}

// TestReadmeDocumentsEveryFlag keeps the README's flag table in step with
// the code: a user should find every flag there.
func TestReadmeDocumentsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var c runConfig
	for _, name := range runFlags(&c).order {
		if !strings.Contains(string(readme), "| `--"+name+"` |") {
			t.Errorf("README.md has no row for --%s", name)
		}
	}
}
