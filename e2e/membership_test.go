package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// Publication membership of the tables an outbox pattern matches: a table
// joins a publication only from the WAL point of the change that added it,
// so every way a table can come to match must add it in that transaction
// (sql/outbox-membership.sql, installed by the start itself when it may),
// and what cannot be streamed must be said, never silently missed.

// statusJSON runs cdc-outbox status --json with args and decodes it into v.
func (e *env) statusJSON(v any, args ...string) bool {
	out, _ := exec.Command(binary, append([]string{"status", "--json", "--postgres-url", e.url, "--slot", e.slot}, args...)...).Output()
	return json.Unmarshal(out, v) == nil
}

// TestPatternMembershipInstalledAtStart: with --table 'ms_*.outbox' and a
// superuser, the start installs the membership trigger and registers the
// pattern itself (nobody ran sql/outbox-membership.sql), so every row of a
// tenant created after start arrives, however the table came to match:
// CREATE TABLE, CREATE SCHEMA ... CREATE TABLE, ALTER SCHEMA ... RENAME,
// and CREATE TABLE ... AS, whose rows are written before the table can
// join. Before the fix none of them was in the publication (a tenant
// created after start lost all of its rows, 21 of 21).
func TestPatternMembershipInstalledAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	tables := ts.create("ms_", 1)
	s := e.start(e.manyArgs("ms_*.outbox", "--slot-poll-interval", "1s")...)
	e.waitStreaming()
	eventually(t, time.Minute, "the start to say it installed the membership trigger", func() bool {
		return s.logged(`"msg":"installed the membership trigger`, `"patterns":"ms_*.outbox"`)
	})
	ctx := testenv.Context(t)

	// A plain new tenant, as the issue tried it.
	testenv.Exec(t, e.url, `CREATE SCHEMA ms_plain; `+tenantOutbox("ms_plain.outbox"))
	tables = append(tables, "ms_plain.outbox")
	// CREATE SCHEMA with its table as a schema element.
	testenv.Exec(t, e.url, `CREATE SCHEMA ms_elem `+tenantOutbox("outbox"))
	tables = append(tables, "ms_elem.outbox")
	// A schema renamed into the pattern, its table made before.
	testenv.Exec(t, e.url, `CREATE SCHEMA staging_r; `+tenantOutbox("staging_r.outbox")+`; ALTER SCHEMA staging_r RENAME TO ms_renamed`)
	tables = append(tables, "ms_renamed.outbox")
	for _, table := range tables {
		if err := ts.write(ctx, table, 21, 3); err != nil {
			t.Fatal(err)
		}
	}
	// CREATE TABLE ... AS: its 10 rows are written by the command itself.
	const ctas = "ms_ctas.outbox"
	testenv.Exec(t, e.url, `CREATE SCHEMA ms_ctas; CREATE TABLE ms_ctas.outbox AS SELECT g::bigint AS id, 'payment'::text AS aggregate_type,
		'ms_ctas.outbox-a0'::text AS aggregate_id, 'PaymentCreated'::text AS event_type, jsonb_build_object('seq', g) AS payload,
		NULL::jsonb AS headers, now() AS created_at FROM generate_series(1, 10) g`)
	ts.mu.Lock()
	for i := 1; i <= 10; i++ {
		ts.events = append(ts.events, tenantEvent{table: ctas, id: strconv.Itoa(i), aggregate: ctas + "-a0", seq: i})
	}
	ts.mu.Unlock()

	v := ts.verify(e.topic("payment"), ts.sources(append(tables, ctas)), 2*time.Minute)
	t.Logf("verifier over tenants made after start (plain, schema element, schema renamed: 21 rows each; CREATE TABLE AS: 10): %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.unknown != 0 || v.tables != len(tables)+1 {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	var r struct {
		Membership string `json:"membership_trigger"`
	}
	if !e.statusJSON(&r, "--publication", e.slot, "--table", "ms_*.outbox") || r.Membership != "installed" {
		t.Errorf("status: membership_trigger %q, want installed", r.Membership)
	}
	if s.logged(`not in the publication`) {
		t.Error("a gap was reported, though every table joined the publication when it came to match")
	}
	s.stop()
}

