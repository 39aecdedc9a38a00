package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

func TestValidSource(t *testing.T) {
	for s, ok := range map[string]bool{
		"":                          true, // the default
		"payments":                  true,
		"payments-eu/public.outbox": true,
		"zahlungen äöü":             true,
		strings.Repeat("s", 255):    true,
		strings.Repeat("s", 256):    false,
		"tab\there":                 false,
		"\xff":                      false,
	} {
		if validSource(s) != ok {
			t.Errorf("validSource(%q) = %v, want %v", s, !ok, ok)
		}
	}
}

// --source comes from the flag, CDC_OUTBOX_SOURCE or the file's source key,
// like every flag; an unprintable one is refused at start.
func TestSourceSettings(t *testing.T) {
	path := writeConfig(t, "source: from-file\n")
	if c, err := parseRun(t, "--config", path); err != nil || c.Source != "from-file" {
		t.Errorf("file: %q, %v", c.Source, err)
	}
	t.Setenv("CDC_OUTBOX_SOURCE", "from-env")
	if c, err := parseRun(t, "--config", path); err != nil || c.Source != "from-env" {
		t.Errorf("environment: %q, %v", c.Source, err)
	}
	c, err := parseRun(t, "--config", path, "--source", "bad\x01")
	if err != nil {
		t.Fatal(err)
	}
	c.PostgresURL = "postgres://localhost/app"
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "--source") {
		t.Errorf("validate with an unprintable --source: %v", err)
	}
}

// TestDefaultSource: the default source is the table's identity, the same
// on every start and after the table, its schema and its database are
// renamed, and different for another table, and for a table of the same
// name in another database. (Another cluster differs by its system
// identifier, which every table of this server shares.)
func TestDefaultSource(t *testing.T) {
	t.Parallel()
	admin := testenv.PostgresURL(t)
	url := testenv.Database(t)
	testenv.Exec(t, url, `CREATE TABLE outbox (id bigserial PRIMARY KEY); CREATE TABLE other (id bigserial PRIMARY KEY)`)
	ctx := testenv.Context(t)
	resolve := func(url, table string) string {
		t.Helper()
		s, err := resolveSource(ctx, &runConfig{PostgresURL: url, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := resolve(url, "public.outbox")
	if !regexp.MustCompile(`^[0-9]+/[0-9]+/[0-9]+$`).MatchString(first) {
		t.Fatalf("default source %q: want <system identifier>/<database OID>/<table OID>", first)
	}
	if again := resolve(url, "outbox"); again != first {
		t.Errorf("the same table named without its schema: %q, want %q", again, first)
	}
	if other := resolve(url, "public.other"); other == first {
		t.Errorf("another table has the same source %q", other)
	}
	url2 := testenv.Database(t)
	testenv.Exec(t, url2, `CREATE TABLE outbox (id bigserial PRIMARY KEY)`)
	if elsewhere := resolve(url2, "public.outbox"); elsewhere == first || !strings.HasPrefix(elsewhere, strings.Split(first, "/")[0]+"/") {
		t.Errorf("public.outbox of another database: %q, want another source on the same system (%q)", elsewhere, first)
	}

	testenv.Exec(t, url, `CREATE SCHEMA events; ALTER TABLE outbox SET SCHEMA events; ALTER TABLE events.outbox RENAME TO outbox_v2`)
	if renamed := resolve(url, "events.outbox_v2"); renamed != first {
		t.Errorf("after moving and renaming the table: %q, want %q", renamed, first)
	}
	// Renaming the database itself (which needs it unused: the test's own
	// connections are ended, and the rename retried until their backends
	// are gone), then connecting to the new name.
	dbName := url[strings.LastIndex(url, "/")+1 : strings.Index(url, "?")]
	conn := testenv.Connect(t, admin)
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName)
		if _, err = conn.Exec(ctx, `ALTER DATABASE `+dbName+` RENAME TO `+dbName+`_renamed`); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("rename the database: %v", err)
	}
	renamedURL := strings.Replace(url, "/"+dbName+"?", "/"+dbName+"_renamed?", 1)
	t.Cleanup(func() { testenv.Exec(t, admin, `DROP DATABASE IF EXISTS `+dbName+`_renamed WITH (FORCE)`) })
	if renamed := resolve(renamedURL, "events.outbox_v2"); renamed != first {
		t.Errorf("after renaming the database: %q, want %q", renamed, first)
	}

	if s, err := resolveSource(ctx, &runConfig{PostgresURL: url, Table: "public.missing", Source: "payments"}); err != nil || s != "payments" {
		t.Errorf("--source given: %q, %v; want it as it is, without looking", s, err)
	}
}
