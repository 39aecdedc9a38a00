package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
)

// writeConfig writes a configuration file into a fresh directory and
// returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// parseRun parses args as `cdc-outbox run` would.
func parseRun(t *testing.T, args ...string) (runConfig, error) {
	t.Helper()
	var c runConfig
	err := runFlags(&c).parse(args, &bytes.Buffer{})
	return c, err
}

func TestConfigFilePrecedence(t *testing.T) {
	path := writeConfig(t, `
kafka-brokers: file:9092
status-interval: 3s
slot: from_file
log-level: debug
`)
	t.Setenv("CDC_OUTBOX_KAFKA_BROKERS", "env:9092")
	t.Setenv("CDC_OUTBOX_STATUS_INTERVAL", "2s")
	t.Setenv("CDC_OUTBOX_LOG_LEVEL", "") // set, even empty, wins over the file
	c, err := parseRun(t, "--config", path, "--kafka-brokers", "flag:9092")
	if err != nil {
		t.Fatal(err)
	}
	if c.KafkaBrokers != "flag:9092" {
		t.Errorf("kafka-brokers = %q: the command line must win over the environment and the file", c.KafkaBrokers)
	}
	if c.StatusInterval != 2*time.Second {
		t.Errorf("status-interval = %s: the environment must win over the file", c.StatusInterval)
	}
	if c.LogLevel != "" {
		t.Errorf("log-level = %q: a set but empty environment variable must win over the file", c.LogLevel)
	}
	if c.Slot != "from_file" {
		t.Errorf("slot = %q: the file must win over the default", c.Slot)
	}
	if c.Publication != "cdc_outbox" || c.KeepaliveInterval != 10*time.Second {
		t.Errorf("defaults lost: publication %q, keepalive-interval %s", c.Publication, c.KeepaliveInterval)
	}
}

func TestConfigFileFromEnvironment(t *testing.T) {
	path := writeConfig(t, "slot: from_env_file\n")
	t.Setenv("CDC_OUTBOX_CONFIG", path)
	c, err := parseRun(t)
	if err != nil {
		t.Fatal(err)
	}
	if c.Slot != "from_env_file" {
		t.Errorf("slot = %q: CDC_OUTBOX_CONFIG was not read", c.Slot)
	}

	// --config wins over CDC_OUTBOX_CONFIG, which is then not even opened.
	t.Setenv("CDC_OUTBOX_CONFIG", filepath.Join(t.TempDir(), "missing.yaml"))
	c, err = parseRun(t, "--config", path)
	if err != nil || c.Slot != "from_env_file" {
		t.Fatalf("--config must win over CDC_OUTBOX_CONFIG: slot %q, err %v", c.Slot, err)
	}
	// An empty --config turns the file off.
	if c, err = parseRun(t, "--config", ""); err != nil || c.Slot != "cdc_outbox" {
		t.Fatalf("--config '': slot %q, err %v", c.Slot, err)
	}
}

func TestConfigFileMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := parseRun(t, "--config", missing)
	if err == nil || !strings.Contains(err.Error(), "--config") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v, want it to name --config and the file", err)
	}
}