// TestPatternTemporaryAndUnloggedTables: under --table '*.outbox', another
// session's temporary outbox (pg_temp_N.outbox) is never found as an
// outbox: the start, which creates the publication of the tables it
// finds, does not fail on it (before the fix: "cannot add relation to
// publication ... temporary tables"). With the membership trigger, CREATE
// TEMP TABLE outbox and CREATE UNLOGGED TABLE app.outbox succeed (before:
// the trigger failed the user's DDL); the monitor and status say, loudly,
// that neither is streamed; ALTER TABLE ... SET LOGGED makes the unlogged
// one join, and its rows from then on arrive.
func TestPatternTemporaryAndUnloggedTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	applySQLFiles(t, e.url, "../sql/outbox-membership.sql")
	ctx := testenv.Context(t)
	// Another session, holding its temporary outbox across the start.
	other := testenv.Connect(t, e.url)
	if _, err := other.Exec(ctx, tenantOutbox("pg_temp.outbox")); err != nil {
		t.Fatal(err)
	}
	ts := newTenants(e)
	tables := ts.create("tu_", 1)
	s := e.start(e.manyArgs("*.outbox", "--slot-poll-interval", "1s")...)
	e.waitStreaming()
	addr := s.httpAddr()
	tempWarned := regexp.MustCompile(`"level":"WARN".*TEMPORARY table matches an outbox pattern.*"table":"pg_temp_\d+\.outbox"`)
	eventually(t, time.Minute, "a warning of the other session's temporary table", func() bool { return tempWarned.MatchString(s.logText()) })

	// DDL under the registered pattern that cannot be published succeeds.
	mine := testenv.Connect(t, e.url)
	for _, ddl := range []string{
		tenantOutbox("pg_temp.outbox"),
		`CREATE SCHEMA tu_unlogged; ` + strings.Replace(tenantOutbox("tu_unlogged.outbox"), "CREATE TABLE", "CREATE UNLOGGED TABLE", 1),
	} {
		if _, err := mine.Exec(ctx, ddl); err != nil {
			t.Fatalf("%.60s...: %v (DDL the membership trigger cannot publish must still succeed)", ddl, err)
		}
	}
	eventually(t, time.Minute, "a warning of the UNLOGGED table, counted as unpublished", func() bool {
		return s.logged(`"level":"WARN"`, `UNLOGGED`, `"table":"tu_unlogged.outbox"`) && scrape(t, addr)["cdc_outbox_outboxes_unpublished"] == 1
	})
	var r struct {
		Temporary []string `json:"temporary_tables"`
		Warnings  []string `json:"warnings"`
		Outboxes  []struct {
			Table         string `json:"table"`
			InPublication bool   `json:"in_publication"`
		} `json:"outboxes"`
	}
	if !e.statusJSON(&r, "--publication", e.slot, "--table", "*.outbox") {
		t.Fatal("status --json did not answer")
	}
	warnings := strings.Join(r.Warnings, "\n")
	if len(r.Temporary) != 2 || !strings.Contains(warnings, "UNLOGGED") || !strings.Contains(warnings, "temporary table pg_temp_") {
		t.Errorf("status: temporary tables %v, warnings:\n%s\nwant both temporary tables and the UNLOGGED one named", r.Temporary, warnings)
	}
	for _, o := range r.Outboxes {
		if strings.HasPrefix(o.Table, "pg_temp") {
			t.Errorf("status lists the temporary table %s as an outbox", o.Table)
		}
	}

	// Made LOGGED, it joins; its rows from then on arrive, beside a
	// tenant written all along.
	testenv.Exec(t, e.url, `ALTER TABLE tu_unlogged.outbox SET LOGGED`)
	eventually(t, time.Minute, "cdc_outbox_outboxes_unpublished 0 once the table is LOGGED", func() bool {
		return scrape(t, addr)["cdc_outbox_outboxes_unpublished"] == 0
	})
	tables = append(tables, "tu_unlogged.outbox")
	for _, table := range tables {
		if err := ts.write(ctx, table, 20, 4); err != nil {
			t.Fatal(err)
		}
	}
	v := ts.verify(e.topic("payment"), ts.sources(tables), 2*time.Minute)
	t.Logf("verifier: %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.unknown != 0 || v.tables != len(tables) {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	s.stop()
}

