// Package testenv gives integration tests a real PostgreSQL and a real Kafka.
//
// Tests read where the servers are from CDC_OUTBOX_TEST_POSTGRES_URL and
// CDC_OUTBOX_TEST_KAFKA_BROKERS (`make test` starts local ones and sets
// both). The broker's SASL_SSL listener (TLS, SCRAM-SHA-512) is
// CDC_OUTBOX_TEST_KAFKA_SASL_BROKERS, its CA certificate (PEM)
// CDC_OUTBOX_TEST_KAFKA_CA, its user CDC_OUTBOX_TEST_KAFKA_SASL_USER and the
// file holding that user's password CDC_OUTBOX_TEST_KAFKA_SASL_PASSWORD_FILE
// (set by `make test` too, from scripts/kafka.sh). A missing server fails the
// test: only `go test -short` (make test-unit) skips integration tests, on
// purpose. Each test gets its own database, slot, publication and topic
// names, so tests run in parallel. A test that needs server settings the
// shared server must not have (TLS, a small max_slot_wal_keep_size) starts a
// cluster of its own with Cluster, of another major if it needs one, and a
// streaming standby of it with PostgresCluster.Standby.
// Proxy puts a TCP proxy of the test's own between a client and a server,
// to cut or silence the network between them.
//
// It is test support: it must never be imported by the streamer itself.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	envPostgres    = "CDC_OUTBOX_TEST_POSTGRES_URL"
	envKafka       = "CDC_OUTBOX_TEST_KAFKA_BROKERS"
	envPostgresCtl = "CDC_OUTBOX_TEST_POSTGRES_CTL"
	envKafkaCtl    = "CDC_OUTBOX_TEST_KAFKA_CTL"

	envKafkaSASL             = "CDC_OUTBOX_TEST_KAFKA_SASL_BROKERS"
	envKafkaCA               = "CDC_OUTBOX_TEST_KAFKA_CA"
	envKafkaSASLUser         = "CDC_OUTBOX_TEST_KAFKA_SASL_USER"
	envKafkaSASLPasswordFile = "CDC_OUTBOX_TEST_KAFKA_SASL_PASSWORD_FILE"
	envKafkaProxiedBrokers   = "CDC_OUTBOX_TEST_KAFKA_PROXIED_BROKERS"
	envKafkaProxiedTarget    = "CDC_OUTBOX_TEST_KAFKA_PROXIED_TARGET"

	envJaegerCtl   = "CDC_OUTBOX_TEST_JAEGER_CTL"
	envRegistryCtl = "CDC_OUTBOX_TEST_REGISTRY_CTL"
)

func require(t testing.TB, env string) string {
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

// PostgresURL returns the URL of the test server's maintenance database.
func PostgresURL(t testing.TB) string { return require(t, envPostgres) }

// KafkaBrokers returns the test broker's bootstrap addresses.
func KafkaBrokers(t testing.TB) []string { return strings.Split(require(t, envKafka), ",") }

// KafkaSASLBrokers returns the bootstrap addresses of the test broker's
// SASL_SSL listener: TLS, then SASL SCRAM-SHA-512 as KafkaSASLUser.
func KafkaSASLBrokers(t testing.TB) []string { return strings.Split(require(t, envKafkaSASL), ",") }

// KafkaCAFile returns the path of the PEM certificate of the CA that signed
// the SASL_SSL listener's certificate.
func KafkaCAFile(t testing.TB) string { return require(t, envKafkaCA) }

// KafkaSASLUser returns the SCRAM-SHA-512 user of the SASL_SSL listener.
func KafkaSASLUser(t testing.TB) string { return require(t, envKafkaSASLUser) }

// KafkaSASLPasswordFile returns the path of the file holding
// KafkaSASLUser's password (one line).
func KafkaSASLPasswordFile(t testing.TB) string { return require(t, envKafkaSASLPasswordFile) }

// KafkaProxiedBrokers is the address the test broker advertises on its
// PROXIED listener (scripts/kafka.sh proxied-brokers). Nothing listens
// there until a test starts a Proxy on it that forwards to
// KafkaProxiedTarget; a client bootstrapped at this address then makes
// every connection to the broker through that proxy. One test at a time
// can hold it.
func KafkaProxiedBrokers(t testing.TB) string { return require(t, envKafkaProxiedBrokers) }

// KafkaProxiedTarget is the address the broker's PROXIED listener listens
// on (scripts/kafka.sh proxied-target): where the proxy forwards.
func KafkaProxiedTarget(t testing.TB) string { return require(t, envKafkaProxiedTarget) }

// Name returns a fresh lower-case identifier with the given prefix, usable as
// a database, slot, publication or topic name.
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

// Database creates a database of its own for the test and returns its URL.
// At cleanup it drops the database and every replication slot in it.
func Database(t testing.TB) string {
	t.Helper()
	return DatabaseWith(t, "")
}

// DatabaseWith is Database with options for CREATE DATABASE, such as
// "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0".
func DatabaseWith(t testing.TB, options string) string {
	t.Helper()
	admin := PostgresURL(t)
	name := Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" "+options); err != nil {
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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Logf("cleanup: connect: %v", err)
		return
	}
	defer conn.Close(ctx)
	// A slot pins its database; a walsender still streaming from it pins the
	// slot. Stop both, then drop: a walsender takes a moment to exit after
	// it is told to, and a streamer the test left running may reconnect.
	var left int
	for deadline := time.Now().Add(time.Minute); ; {
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots
			WHERE database = $1 AND active_pid IS NOT NULL`, name)
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = $1 AND NOT active`, name)
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, name).Scan(&left)
		if (err == nil && left == 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the poll's period
	}
	if left != 0 {
		t.Logf("cleanup: %d replication slots of database %s left after %v", left, name, err)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Logf("cleanup: drop database %s: %v", name, err)
	}
}

// Connect opens a normal connection to url, closed at cleanup.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(Context(t), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Exec runs SQL statements on url, failing the test on error.
func Exec(t testing.TB, url string, sql string, args ...any) {
	t.Helper()
	conn := Connect(t, url)
	if _, err := conn.Exec(Context(t), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// KafkaClient returns a franz-go client for the test broker, closed at
// cleanup; opts are appended to the seed brokers.
func KafkaClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(KafkaBrokers(t)...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Topic creates a topic of its own for the test with the given partitions
// and returns its name; it is deleted at cleanup.
func Topic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	name := Name(prefix)
	adm := kadm.NewClient(KafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
	return name
}

// ControlPostgres runs the local server's control script (start, stop,
// restart, kill). Fault tests need a server they may stop: with an external
// server (no control script) the test fails, since the fault cannot be made.
func ControlPostgres(t testing.TB, action string) { control(t, envPostgresCtl, action) }

// ControlKafka runs the local broker's control script (start, stop, restart,
// kill, pause, resume).
func ControlKafka(t testing.TB, action string) { control(t, envKafkaCtl, action) }

// JaegerCtl returns the control script of the local Jaeger, the OTLP
// receiver of the tracing tests (scripts/jaeger.sh: start, stop,
// otlp-endpoint, query-url), which scripts/with-servers.sh names.
func JaegerCtl(t testing.TB) string { return require(t, envJaegerCtl) }

// RegistryCtl returns the control script of the local schema registry
// (scripts/apicurio.sh: start, stop, url), which scripts/with-servers.sh
// names.
func RegistryCtl(t testing.TB) string { return require(t, envRegistryCtl) }

func control(t testing.TB, env, action string) {
	t.Helper()
	script := require(t, env)
	out, err := exec.Command(script, action).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", script, action, err, out)
	}
}