func TestConfigFileUnknownKeys(t *testing.T) {
	path := writeConfig(t, `slot: ok
kafka-broker: k:9092
max_inflight_events: 5
CDC_OUTBOX_TABLE: public.outbox
--create-slot: false
frobnicate: true
`)
	_, err := parseRun(t, "--config", path)
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	for _, want := range []string{
		path + `:2: unknown key "kafka-broker" (did you mean "kafka-brokers"?)`,
		path + `:3: unknown key "max_inflight_events" (did you mean "max-inflight-events"?)`,
		path + `:4: unknown key "CDC_OUTBOX_TABLE" (did you mean "table"?)`,
		path + `:5: unknown key "--create-slot" (did you mean "create-slot"?)`,
		path + `:6: unknown key "frobnicate": the keys are the flag names`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestConfigFileWrongTypes(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"max-inflight-events: lots", `:1: max-inflight-events: want an integer, got "lots"`},
		{"max-inflight-events: \"20000\"", `:1: max-inflight-events: want an integer, got "20000"`},
		{"max-inflight-events: 1.5", `:1: max-inflight-events: want an integer, got the number 1.5`},
		{"max-record-bytes: 99999999999999999999999", `max-record-bytes: want an integer`},
		{"create-slot: yes", `:1: create-slot: want a boolean (true or false), got "yes"`},
		{"create-slot: 1", `create-slot: want a boolean (true or false), got the integer 1`},
		{"status-interval: 200", `status-interval: want a duration string such as "200ms"`},
		{"status-interval: soon", `status-interval: want a duration string such as "200ms", "10s" or "1m30s", got "soon"`},
		{"slot: 5", `slot: want a string, got the integer 5 (quote it to make it a string)`},
		{"create-publication: [true]", `create-publication: want a boolean (true or false), got a list`},
		{"postgres-url:", `postgres-url: want a string, got no value`},
		{"kafka-brokers: {a: b}", `kafka-brokers: want a string or a list of strings, got a mapping`},
		{"kafka-brokers: [a:9092, 9093]", `kafka-brokers: want a list of strings, got the integer 9093 in it`},
		{"\n\ntimeout: forever", `:3: timeout: want a duration string`}, // status's key, checked by run too
		{"- slot: x", `:1: want a mapping of flag names to values`},
		{"slot: a\nslot: b", `:2: slot is given twice (first on line 1)`},
		{"config: other.yaml", `:1: config: a configuration file cannot name another`},
		{"slot: a\n---\nslot: b", `:2: a second YAML document`},
		{"slot: [unclosed", `yaml:`},
	} {
		path := writeConfig(t, tc.yaml)
		_, err := parseRun(t, "--config", path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want the file and %q", tc.yaml, err, tc.want)
		}
	}
}