// TestPatternMembershipCommandForNonSuperuser: a role that may not create
// event triggers cannot install the membership trigger, so the start says,
// as an error, the one command that does; status says it too. Run as it
// says, a tenant created afterwards streams from its first row.
func TestPatternMembershipCommandForNonSuperuser(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	role, password := testenv.Name("cdc"), randomPassword()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, c := range []struct{ url, sql string }{{e.url, "DROP OWNED BY " + role}, {testenv.PostgresURL(t), "DROP ROLE IF EXISTS " + role}} {
			if conn, err := pgx.Connect(ctx, c.url); err == nil {
				_, _ = conn.Exec(ctx, c.sql)
				conn.Close(ctx)
			}
		}
	})
	e.leastPrivilege(role, password)
	testenv.Exec(t, e.url, `CREATE PUBLICATION `+e.slot+` WITH (publish = 'insert')`)
	e.runURL = asUser(t, e.url, role, password)
	s := e.start(append(e.manyArgs("np_*.outbox"), leastPrivilegeFlags...)...)
	e.waitStreaming()
	command := regexp.MustCompile(`"level":"ERROR".*Run once, as a superuser: (psql -d \S+ -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql -c \\"SELECT cdc_outbox.watch\(([^"\\]|\\.)*\)\\")`)
	var said string
	eventually(t, time.Minute, "the start to say the command that installs the membership trigger", func() bool {
		m := command.FindStringSubmatch(s.logText())
		if m != nil {
			said = strings.ReplaceAll(m[1], `\"`, `"`)
		}
		return m != nil
	})
	t.Logf("the start says: %s", said)
	var r struct {
		Membership string   `json:"membership_trigger"`
		Warnings   []string `json:"warnings"`
	}
	if !e.statusJSON(&r, "--publication", e.slot, "--table", "np_*.outbox") || r.Membership != "missing" ||
		!strings.Contains(strings.Join(r.Warnings, "\n"), said) {
		t.Errorf("status: membership_trigger %q, warnings %v; want missing, and the command %s", r.Membership, r.Warnings, said)
	}

	// Run it as it says, from the repository, as a superuser.
	cfg, err := pgconn.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	run := exec.Command("sh", "-c", said)
	run.Dir = ".."
	run.Env = append(os.Environ(), "PGHOST="+cfg.Host, "PGPORT="+strconv.Itoa(int(cfg.Port)), "PGUSER="+cfg.User)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", said, err, out)
	}
	ts := newTenants(e)
	tables := ts.create("np_", 2)
	for _, table := range tables {
		if err := ts.write(ctx, table, 21, 3); err != nil {
			t.Fatal(err)
		}
	}
	v := ts.verify(e.topic("payment"), ts.sources(tables), 2*time.Minute)
	t.Logf("verifier over tenants created after the command ran: %s", v)
	if v.missing != 0 || v.unknown != 0 || v.tables != len(tables) {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	if !e.statusJSON(&r, "--publication", e.slot, "--table", "np_*.outbox") || r.Membership != "installed" {
		t.Errorf("status after the command: membership_trigger %q, want installed", r.Membership)
	}
	s.stop()
}
