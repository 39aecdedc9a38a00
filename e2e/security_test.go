package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// leastPrivilege makes the role of sql/role.sql in the env's database (run
// twice: the file is meant to be re-run), and, as the administrator step
// there says, creates the slot. The streamer then runs with
// --create-publication=false --create-slot=false.
func (e *env) leastPrivilege(role, password string) {
	e.t.Helper()
	vars := map[string]string{"role": role, "password": password}
	if e.serverMajor() < 15 {
		// What sql/role.sql and docs/getting-started.md tell administrators of 14 to do
		// (15 does it by default): no role creates tables in public.
		testenv.Exec(e.t, e.url, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	}
	testenv.Psql(e.t, e.url, "../sql/role.sql", vars)
	testenv.Psql(e.t, e.url, "../sql/role.sql", vars)
	testenv.Exec(e.t, e.url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot)
}

var leastPrivilegeFlags = []string{"--create-publication=false", "--create-slot=false"}

// asUser is url with another user and password.
func asUser(t *testing.T, url, user, password string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", user, password, cfg.Host, cfg.Port, cfg.Database)
}

func randomPassword() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestLeastPrivilegeRole: the streamer runs as the role of sql/role.sql
// (LOGIN REPLICATION, no table privileges) and every event arrives; the
// same role cannot read the outbox or any other table, write the outbox,
// create a table or a publication, or rewrite the publication's comment.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	role, password := testenv.Name("cdc"), randomPassword()
	t.Cleanup(func() {
		// Roles belong to the whole server: the grants in the test's
		// database go first, then the role.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, sql := range []struct{ url, sql string }{
			{e.url, "DROP OWNED BY " + role},
			{testenv.PostgresURL(t), "DROP ROLE IF EXISTS " + role},
		} {
			conn, err := pgx.Connect(ctx, sql.url)
			if err != nil {
				t.Logf("cleanup: %v", err)
				return
			}
			if _, err := conn.Exec(ctx, sql.sql); err != nil {
				t.Logf("cleanup: %s: %v", sql.sql, err)
			}
			conn.Close(ctx)
		}
	})
	e.leastPrivilege(role, password)
	testenv.Exec(t, e.url, `CREATE TABLE payments (id text PRIMARY KEY, amount int); INSERT INTO payments VALUES ('pay-1', 100)`)
	e.runURL = asUser(t, e.url, role, password)

	s := e.start(leastPrivilegeFlags...)
	e.waitStreaming()
	var user string
	if err := e.pool.QueryRow(ctx, `SELECT a.usename FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, e.slot).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if user != role {
		t.Fatalf("the walsender runs as %q, want %q", user, role)
	}
	wl := newWorkload(e)
	if err := wl.write(ctx, 1, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "as the least-privilege role")

	// cdc-outbox status works as the same role.
	if out, err := exec.Command(binary, "status", "--postgres-url", e.runURL, "--slot", e.slot).CombinedOutput(); err != nil {
		t.Errorf("cdc-outbox status as %s: %v\n%s", role, err, out)
	}

	conn := testenv.Connect(t, e.runURL)
	for _, sql := range []string{
		`SELECT * FROM outbox`,
		`SELECT * FROM payments`,
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'p', 'Forged', '{}')`,
		`CREATE TABLE mine (x int)`,
		`CREATE PUBLICATION mine FOR TABLE outbox`,
		`COMMENT ON PUBLICATION cdc_outbox IS 'rewritten'`,
	} {
		_, err := conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as %s: %v, want permission denied (42501)", sql, role, err)
		}
	}

	s.stop()
	if log := s.logText(); strings.Contains(log, `"level":"WARN"`) || strings.Contains(log, `"level":"ERROR"`) {
		t.Errorf("warnings or errors as the least-privilege role:\n%s", log)
	}
}