func TestConfigFileValueTypes(t *testing.T) {
	path := writeConfig(t, `# comments are fine
create-slot: false
kafka-auto-create-topics: False
max-inflight-events: 1_000
max-inflight-bytes: 0x100000
status-interval: 150ms
keepalive-interval: "1m30s"
shutdown-timeout: 0
kafka-brokers: [a:9092, "b:9092"]
slot: &s shared_slot
publication: *s
http-addr: ""
topic: "events.{aggregate_type}"
`)
	c, err := parseRun(t, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	want := runConfig{
		CreateSlot: false, KafkaAutoCreateTopics: false, MaxInflightEvents: 1000, MaxInflightBytes: 1 << 20,
		StatusInterval: 150 * time.Millisecond, KeepaliveInterval: 90 * time.Second, ShutdownTimeout: 0,
		KafkaBrokers: "a:9092,b:9092", Slot: "shared_slot", Publication: "shared_slot", HTTPAddr: "",
	}
	got := runConfig{
		CreateSlot: c.CreateSlot, KafkaAutoCreateTopics: c.KafkaAutoCreateTopics, MaxInflightEvents: c.MaxInflightEvents,
		MaxInflightBytes: c.MaxInflightBytes, StatusInterval: c.StatusInterval, KeepaliveInterval: c.KeepaliveInterval,
		ShutdownTimeout: c.ShutdownTimeout, KafkaBrokers: c.KafkaBrokers, Slot: c.Slot, Publication: c.Publication,
		HTTPAddr: c.HTTPAddr,
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if c.Mapping.Topic != "events.{aggregate_type}" {
		t.Errorf("topic = %q", c.Mapping.Topic)
	}
	if !c.CreatePublication {
		t.Error("create-publication lost its default")
	}
}

func TestConfigFileEmpty(t *testing.T) {
	for _, text := range []string{"", "# only a comment\n", "---\n", "{}\n"} {
		if _, err := parseRun(t, "--config", writeConfig(t, text)); err != nil {
			t.Errorf("%q: %v", text, err)
		}
	}
}

// nonDefault returns a valid value for fl that is not its default, as YAML
// and as fl.Value.String() prints it once set.
func nonDefault(t *testing.T, fl *flag.Flag) (yamlValue, printed string) {
	switch v := fl.Value.(flag.Getter).Get().(type) {
	case bool:
		return fmt.Sprint(!v), fmt.Sprint(!v)
	case int:
		return fmt.Sprint(v + 7), fmt.Sprint(v + 7)
	case time.Duration:
		d := v + 1500*time.Millisecond
		return fmt.Sprintf("%q", d.String()), d.String()
	case string:
		s := "x_" + strings.ReplaceAll(fl.Name, "-", "_")
		return fmt.Sprintf("%q", s), s
	default:
		t.Fatalf("--%s: a flag of type %T; teach the configuration file and this test about it", fl.Name, v)
		return "", ""
	}
}

// TestConfigFileEveryFlag sets every flag of run and of status from a file
// generated from their flag sets, so a new flag is covered the day it is
// added, and checks that each command took its own keys and ignored the
// other's.
func TestConfigFileEveryFlag(t *testing.T) {
	var rc runConfig
	var sc statusConfig
	commands := map[string]*flags{"run": runFlags(&rc), "status": statusFlags(&sc)}
	var text strings.Builder
	want := map[string]string{}
	names, known := fileKeys()
	for _, name := range names {
		y, printed := nonDefault(t, known[name])
		fmt.Fprintf(&text, "%s: %s\n", name, y)
		want[name] = printed
	}
	path := writeConfig(t, text.String())
	for cmd, f := range commands {
		if err := f.parse([]string{"--config", path}, &bytes.Buffer{}); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		for _, name := range f.order {
			if got := f.fs.Lookup(name).Value.String(); got != want[name] {
				t.Errorf("%s --%s = %q, want %q from the file", cmd, name, got, want[name])
			}
		}
	}
	for _, f := range commands {
		for _, name := range f.order {
			if known[name] == nil {
				t.Errorf("--%s is not a configuration file key", name)
			}
		}
	}
}

// commentedKey is a commented-out key line of the example file: "# slot: cdc_outbox".
var commentedKey = regexp.MustCompile(`(?m)^# ([a-z][a-z-]*): `)

// TestExampleConfigFile keeps cdc-outbox.example.yaml in step with the
// flags: it names every key, it loads as it is, and with every commented-out
// key uncommented it still loads and gives each flag its default (except the
// keys the example sets on purpose).
func TestExampleConfigFile(t *testing.T) {
	const example = "../../cdc-outbox.example.yaml"
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	names, known := fileKeys()
	for _, name := range names {
		if !regexp.MustCompile(`(?m)^(# )?` + regexp.QuoteMeta(name) + `: `).Match(data) {
			t.Errorf("%s does not mention --%s (want a line %q or %q)", example, name, name+": ...", "# "+name+": ...")
		}
	}
	if _, err := parseRun(t, "--config", example); err != nil {
		t.Fatalf("%s as shipped: %v", example, err)
	}

	// Uncomment every commented-out key that is a flag name.
	var commented []string
	uncommented := commentedKey.ReplaceAllFunc(data, func(line []byte) []byte {
		name := commentedKey.FindSubmatch(line)[1]
		if known[string(name)] == nil {
			return line // a comment that happens to look like a key
		}
		commented = append(commented, string(name))
		return line[2:]
	})
	if len(commented) == 0 {
		t.Fatal("no commented-out keys found")
	}
	path := writeConfig(t, string(uncommented))
	var rc runConfig
	var sc statusConfig
	var pc republishConfig
	for cmd, f := range map[string]*flags{"run": runFlags(&rc), "status": statusFlags(&sc), "republish": republishFlags(&pc)} {
		if err := f.parse([]string{"--config", path}, &bytes.Buffer{}); err != nil {
			t.Fatalf("%s with every key uncommented (%s): %v", example, cmd, err)
		}
		for _, name := range commented {
			if fl := f.fs.Lookup(name); fl != nil && fl.Value.String() != fl.DefValue {
				t.Errorf("%s shows \"# %s: %s\", but the default is %q", example, name, fl.Value.String(), fl.DefValue)
			}
		}
	}
	if err := rc.validate(); err != nil {
		t.Errorf("%s with every key uncommented does not validate: %v", example, err)
	}
}

// TestStatusSharesTheFile: status reads its keys from the same file as run.
func TestStatusSharesTheFile(t *testing.T) {
	path := writeConfig(t, "slot: shared\nkafka-brokers: k:9092\ntimeout: 3s\njson: true\n")
	var sc statusConfig
	if err := statusFlags(&sc).parse([]string{"--config", path}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if sc.Slot != "shared" || sc.Timeout != 3*time.Second || !sc.JSON {
		t.Errorf("status: %+v", sc)
	}
	c, err := parseRun(t, "--config", path)
	if err != nil || c.Slot != "shared" || c.KafkaBrokers != "k:9092" {
		t.Errorf("run: slot %q brokers %q err %v", c.Slot, c.KafkaBrokers, err)
	}
}

func TestHelpMentionsConfig(t *testing.T) {
	var c runConfig
	var out bytes.Buffer
	if err := runFlags(&c).parse([]string{"--help"}, &out); !errors.Is(err, errHelp) {
		t.Fatal(err)
	}
	for _, want := range []string{"--config file", "env CDC_OUTBOX_CONFIG", "wins over the file"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	var top bytes.Buffer
	cli([]string{"help"}, &top, &top)
	if !strings.Contains(top.String(), "--config") || !strings.Contains(top.String(), "CDC_OUTBOX_CONFIG") {
		t.Errorf("cdc-outbox help lacks --config:\n%s", top.String())
	}
}

func TestCLIConfigFileError(t *testing.T) {
	path := writeConfig(t, "kafka-brokerz: k:9092\n")
	var out, errOut bytes.Buffer
	if code := cli([]string{"run", "--config", path}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), `unknown key "kafka-brokerz" (did you mean "kafka-brokers"?)`) {
		t.Fatalf("code %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := cli([]string{"status", "--config", path}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), `unknown key "kafka-brokerz"`) {
		t.Fatalf("status: code %d, stderr %q", code, errOut.String())
	}
}

func TestLevenshtein(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"slot", "slot", 0}, {"slto", "slot", 2}, {"kafka-broker", "kafka-brokers", 1}, {"", "abc", 3}, {"kitten", "sitting", 3}} {
		if got := levenshtein(tc.a, tc.b); got != tc.d {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}

// TestConfigFileOutboxes: the outboxes list gives each outbox its table or
// pattern and the settings it has instead of the global flags, which stay
// the defaults of the others.
func TestConfigFileOutboxes(t *testing.T) {
	path := writeConfig(t, `
topic: "events.{aggregate_type}"
column-payload: body
outboxes:
  - table: billing.outbox
    topic: "billing.{event_type}"
    column-id: event_id
    source: billing
    record-format: cloudevents-binary
  - table: 'tenant_*.outbox'
    on-bad-event: dead-letter
`)
	c, err := parseRun(t, "--config", path, "--dead-letter-topic", "dlq")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	specs := c.outboxes()
	if len(specs) != 2 {
		t.Fatalf("%d outboxes, want 2", len(specs))
	}
	b, tenant := specs[0], specs[1]
	if b.Pattern.String() != "billing.outbox" || b.Mapping.Topic != "billing.{event_type}" || b.Mapping.IDColumn != "event_id" ||
		b.Mapping.PayloadColumn != "body" || b.Mapping.Source != "billing" || b.Mapping.Format != mapping.FormatCloudEventsBinary {
		t.Errorf("billing: %s %+v", b.Pattern, b.Mapping)
	}
	if tenant.Pattern.String() != "tenant_*.outbox" || !tenant.Pattern.IsGlob() || tenant.Mapping.Topic != "events.{aggregate_type}" ||
		tenant.Mapping.IDColumn != "id" || tenant.Mapping.PayloadColumn != "body" || tenant.Mapping.Source != "" || tenant.Mapping.Format != mapping.FormatNative {
		t.Errorf("tenants: %s %+v", tenant.Pattern, tenant.Mapping)
	}
	if b.OnBadEvent != "" || tenant.OnBadEvent != pipeline.DeadLetter {
		t.Errorf("bad-event policies %q and %q, want the stream's (\"\") and dead-letter", b.OnBadEvent, tenant.OnBadEvent)
	}
	// status reads the same file and ignores the list.
	var sc statusConfig
	if err := statusFlags(&sc).parse([]string{"--config", path}, &bytes.Buffer{}); err != nil {
		t.Fatalf("status: %v", err)
	}
}

func TestConfigFileOutboxesErrors(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"outboxes: billing.outbox\n", `:1: outboxes: want a list of outboxes`},
		{"outboxes:\n  - topic: x\n", `:2: outboxes: an outbox without table`},
		{"outboxes:\n  - table: a.b\n    colum-id: x\n", `:3: outboxes: unknown key "colum-id" (did you mean "column-id"?)`},
		{"outboxes:\n  - table: a.b\n    column-id: 7\n", `:3: outboxes: column-id: want a string, got the integer 7`},
		{"outboxes:\n  - table: a.b.c\n", `:2: outboxes: table "a.b.c": invalid name syntax`},
		{"outboxes:\n  - table: a.b\n    topic: x\n    topic: y\n", `:4: outboxes: topic is given twice`},
	} {
		_, err := parseRun(t, "--config", writeConfig(t, tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.file, err, tc.want)
		}
	}
	for _, tc := range []struct {
		file string
		args []string
		want string
	}{
		{"outboxes:\n  - table: 'tenant_*.outbox'\n    source: tenants\n", nil, `source "tenants" for the pattern tenant_*.outbox: each table it matches needs a source of its own`},
		{"outboxes:\n  - table: a.b\n    topic: 'bad topic {'\n", nil, `cdc-outbox.yaml:2: mapping:`},
		{"outboxes:\n  - table: a.b\n", []string{"--table", "x.y"}, `--table "x.y" with the configuration file's outboxes list`},
		{"outboxes:\n  - table: a.b\n    record-format: cloudevents-binary\n    source: 'billing outbox'\n", nil, `source "billing outbox": record-format cloudevents-binary needs a URI-reference`},
		{"outboxes:\n  - table: a.b\n    record-format: cloudevents\n", nil, `cloudevents`},
		{"outboxes:\n  - table: a.b\n    on-bad-event: skip\n", nil, `cdc-outbox.yaml:2: on-bad-event "skip": use fail or dead-letter`},
		{"outboxes:\n  - table: a.b\n    on-bad-event: dead-letter\n", []string{"--dead-letter-topic", ""}, `cdc-outbox.yaml:2: on-bad-event dead-letter needs --dead-letter-topic`},
	} {
		c, err := parseRun(t, append([]string{"--config", writeConfig(t, tc.file)}, tc.args...)...)
		if err == nil {
			err = c.validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: %v, want %q", tc.file, tc.args, err, tc.want)
		}
	}
}

// TestExampleConfigFileOutboxes: the example's commented-out outboxes list,
// uncommented, is a valid configuration.
func TestExampleConfigFileOutboxes(t *testing.T) {
	data, err := os.ReadFile("../../cdc-outbox.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?m)^# outboxes:\n(^#   .*\n)+`).Find(data)
	if block == nil {
		t.Fatal("cdc-outbox.example.yaml has no commented-out outboxes list (\"# outboxes:\" and its entries)")
	}
	c, err := parseRun(t, "--config", writeConfig(t, regexp.MustCompile(`(?m)^# ?`).ReplaceAllString(string(block), "")))
	if err == nil {
		err = c.validate()
	}
	if err != nil || len(c.Outboxes) < 2 {
		t.Fatalf("the example's outboxes list: %d outboxes, %v", len(c.Outboxes), err)
	}
}
