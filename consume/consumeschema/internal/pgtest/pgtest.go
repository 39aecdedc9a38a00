// Package pgtest gives a library's integration tests a database of their
// own on the real PostgreSQL of the test environment.
//
// The server is CDC_OUTBOX_TEST_POSTGRES_URL, a superuser's URL (`make
// test` starts a local server and sets it). A missing server fails the
// test; only `go test -short` skips it. Each library module (outbox,
// idempotency, consume) has this same file: a module of its own cannot
// import the repository's internal/testenv without pulling the streamer's
// dependencies into the module graph of every service that imports the
// library. A test at the repository root keeps the copies identical.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const envPostgres = "CDC_OUTBOX_TEST_POSTGRES_URL"

// Require returns the value of the environment variable env, skipping the
// test under -short and failing it when env is unset.
func Require(t testing.TB, env string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs PostgreSQL and Kafka; run `make test`")
	}
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `make test`, which starts a local server, or point it at your own", env)
	}
	return v
}

// Name returns a fresh lower-case identifier with the given prefix, usable
// as a database, table, group or topic name.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Context returns a context cancelled at the end of the test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// Database creates a database of the test's own and returns its URL. At
// cleanup it drops the database and every replication slot in it.
func Database(t testing.TB) string {
	t.Helper()
	admin := Require(t, envPostgres)
	name := Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() { dropDatabase(t, admin, name) })
	cfg, err := pgconn.ParseConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
}

func dropDatabase(t testing.TB, admin, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Logf("cleanup: connect: %v", err)
		return
	}
	defer conn.Close(ctx)
	// A slot pins its database: drop the test's slots first.
	_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE database = $1 AND active_pid IS NOT NULL`, name)
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = $1 AND NOT active`, name)
		var left int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, name).Scan(&left)
		if err == nil && left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Logf("cleanup: drop database %s: %v", name, err)
	}
}

// Connect opens a connection to url, closed at cleanup.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(Context(t), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Exec runs SQL on url, failing the test on error.
func Exec(t testing.TB, url string, sql string, args ...any) {
	t.Helper()
	conn := Connect(t, url)
	if _, err := conn.Exec(Context(t), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}