// TestTLSAndSCRAM: on a cluster of the test's own that serves TLS with a
// certificate made here, and whose pg_hba.conf lets the cdc-outbox role in
// only over TLS with scram-sha-256, the streamer runs as the role of
// sql/role.sql with sslmode=verify-full and every event arrives over an
// encrypted replication connection. A CA that did not sign the server's
// certificate, a wrong password, or no TLS each stop it at start with an
// error that says what to fix and does not show the password.
func TestTLSAndSCRAM(t *testing.T) {
	t.Parallel()
	const role = "cdc_outbox"
	dir := t.TempDir()
	ca := newCA(t, "cdc-outbox test CA")
	certPEM, keyPEM := ca.serverCert(t)
	caFile := filepath.Join(dir, "ca.pem")
	wrongCAFile := filepath.Join(dir, "wrong-ca.pem")
	writeFile(t, caFile, ca.certPEM)
	writeFile(t, wrongCAFile, newCA(t, "some other CA").certPEM)

	c := testenv.Cluster(t, testenv.ClusterOptions{
		Config: []string{
			"ssl = on",
			"ssl_cert_file = 'server.crt'",
			"ssl_key_file = 'server.key'",
			"password_encryption = 'scram-sha-256'",
		},
		HBA: []string{
			"hostssl postgres    " + role + " 127.0.0.1/32 scram-sha-256",
			"host    all         " + role + " 127.0.0.1/32 reject",
			"host    replication " + role + " 127.0.0.1/32 reject",
		},
		Files: map[string][]byte{"server.crt": certPEM, "server.key": keyPEM},
	})
	e := newEnvAt(t, c.URL)
	ctx := testenv.Context(t)
	password := randomPassword()
	e.leastPrivilege(role, password)
	cfg, err := pgconn.ParseConfig(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	tlsURL := func(user, password, sslmode, rootCert string) string {
		return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=%s&sslrootcert=%s", user, password, cfg.Port, sslmode, rootCert)
	}

	var verifier string
	if err := e.pool.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = $1`, role).Scan(&verifier); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(verifier, "SCRAM-SHA-256$") {
		t.Fatalf("the role's password is stored as %.14q..., want a SCRAM-SHA-256 verifier", verifier)
	}

	// Refused before anything streams. Each error says what to fix.
	refusals := []struct {
		name, url string
		want      []string
	}{
		{"CA that did not sign the server's certificate", tlsURL(role, password, "verify-full", wrongCAFile),
			[]string{"certificate signed by unknown authority", "point sslrootcert"}},
		{"wrong password", tlsURL(role, "not-"+password, "verify-full", caFile),
			[]string{"password authentication failed", "check the password"}},
		{"no TLS", tlsURL(role, password, "disable", caFile),
			[]string{"pg_hba.conf rejects connection", "hostssl"}},
	}
	for _, r := range refusals {
		e.runURL = r.url
		s := e.start(leastPrivilegeFlags...)
		if err := s.exited(60 * time.Second); err == nil {
			t.Errorf("%s: the streamer exited 0", r.name)
			continue
		}
		log := s.logText()
		if i := strings.LastIndex(log, `"msg":"stopped with an error"`); i >= 0 {
			t.Logf("%s: %s", r.name, strings.TrimSpace(log[i:]))
		}
		for _, want := range r.want {
			if !strings.Contains(log, want) {
				t.Errorf("%s: the error does not say %q:\n%s", r.name, want, log)
			}
		}
		if strings.Contains(log, password) {
			t.Errorf("%s: the log shows the password:\n%s", r.name, log)
		}
	}
	// A physical replication connection (a copy of the whole cluster) is
	// refused to the role too.
	phys, err := pgconn.ParseConfig(tlsURL(role, password, "verify-full", caFile) + "&replication=true")
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := pgconn.ConnectConfig(ctx, phys); err == nil {
		conn.Close(ctx)
		t.Error("the role opened a physical replication connection")
	} else if !strings.Contains(err.Error(), "pg_hba.conf rejects replication connection") {
		t.Errorf("physical replication as %s: %v, want pg_hba.conf's rejection", role, err)
	}

	e.runURL = tlsURL(role, password, "verify-full", caFile)
	s := e.start(leastPrivilegeFlags...)
	e.waitStreaming()
	var user, version string
	var encrypted bool
	err = e.pool.QueryRow(ctx, `SELECT a.usename, t.ssl, coalesce(t.version, '') FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid JOIN pg_stat_ssl t ON t.pid = s.active_pid
		WHERE s.slot_name = $1`, e.slot).Scan(&user, &encrypted, &version)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replication connection: user %s, TLS %v (%s)", user, encrypted, version)
	if user != role || !encrypted {
		t.Fatalf("the walsender runs as %q with TLS %v; want %q over TLS", user, encrypted, role)
	}
	wl := newWorkload(e)
	if err := wl.write(ctx, 1, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "over TLS with SCRAM as the least-privilege role")
	s.stop()
	if log := s.logText(); strings.Contains(log, password) {
		t.Errorf("the log shows the password:\n%s", log)
	}
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert issues a server certificate for 127.0.0.1 and localhost and
// returns it and its key, PEM-encoded.
func (ca *testCA) serverCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
