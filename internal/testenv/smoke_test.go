package testenv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestPostgresReplicationSmoke proves the ground every streaming test stands
// on: the test server accepts a replication connection, answers
// IDENTIFY_SYSTEM, and creates and drops a pgoutput slot.
func TestPostgresReplicationSmoke(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgconn.Connect(ctx, url+"&replication=database")
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	defer conn.Close(ctx)

	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		t.Fatalf("IDENTIFY_SYSTEM: %v", err)
	}
	if sys.XLogPos == 0 || sys.DBName == "" {
		t.Fatalf("IDENTIFY_SYSTEM answered %+v", sys)
	}

	slot := testenv.Name("smoke")
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{})
	if err != nil {
		t.Fatalf("create slot: %v", err)
	}
	if res.SlotName != slot {
		t.Fatalf("created slot %q, want %q", res.SlotName, slot)
	}
	if err := pglogrepl.DropReplicationSlot(ctx, conn, slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
		t.Fatalf("drop slot: %v", err)
	}
}

// TestKafkaRoundTripSmoke proves the broker is a real one that stores a
// record and serves it back.
func TestKafkaRoundTripSmoke(t *testing.T) {
	t.Parallel()
	topic := testenv.Topic(t, "smoke", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	producer := testenv.KafkaClient(t)
	want := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{"hello":"kafka"}`)}
	if err := producer.ProduceSync(ctx, want).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	consumer := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fetches := consumer.PollRecords(ctx, 1)
	if err := fetches.Err(); err != nil {
		t.Fatalf("consume: %v", err)
	}
	got := fetches.Records()
	if len(got) != 1 || string(got[0].Key) != "k" || string(got[0].Value) != `{"hello":"kafka"}` {
		t.Fatalf("consumed %v, want the produced record", got)
	}
}

// TestClusterSmoke: a test's own cluster starts with the extra settings,
// pg_hba.conf lines and files it was given, and is gone after the test.
func TestClusterSmoke(t *testing.T) {
	t.Parallel()
	var dataDir string
	t.Run("cluster", func(t *testing.T) {
		c := testenv.Cluster(t, testenv.ClusterOptions{
			Config: []string{"max_slot_wal_keep_size = '1MB'"},
			HBA:    []string{"host all blocked 127.0.0.1/32 reject"},
			Files:  map[string][]byte{"secret.txt": []byte("only the server reads this")},
		})
		dataDir = c.DataDir
		conn := testenv.Connect(t, c.URL)
		ctx := testenv.Context(t)
		var keep, walLevel string
		if err := conn.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size'), current_setting('wal_level')`).Scan(&keep, &walLevel); err != nil {
			t.Fatal(err)
		}
		if keep != "1MB" || walLevel != "logical" {
			t.Fatalf("max_slot_wal_keep_size=%s wal_level=%s, want 1MB and logical", keep, walLevel)
		}
		// The server reads the file: it is the server user's, 0600.
		var content string
		if err := conn.QueryRow(ctx, `SELECT pg_read_file('secret.txt')`).Scan(&content); err != nil {
			t.Fatalf("the server cannot read its file: %v", err)
		}
		fi, err := os.Stat(filepath.Join(c.DataDir, "secret.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("secret.txt has mode %v, want 0600", fi.Mode().Perm())
		}
		if _, err := conn.Exec(ctx, `CREATE ROLE blocked LOGIN`); err != nil {
			t.Fatal(err)
		}
		cfg, err := pgconn.ParseConfig(c.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User = "blocked"
		_, err = pgconn.ConnectConfig(ctx, cfg)
		if err == nil || !strings.Contains(err.Error(), "pg_hba.conf rejects connection") {
			t.Fatalf("role blocked connected past the pg_hba.conf line (err=%v)", err)
		}
	})
	if dataDir == "" {
		return // the subtest failed before the cluster existed
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("data folder %s still exists after the test (stat: %v)", dataDir, err)
	}
}

// TestKafkaSASLSmoke proves the broker's SASL_SSL listener is what the
// security tests assume: its certificate verifies against the test CA for
// 127.0.0.1, the SCRAM-SHA-512 user logs in with the password file's
// password, and a wrong password is refused as a SASL authentication
// failure.
func TestKafkaSASLSmoke(t *testing.T) {
	t.Parallel()
	pem, err := os.ReadFile(testenv.KafkaCAFile(t))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no PEM certificate", testenv.KafkaCAFile(t))
	}
	b, err := os.ReadFile(testenv.KafkaSASLPasswordFile(t))
	if err != nil {
		t.Fatal(err)
	}
	password := strings.TrimRight(string(b), "\r\n")
	metadata := func(pass string) error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.KafkaSASLBrokers(t)...),
			kgo.DialTLSConfig(&tls.Config{RootCAs: roots}),
			kgo.SASL(scram.Auth{User: testenv.KafkaSASLUser(t), Pass: pass}.AsSha512Mechanism()))
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = kadm.NewClient(cl).BrokerMetadata(ctx)
		return err
	}
	if err := metadata(password); err != nil {
		t.Fatalf("metadata over SASL_SSL as %s: %v", testenv.KafkaSASLUser(t), err)
	}
	if err := metadata(password + "-wrong"); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("a wrong password: err = %v, want SASL_AUTHENTICATION_FAILED", err)
	}
}
