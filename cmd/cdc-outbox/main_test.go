package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// TestFlagErrors: every wrong flag or value stops the command before it
// connects anywhere (the URLs point at closed ports, so a connection would
// fail differently, with code 1), with code 2 and one message that names
// the flag, where its value came from, the value and what is accepted.
func TestFlagErrors(t *testing.T) {
	config := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	if err := os.WriteFile(config, []byte("slot: x\nkafka-compression: snappy2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := []string{"--postgres-url", "postgres://127.0.0.1:1/x", "--kafka-brokers", "127.0.0.1:1", "--http-addr", ""}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"run", "--kafka-compression", "brotli"},
			want: `cdc-outbox run: invalid configuration:` + "\n" + `--kafka-compression "brotli": use none, gzip, snappy, lz4 or zstd`},
		{args: []string{"run"}, env: map[string]string{"CDC_OUTBOX_KAFKA_COMPRESSION": "brotli"},
			want: `--kafka-compression (from CDC_OUTBOX_KAFKA_COMPRESSION) "brotli": use none, gzip, snappy, lz4 or zstd`},
		{args: []string{"run", "--config", config},
			want: `--kafka-compression (from ` + config + `:2) "snappy2": use none, gzip, snappy, lz4 or zstd`},
		{args: []string{"run", "--record-format", "cloudevents"},
			want: `--record-format "cloudevents": use native, cloudevents-binary or cloudevents-structured`},
		{args: []string{"run", "--record-format", "cloudevents-binary", "--source", "billing outbox"},
			want: `--source "billing outbox": --record-format cloudevents-binary needs a URI-reference (RFC 3986: such as billing, /billing/outbox or urn:example:billing; percent-encode other characters), or leave it empty for the default`},
		{args: []string{"run", "--status-interval", "abc"},
			want: `cdc-outbox run: --status-interval "abc": want a duration string such as "200ms", "10s" or "1m30s"`},
		{args: []string{"run"}, env: map[string]string{"CDC_OUTBOX_MAX_INFLIGHT_EVENTS": "abc"},
			want: `cdc-outbox run: --max-inflight-events (from CDC_OUTBOX_MAX_INFLIGHT_EVENTS) "abc": want an integer`},
		{args: []string{"run"}, env: map[string]string{"CDC_OUTBOX_MAX_INFLIGHT_EVENTS": "-5"},
			want: `--max-inflight-events (from CDC_OUTBOX_MAX_INFLIGHT_EVENTS) -5: must be positive`},
		{args: []string{"run", "--max-record-bytes", `1"0`},
			want: `cdc-outbox run: --max-record-bytes "1\"0": want an integer`},
		{args: []string{"run", "--create-slot=maybe"},
			want: `cdc-outbox run: --create-slot "maybe": want a boolean (true or false)`},
		{args: []string{"run", "--kafka-broker", "x"},
			want: `cdc-outbox run: unknown flag --kafka-broker (did you mean --kafka-brokers?)`},
		{args: []string{"status", "--slots", "x"},
			want: `cdc-outbox status: unknown flag --slots (did you mean --slot?)`},
		{args: []string{"run", "--frobnicate"},
			want: `cdc-outbox run: unknown flag --frobnicate (see cdc-outbox run --help)`},
		{args: []string{"run", "--slot"},
			want: `cdc-outbox run: --slot needs a value: a string`},
		{args: []string{"run", "--table", "svc_a.outbox,"},
			want: `--table "svc_a.outbox,": invalid name syntax: an empty item in the list`},
		{args: []string{"run", "--table", "*.outbox", "--source", "billing"},
			want: `--source "billing" with several tables in --table "*.outbox": each table needs a source of its own`},
		{args: []string{"republish", "--table", "*.outbox,x"},
			want: `--table "*.outbox,x": name one table here; a list or a pattern is run's`},
		{args: []string{"status", "--table", "a.b,"},
			want: `--table "a.b,": invalid name syntax: an empty item in the list`},
		{args: []string{"status", "--metrics-url", "localhost:8080"},
			want: `--metrics-url "localhost:8080": give the streamer's http://host:port/metrics`},
		{args: []string{"status", "--timeout", "0s"},
			want: `--timeout 0s: must be positive`},
		{args: []string{"republish", "--batch-size", "0"},
			want: `--batch-size 0: must be positive`},
		{args: []string{"version", "--bogus"},
			want: `cdc-outbox version: unexpected argument "--bogus": version takes no flags or arguments`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			switch args[0] { // the closed ports first: the flag under test last
			case "run":
				args = append(append([]string{"run"}, closed...), args[1:]...)
			case "republish": // no HTTP endpoint
				args = append(append([]string{"republish"}, closed[:4]...), args[1:]...)
			case "status": // no Kafka, no HTTP endpoint
				args = append(append([]string{"status"}, closed[:2]...), args[1:]...)
			}
			var out, errOut bytes.Buffer
			code := cli(args, &out, &errOut)
			if code != 2 || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("cdc-outbox %s: code %d, stderr:\n%s\nwant code 2 and %q", strings.Join(args, " "), code, errOut.String(), tc.want)
			}
		})
	}
}

