package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// statusDatabase is a database of the test's own with the default outbox
// table and publication, and a pgoutput slot under a fresh name.
func statusDatabase(t *testing.T) (url, slot string) {
	t.Helper()
	url = testenv.Database(t)
	sql, err := os.ReadFile("../../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, url, string(sql))
	slot = testenv.Name("slot")
	testenv.Exec(t, url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	return url, slot
}

func status(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli(append([]string{"status"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// squash collapses runs of white space, so checks need not know the
// alignment.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestStatusInactiveSlot(t *testing.T) {
	t.Parallel()
	url, slot := statusDatabase(t)

	code, out, errOut := status(t, "--postgres-url", url, "--slot", slot)
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{slot, "plugin: pgoutput", "wal_status: reserved", "tables: public.outbox", "active: no",
		"retained WAL: ", "publishes inserts: yes", "in publication: yes", "verdict: slot inactive",
		"it holds ", "rows (estimate): unknown (never analyzed)"} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "error:") {
		t.Errorf("an inactive slot is no error:\n%s", out)
	}
	t.Logf("text output:\n%s", out)

	code, out, _ = status(t, "--postgres-url", url, "--slot", slot, "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("--json output is not one JSON object: %v\n%s", err, out)
	}
	for _, key := range []string{"verdict", "exit_code", "message", "warnings", "error", "slot", "slot_exists", "plugin",
		"database", "active", "active_pid", "holder_client_addr", "holder_since", "confirmed_flush_lsn", "restart_lsn", "current_wal_lsn", "lag_bytes",
		"retained_wal_bytes", "retained_wal", "wal_status", "invalidation_reason", "conflicting", "inactive_since",
		"publication", "publication_exists", "publishes_inserts",
		"publication_tables", "table", "table_exists", "table_in_publication", "table_rows_estimate", "outboxes"} {
		if _, ok := r[key]; !ok {
			t.Errorf("JSON lacks key %q: %s", key, out)
		}
	}
	if r["slot"] != slot || r["plugin"] != "pgoutput" || r["wal_status"] != "reserved" || r["verdict"] != "slot_inactive" ||
		r["active"] != false || r["table_in_publication"] != true || r["table_rows_estimate"] != float64(-1) {
		t.Errorf("JSON: %s", out)
	}
	// PostgreSQL 17 says since when a slot is inactive; older servers do not.
	since, _ := r["inactive_since"].(string)
	if major := testenv.ServerMajor(t, url); major >= 17 {
		if _, err := time.Parse(time.RFC3339, since); err != nil {
			t.Errorf("PostgreSQL %d: inactive_since = %q, want an RFC 3339 time: %v", major, since, err)
		}
		if !strings.Contains(squash(out), "since "+since) {
			t.Errorf("PostgreSQL %d: the message does not say since when the slot is inactive: %s", major, out)
		}
	} else if since != "" {
		t.Errorf("PostgreSQL %d: inactive_since = %q, want none", major, since)
	}
	if r["invalidation_reason"] != "" || r["conflicting"] != false {
		t.Errorf("a valid slot: invalidation_reason %v, conflicting %v", r["invalidation_reason"], r["conflicting"])
	}
	if tables, _ := r["publication_tables"].([]any); len(tables) != 1 || tables[0] != "public.outbox" {
		t.Errorf("publication_tables = %v", r["publication_tables"])
	}
	if w, _ := r["warnings"].([]any); w == nil || len(w) != 0 {
		t.Errorf("warnings = %v, want []", r["warnings"])
	}
	t.Logf("JSON output: %s", out)
}

// TestStatusActiveSlot streams from the slot, as cdc-outbox run would, and
// expects the verdict healthy with the walsender's pid.
func TestStatusActiveSlot(t *testing.T) {
	t.Parallel()
	url, slot := statusDatabase(t)
	testenv.Exec(t, url, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'e', '{}'); ANALYZE outbox`)

	ctx := testenv.Context(t)
	repl, err := pgconn.Connect(ctx, url+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = repl.Close(context.Background()) })
	err = pglogrepl.StartReplication(ctx, repl, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'cdc_outbox'"},
	})
	if err != nil {
		t.Fatal(err)
	}

	var code int
	var out, errOut string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, out, errOut = status(t, "--postgres-url", url, "--slot", slot); strings.Contains(squash(out), "active: yes (pid ") {
			break
		}
	}
	if code != 0 || !strings.Contains(squash(out), "active: yes (pid ") || !strings.HasSuffix(squash(out), "verdict: healthy") {
		t.Fatalf("exit %d, want 0 and healthy\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if strings.Contains(out, "warning:") || !strings.Contains(squash(out), "rows (estimate): 1 ") {
		t.Errorf("output:\n%s", out)
	}
	t.Logf("text output:\n%s", out)

	// Who holds the slot: the streaming connection's client address (the
	// test connects over TCP to 127.0.0.1) and since when.
	text := squash(out)
	code, out, _ = status(t, "--postgres-url", url, "--slot", slot, "--json")
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	since, _ := r["holder_since"].(string)
	if _, err := time.Parse(time.RFC3339, since); err != nil || r["holder_client_addr"] != "127.0.0.1" {
		t.Errorf("holder_client_addr %v, holder_since %q (%v): want the walsender's client and start", r["holder_client_addr"], since, err)
	}
	if !strings.Contains(text, "client 127.0.0.1, streaming since "+since) {
		t.Errorf("the text output does not say who holds the slot since %s:\n%s", since, text)
	}
}

func TestStatusMissingSlot(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	slot := testenv.Name("slot")

	code, out, errOut := status(t, "--postgres-url", url, "--slot", slot)
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"verdict: slot missing", "start cdc-outbox run (it creates the slot) or check --slot",
		`publication "cdc_outbox" does not exist`, "table public.outbox does not exist"} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("text output:\n%s", out)

	code, out, _ = status(t, "--postgres-url", url, "--slot", slot, "--json")
	var r statusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 1 {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	if r.Verdict != verdictMissing || r.ExitCode != 1 || r.SlotExists || !strings.Contains(r.Message, "check --slot") || len(r.Warnings) != 2 {
		t.Errorf("JSON: %s", out)
	}
}

func TestStatusCannotConnect(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://u:s3cret@127.0.0.1:1/x?sslmode=disable&connect_timeout=5",
		"host=127.0.0.1 port=1 user=u password=s3cret dbname=x sslmode=disable connect_timeout=5",
	} {
		for _, format := range [][]string{nil, {"--json"}} {
			code, out, errOut := status(t, append([]string{"--postgres-url", url}, format...)...)
			if code != 2 {
				t.Errorf("%v: exit %d, want 2\nstdout:\n%s\nstderr:\n%s", format, code, out, errOut)
			}
			if strings.Contains(out+errOut, "s3cret") {
				t.Errorf("the password leaked:\nstdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if !strings.Contains(errOut, "cannot connect to PostgreSQL") || !strings.Contains(errOut, "check --postgres-url") {
				t.Errorf("stderr does not say what to do: %s", errOut)
			}
			if format != nil {
				var r statusReport
				if err := json.Unmarshal([]byte(out), &r); err != nil || r.Verdict != verdictCannotConnect || r.ExitCode != 2 || r.Error == "" {
					t.Errorf("--json: %v, %s", err, out)
				}
			}
		}
	}
}

func TestStatusFlags(t *testing.T) {
	t.Setenv("CDC_OUTBOX_SLOT", "from_env")
	var c statusConfig
	f := statusFlags(&c)
	if err := f.parse(nil, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if c.Slot != "from_env" || c.Publication != "cdc_outbox" || c.Table != "public.outbox" || c.JSON {
		t.Errorf("config: %+v", c)
	}

	var help bytes.Buffer
	if err := statusFlags(&statusConfig{}).parse([]string{"--help"}, &help); !errors.Is(err, errHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, name := range f.order {
		if !strings.Contains(help.String(), "--"+name) || !strings.Contains(help.String(), "env "+envName(name)) {
			t.Errorf("help lacks --%s or %s", name, envName(name))
		}
	}
	if !strings.Contains(help.String(), "default cdc_outbox") || !strings.Contains(help.String(), "default public.outbox") {
		t.Errorf("help lacks defaults:\n%s", help.String())
	}

	code, _, errOut := status(t, "--slot", "Bad-Slot", "--table", "a.b.c")
	if code != 2 || !strings.Contains(errOut, `--slot "Bad-Slot"`) || !strings.Contains(errOut, `--table "a.b.c"`) {
		t.Errorf("bad flags: exit %d, %s", code, errOut)
	}
	if code, _, errOut := status(t, "extra"); code != 2 || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("extra argument: exit %d, %s", code, errOut)
	}
}

// TestStatusJudge covers verdicts a test server cannot easily be brought
// to, wal_status lost among them.
func TestStatusJudge(t *testing.T) {
	t.Parallel()
	base := func() *statusReport {
		r := newStatusReport(&statusConfig{Slot: "s", Publication: "cdc_outbox", Table: "outbox"})
		r.SlotExists, r.Plugin, r.Database, r.connectedDB = true, "pgoutput", "app", "app"
		r.Active, r.ActivePID, r.WALStatus = true, 42, "reserved"
		r.RetainedWALBytes, r.RetainedWAL = 3<<29, humanBytes(3<<29)
		r.PublicationExists, r.PublishesInserts, r.PublicationTables = true, true, []string{"public.outbox"}
		r.TableExists, r.TableInPublication = true, true
		return r
	}
	for _, tc := range []struct {
		name     string
		change   func(*statusReport)
		verdict  string
		code     int
		message  string
		warnings []string
	}{
		{"healthy", func(*statusReport) {}, verdictHealthy, 0, "", nil},
		{"inactive", func(r *statusReport) { r.Active, r.ActivePID = false, 0 }, verdictInactive, 0, "holds 1.5 GiB of WAL", nil},
		{"lost", func(r *statusReport) { r.Active, r.WALStatus = false, "lost" }, verdictLost, 1, "recovered from the outbox table", nil},
		{"lost, reason given (17+)", func(r *statusReport) { r.Active, r.WALStatus, r.InvalidationReason = false, "lost", "wal_removed" },
			verdictLost, 1, "raise max_slot_wal_keep_size", nil},
		{"idle too long (18+)", func(r *statusReport) { r.Active, r.WALStatus, r.InvalidationReason = false, "lost", "idle_timeout" },
			verdictLost, 1, "inactive longer than idle_replication_slot_timeout", nil},
		{"conflicting on a standby (16)", func(r *statusReport) { r.Active, r.Conflicting = false, true },
			verdictLost, 1, "conflicted with recovery", nil},
		{"inactive since (17+)", func(r *statusReport) {
			r.Active, r.InactiveSince, r.inactiveFor = false, "2026-01-02T03:04:05Z", 90*time.Second
		},
			verdictInactive, 0, "inactive since 2026-01-02T03:04:05Z (for 1m30s)", nil},
		{"missing", func(r *statusReport) { r.SlotExists = false }, verdictMissing, 1, "check --slot", nil},
		{"unreserved", func(r *statusReport) { r.WALStatus = "unreserved" }, verdictHealthy, 0, "", []string{"max_slot_wal_keep_size"}},
		{"wrong slot", func(r *statusReport) { r.Plugin, r.Database = "test_decoding", "other" }, verdictHealthy, 0, "",
			[]string{`uses plugin "test_decoding"`, `belongs to database "other"`}},
		{"publication without the table", func(r *statusReport) {
			r.PublishesInserts, r.TableInPublication, r.PublicationTables = false, false, []string{"public.other"}
		}, verdictHealthy, 0, "", []string{"SET (publish = 'insert')", `ADD TABLE "public"."outbox"`}},
	} {
		r := base()
		tc.change(r)
		r.judge()
		if r.Verdict != tc.verdict || r.ExitCode != tc.code || !strings.Contains(r.Message, tc.message) || (tc.message == "") != (r.Message == "") {
			t.Errorf("%s: verdict %s, exit %d, message %q", tc.name, r.Verdict, r.ExitCode, r.Message)
		}
		if len(r.Warnings) != len(tc.warnings) {
			t.Errorf("%s: warnings %q, want %d", tc.name, r.Warnings, len(tc.warnings))
			continue
		}
		for i, w := range tc.warnings {
			if !strings.Contains(r.Warnings[i], w) {
				t.Errorf("%s: warning %q lacks %q", tc.name, r.Warnings[i], w)
			}
		}
		var out bytes.Buffer
		r.writeText(&out)
		if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); !strings.HasPrefix(lines[len(lines)-1-min(len(r.Message), 1)], "verdict:") {
			t.Errorf("%s: the verdict is not last (but for its message):\n%s", tc.name, out.String())
		}
		if tc.name == "lost" {
			t.Logf("lost:\n%s", out.String())
		}
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{1536, "1.5 KiB"},
		{1<<20 - 1, "1 MiB"},
		{16 << 20, "16 MiB"},
		{3 << 29, "1.5 GiB"},
		{1<<30 + 1<<20, "1 GiB"},
		{5 << 40, "5 TiB"},
		{math.MaxInt64, "8 EiB"},
		{-2048, "-2 KiB"},
		{math.MinInt64, "-8 EiB"},
	} {
		if got := humanBytes(tc.in); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestStatusPrerequisites: status reports first what run would stop on
// before it looks at the slot (wal_level, a role without REPLICATION), in
// run's words, not a missing slot that run would create.
func TestStatusPrerequisites(t *testing.T) {
	t.Parallel()
	sql, err := os.ReadFile("../../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("wal_level replica", func(t *testing.T) {
		t.Parallel()
		c := testenv.Cluster(t, testenv.ClusterOptions{Config: []string{"wal_level = replica", "max_wal_senders = 10"}})
		testenv.Exec(t, c.URL, string(sql))
		checkUnmet(t, c.URL, `wal_level is "replica", logical decoding needs logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL`)
	})

	t.Run("role without REPLICATION", func(t *testing.T) {
		t.Parallel()
		url := statusDatabaseNoSlot(t, string(sql))
		role := testenv.Name("role")
		testenv.Exec(t, url, "CREATE ROLE "+role+" LOGIN NOREPLICATION")
		t.Cleanup(func() { testenv.Exec(t, url, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
		cfg, err := pgconn.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		roleURL := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", role, cfg.Host, cfg.Port, cfg.Database)
		checkUnmet(t, roleURL, fmt.Sprintf(`role %q lacks the REPLICATION attribute: run ALTER ROLE "%s" WITH REPLICATION`, role, role))
	})
}

// statusDatabaseNoSlot is a database of the test's own with the default
// outbox table and publication, and no slot.
func statusDatabaseNoSlot(t *testing.T, sql string) string {
	url := testenv.Database(t)
	testenv.Exec(t, url, sql)
	return url
}

// checkUnmet runs status and run against url, where no slot exists, and
// wants both to give cause first.
func checkUnmet(t *testing.T, url, cause string) {
	t.Helper()
	code, out, errOut := status(t, "--postgres-url", url)
	t.Logf("status:\n%s", out)
	if code != 1 || !strings.Contains(squash(out), "verdict: prerequisite unmet") || !strings.Contains(squash(out), "error: cdc-outbox run cannot stream from this server as this role: "+cause) {
		t.Errorf("status: exit %d, want 1 and %q first\nstdout:\n%s\nstderr:\n%s", code, cause, out, errOut)
	}
	if strings.Contains(out, "start cdc-outbox run (it creates the slot)") {
		t.Errorf("status advises starting run, which would fail:\n%s", out)
	}
	code, out, _ = status(t, "--postgres-url", url, "--json")
	var r statusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 1 || r.Verdict != verdictUnmet || !strings.Contains(r.Message, cause) {
		t.Errorf("--json: exit %d, %v\n%s", code, err, out)
	}

	var runOut, runErr bytes.Buffer
	code = cli([]string{"run", "--postgres-url", url, "--http-addr", "", "--kafka-brokers", "127.0.0.1:1"}, &runOut, &runErr)
	if code != 1 || !strings.Contains(runErr.String(), strings.ReplaceAll(cause, `"`, `\"`)) {
		t.Errorf("run: exit %d, want 1 and %q\n%s", code, cause, runErr.String())
	}
}

// TestStatusManyOutboxes: with a pattern in --table, status lists every
// table it matches, says which the publication misses and how to add it,
// and sums them up in the table keys; with --metrics-url it reads each
// one's events streamed and last event from a streamer's /metrics, and the
// schemas it writes by.
func TestStatusManyOutboxes(t *testing.T) {
	t.Parallel()
	url, slot := statusDatabase(t)
	const cols = `(id bigserial, aggregate_type text, aggregate_id text, event_type text, payload jsonb)`
	testenv.Exec(t, url, `CREATE SCHEMA so_a; CREATE SCHEMA so_b; CREATE TABLE so_a.outbox `+cols+`; CREATE TABLE so_b.outbox `+cols+`;
		CREATE PUBLICATION so FOR TABLE so_a.outbox WITH (publish = 'insert')`)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE cdc_outbox_outbox_events_total counter\ncdc_outbox_outbox_events_total{outbox=\"so_a.outbox\"} 42\n"+
			"cdc_outbox_outbox_last_event_timestamp_seconds{outbox=\"so_a.outbox\"} 1.7960832e+09\n"+
			"cdc_outbox_schema_info{outbox=\"so_*.outbox\",registry=\"http://registry:8081\",schema_id=\"7\",subject=\"payment-value\",version=\"3\"} 1\n")
	}))
	defer metrics.Close()
	args := []string{"--postgres-url", url, "--slot", slot, "--publication", "so", "--table", "so_*.outbox", "--metrics-url", metrics.URL}
	code, out, errOut := status(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"table: so_*.outbox", "outboxes: 2", "so_a.outbox: in publication yes, rows (estimate) unknown (never analyzed), streamed 42, last event 2026-12-01T00:00:00Z",
		"so_b.outbox: in publication no", `ALTER PUBLICATION "so" ADD TABLE "so_b"."outbox"`,
		"schema registry: http://registry:8081", "so_*.outbox: subject payment-value: schema 7, version 3"} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = status(t, append(args, "--json")...)
	var r struct {
		TableExists        bool `json:"table_exists"`
		TableInPublication bool `json:"table_in_publication"`
		Outboxes           []struct {
			Table          string `json:"table"`
			InPublication  bool   `json:"in_publication"`
			EventsStreamed int64  `json:"events_streamed"`
			LastEvent      string `json:"last_event"`
		} `json:"outboxes"`
		Schemas []statusSchema `json:"schemas"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if !r.TableExists || r.TableInPublication || len(r.Outboxes) != 2 || r.Outboxes[0].EventsStreamed != 42 || r.Outboxes[1].EventsStreamed != -1 ||
		r.Outboxes[1].InPublication || r.Outboxes[1].LastEvent != "" ||
		len(r.Schemas) != 1 || r.Schemas[0] != (statusSchema{Outbox: "so_*.outbox", Registry: "http://registry:8081", Subject: "payment-value", ID: 7, Version: 3}) {
		t.Errorf("JSON: %s", out)
	}
}

// TestStatusEpochsEitherDelivery: the stream's history epochs live in the
// checkpoint topic in both deliveries, and status shows them in both, with
// the warning of a lost history; in at-least-once delivery it reads Kafka
// only when told of it (--kafka-brokers), and says when it did not. Before,
// at-least-once status never showed them.
func TestStatusEpochsEitherDelivery(t *testing.T) {
	t.Parallel()
	url, slot := statusDatabase(t)
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Name("checkpoints")
	stream, err := replication.StreamIdentity(testenv.Context(t), url, slot)
	if err != nil {
		t.Fatal(err)
	}
	w, err := sink.NewStreamRecords(sink.Config{Brokers: brokers}, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	epochs := checkpoint.Epochs{{N: 1, Timeline: 2, From: 0x3000000, LostTimeline: 1, LostFrom: 0x3000000, LostTo: 0x3100000, At: time.Now()}}
	if err := w.Write(testenv.Context(t), sink.EpochsKey(stream), epochs.Encode()); err != nil {
		t.Fatal(err)
	}
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		args := []string{"--postgres-url", url, "--slot", slot, "--delivery", delivery, "--kafka-brokers", brokers[0], "--checkpoint-topic", topic}
		_, out, errOut := status(t, args...)
		if !strings.Contains(squash(out), "history epoch: 1 (the events' sources end in /epoch-1)") || !strings.Contains(squash(out), "lost history: epoch 1: from 0/3000000 on timeline 2") ||
			!strings.Contains(out, "cdc-outbox lost-events") {
			t.Errorf("%s: the text does not show the epoch and warn of the lost history:\n%s\n%s", delivery, out, errOut)
		}
		_, out, _ = status(t, append(args, "--json")...)
		var r struct {
			HistoryEpoch int      `json:"history_epoch"`
			Epochs       []string `json:"history_epochs"`
			Read         bool     `json:"history_epochs_read"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.HistoryEpoch != 1 || len(r.Epochs) != 1 || !r.Read {
			t.Errorf("%s --json: %v, %+v\n%s", delivery, err, r, out)
		}
	}
	// At-least-once before the stream made the topic: no epoch, no warning.
	_, out, _ := status(t, "--postgres-url", url, "--slot", slot, "--kafka-brokers", brokers[0], "--checkpoint-topic", testenv.Name("none"))
	if !strings.Contains(squash(out), "history epoch: 0 (no history lost)") || strings.Contains(out, "history epochs from Kafka") {
		t.Errorf("at-least-once, no checkpoint topic yet:\n%s", out)
	}
	// At-least-once without Kafka named: not read, and said so.
	_, out, _ = status(t, "--postgres-url", url, "--slot", slot, "--checkpoint-topic", topic)
	if !strings.Contains(squash(out), "history epoch: not read (give --kafka-brokers") || strings.Contains(out, "lost-events") {
		t.Errorf("at-least-once without --kafka-brokers:\n%s", out)
	}
}
