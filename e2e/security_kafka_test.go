package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// saslArgs are the flags for the test broker's SASL_SSL listener: TLS
// verified with the test CA, SCRAM-SHA-512 as the test user, the password
// read from passwordFile.
func saslArgs(t *testing.T, passwordFile string) []string {
	return []string{
		"--kafka-brokers", strings.Join(testenv.KafkaSASLBrokers(t), ","),
		"--kafka-tls", "--kafka-tls-ca-file", testenv.KafkaCAFile(t),
		"--kafka-sasl-mechanism", "scram-sha-512",
		"--kafka-sasl-username", testenv.KafkaSASLUser(t),
		"--kafka-sasl-password-file", passwordFile,
	}
}

// get fetches http://addr+path and returns the status code and body; 0
// when the request failed.
func get(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// writeTemp writes content to a new file of the test, mode 0600, and
// returns its path.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKafkaOverSASLSSL: the streamer publishes to the broker's SASL_SSL
// listener (TLS with the test CA, SCRAM-SHA-512, the password from
// --kafka-sasl-password-file) and every event arrives, in per-aggregate
// order; the verifier reads them on the PLAINTEXT listener, the same topics.
func TestKafkaOverSASLSSL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start(saslArgs(t, testenv.KafkaSASLPasswordFile(t))...)
	e.waitStreaming()
	addr := s.httpAddr()
	eventually(t, 30*time.Second, "/readyz to answer 200 (Kafka answers over SASL_SSL)", func() bool {
		code, _ := get(addr, "/readyz")
		return code == 200
	})

	wl := newWorkload(e)
	ctx := testenv.Context(t)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w, tc := range []struct {
		n, txSize   int
		typ         string
		deleteAfter bool
	}{{600, 1, "payment", false}, {600, 30, "order", true}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- wl.write(ctx, w, tc.n, tc.txSize, tc.typ, tc.deleteAfter)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	v, _ := wl.verify([]string{"payment", "order"}, 2*time.Minute)
	t.Logf("verifier: %s", v)
	if v.expected != 1200 || v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
	if log := s.logText(); !strings.Contains(log, `"kafka_tls":true,"kafka_sasl":"scram-sha-512"`) {
		t.Errorf("the start line does not say TLS and SCRAM-SHA-512 are on:\n%s", log)
	}
	s.stop()
}

// TestKafkaSASLRefusedIsExplained: a wrong password, and a broker
// certificate the client cannot verify, are each reported in the log and
// in /readyz with what to check, and the password is in neither. The
// streamer keeps running (and confirms nothing) until it is fixed.
func TestKafkaSASLRefusedIsExplained(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	wrong := testenv.Name("WrongKafkaPassword")

	for _, tc := range []struct {
		name    string
		args    []string
		logWant string
	}{
		{"wrong password", saslArgs(t, writeTemp(t, "password", wrong+"\n")),
			"SASL authentication failed: check --kafka-sasl-username and the password (--kafka-sasl-password-file or --kafka-sasl-password)"},
		{"unknown CA", append(saslArgs(t, testenv.KafkaSASLPasswordFile(t)), "--kafka-tls-ca-file", otherCA(t)),
			"TLS: the broker's certificate is not signed by a CA this client trusts; give that CA's PEM certificate with --kafka-tls-ca-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.start(tc.args...)
			addr := s.httpAddr()
			eventually(t, 60*time.Second, "the refusal in the log", func() bool {
				return strings.Contains(s.logText(), tc.logWant)
			})
			var body string
			eventually(t, 30*time.Second, "/readyz to give the reason", func() bool {
				var code int
				code, body = get(addr, "/readyz")
				return code == 503 && strings.Contains(body, tc.logWant)
			})
			log := s.logText()
			if !strings.Contains(log, `"level":"ERROR","msg":"Kafka refuses the connection`) {
				t.Errorf("the refusal is not logged as an error:\n%s", log)
			}
			for what, text := range map[string]string{"log": log, "/readyz": body} {
				if strings.Contains(text, wrong) {
					t.Errorf("the %s shows the password:\n%s", what, text)
				}
			}
			s.stop()
		})
	}
}

// otherCA writes the PEM certificate of a new CA, one that signed nothing
// the broker has, and returns its path.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return writeTemp(t, "other-ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
}

// runCLI runs the binary to its end (at most a minute) with environ added
// to the test's environment, and returns its combined output and exit
// code.
func runCLI(t *testing.T, environ []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), environ...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%v: still running after a minute:\n%s", args, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}