// TestConnectErrorsAreOneLine: run and status tell a failed connection in
// one line, with the address tried, the cause once and what to check; with
// no --postgres-url at all, they say so.
func TestConnectErrorsAreOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, k := range []string{"CDC_OUTBOX_POSTGRES_URL", "PGHOST", "PGPORT", "PGHOSTADDR", "PGSERVICE", "PGSERVICEFILE", "PGDATABASE", "PGUSER"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("PGHOST", t.TempDir()) // a folder with no server's socket in it, as the default would be
	hint := "check --postgres-url (CDC_OUTBOX_POSTGRES_URL), the PG* environment variables, and that the server is running and reachable"
	for _, tc := range []struct {
		name string
		url  string
		want []string
	}{
		{"closed port", "postgres://u@" + closed + "/d?connect_timeout=5",
			[]string{"cannot connect to PostgreSQL at " + closed + " as user u to database d: connection refused; " + hint}},
		{"unknown host", "postgres://u@nosuchhost.invalid:5432/d?connect_timeout=5",
			[]string{"cannot connect to PostgreSQL at nosuchhost.invalid:5432 as user u to database d: ", "nosuchhost.invalid", hint}},
		{"no url", "", []string{"/.s.PGSQL.5432", ": no such file or directory; no --postgres-url was given (nor CDC_OUTBOX_POSTGRES_URL), " +
			"so the PG* environment variables and libpq's defaults were used: give --postgres-url"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, command := range [][]string{
				{"status", "--postgres-url", tc.url, "--timeout", "10s"},
				{"run", "--postgres-url", tc.url, "--http-addr", "", "--log-format", "json"},
			} {
				var out, errOut bytes.Buffer
				code := cli(command, &out, &errOut)
				lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
				msg := lines[len(lines)-1]
				if command[0] == "run" {
					var entry struct{ Msg, Error string }
					if err := json.Unmarshal([]byte(msg), &entry); err != nil {
						t.Fatalf("run: %v: %s", err, msg)
					}
					msg = entry.Error
				}
				if code == 0 || strings.Count(msg, "cannot connect to PostgreSQL") != 1 || strings.ContainsAny(msg, "\n\t") {
					t.Errorf("%s: code %d, want one line saying it cannot connect, once:\n%s", command[0], code, errOut.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: %q\nwant it to contain %q", command[0], msg, w)
					}
				}
			}
		})
	}
}

// TestUsageAligned: the commands' descriptions in the usage text start in
// one column.
func TestUsageAligned(t *testing.T) {
	col := -1
	for _, line := range strings.Split(usage, "\n") {
		if !strings.HasPrefix(line, "  ") {
			continue
		}
		// A command's text follows two or more spaces; a continuation
		// line's is indented to it.
		desc := len(line) - len(strings.TrimLeft(line, " "))
		if cmd := line[desc:]; strings.HasPrefix(cmd, "cdc-outbox ") {
			gap := strings.Index(cmd, "  ")
			desc += gap + len(cmd[gap:]) - len(strings.TrimLeft(cmd[gap:], " "))
		}
		if col == -1 {
			col = desc
		}
		if desc != col {
			t.Errorf("usage line %q starts its text at column %d, the first at %d", line, desc, col)
		}
	}
}

// TestMakeBuildEmbedsVersion: `make build` (which the demo uses too) puts
// git's description and commit into the binary, through -ldflags -X on
// this package's version and revision, which a rename would silently
// break.
func TestMakeBuildEmbedsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary with make")
	}
	bin := filepath.Join(t.TempDir(), "cdc-outbox")
	build := exec.Command("make", "--no-print-directory", "-s", "build", "BIN="+bin)
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	describe, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("cdc-outbox %s (commit %s, ", strings.TrimSpace(string(describe)), strings.TrimSpace(string(head)))
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("version: %q, want it to begin %q", out, want)
	}
}
