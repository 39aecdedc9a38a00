package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// secretPassword must never appear in a message.
const secretPassword = "pw-Zq7-never-printed"

// withKafkaSecurity is a valid configuration changed by edit.
func withKafkaSecurity(t *testing.T, edit func(c *runConfig)) *runConfig {
	t.Helper()
	var c runConfig
	if err := runFlags(&c).parse(nil, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	c.PostgresURL = "postgres://app@db:5432/app"
	edit(&c)
	return &c
}

func TestValidateKafkaSecurity(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *runConfig)
		want []string // each must be in the error; none means valid
	}{
		{"defaults", func(c *runConfig) {}, nil},
		{"scram with a password file", func(c *runConfig) {
			c.KafkaTLS, c.KafkaTLSCAFile = true, "/ca.pem"
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPasswordFile = "scram-sha-512", "cdc", "/pw"
		}, nil},
		{"mechanism in capitals", func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPassword = "SCRAM-SHA-256", "cdc", secretPassword
		}, nil},
		{"plain with a client certificate", func(c *runConfig) {
			c.KafkaTLS, c.KafkaTLSCertFile, c.KafkaTLSKeyFile, c.KafkaTLSServerName = true, "/c.pem", "/k.pem", "kafka.internal"
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPassword = "plain", "cdc", secretPassword
		}, nil},
		{"unknown mechanism", func(c *runConfig) { c.KafkaSASLMechanism = "gssapi" },
			[]string{`--kafka-sasl-mechanism "gssapi": use none, plain, scram-sha-256 or scram-sha-512`}},
		{"mechanism without a user", func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLPasswordFile = "scram-sha-512", "/pw"
		}, []string{"--kafka-sasl-mechanism=scram-sha-512 needs --kafka-sasl-username"}},
		{"mechanism without a password", func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername = "plain", "cdc"
		}, []string{"--kafka-sasl-mechanism=plain needs a password: give --kafka-sasl-password-file (or --kafka-sasl-password)"}},
		{"a password without a mechanism", func(c *runConfig) { c.KafkaSASLPassword = secretPassword },
			[]string{"--kafka-sasl-password given but --kafka-sasl-mechanism is none: set --kafka-sasl-mechanism to plain, scram-sha-256 or scram-sha-512"}},
		{"user and password file without a mechanism", func(c *runConfig) {
			c.KafkaSASLUsername, c.KafkaSASLPasswordFile = "cdc", "/pw"
		}, []string{"--kafka-sasl-username and --kafka-sasl-password-file given but --kafka-sasl-mechanism is none"}},
		{"password and password file", func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername = "scram-sha-512", "cdc"
			c.KafkaSASLPassword, c.KafkaSASLPasswordFile = secretPassword, "/pw"
		}, []string{"--kafka-sasl-password and --kafka-sasl-password-file are both set: give only one"}},
		{"certificate without key", func(c *runConfig) { c.KafkaTLS, c.KafkaTLSCertFile = true, "/c.pem" },
			[]string{"--kafka-tls-cert-file needs --kafka-tls-key-file"}},
		{"key without certificate", func(c *runConfig) { c.KafkaTLS, c.KafkaTLSKeyFile = true, "/k.pem" },
			[]string{"--kafka-tls-key-file needs --kafka-tls-cert-file"}},
		{"TLS files without TLS", func(c *runConfig) { c.KafkaTLSCAFile, c.KafkaTLSServerName = "/ca.pem", "kafka" },
			[]string{"--kafka-tls-ca-file is set but --kafka-tls is false: add --kafka-tls, or drop --kafka-tls-ca-file",
				"--kafka-tls-server-name is set but --kafka-tls is false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := withKafkaSecurity(t, tc.edit).validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate() = nil, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("validate() = %v\nwant it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secretPassword) {
				t.Errorf("validate() quotes the password: %v", err)
			}
		})
	}
}

// testPKI writes a CA certificate, and a client certificate and key signed
// by it, as PEM files; it returns their paths and the CA.
func testPKI(t *testing.T) (caFile, certFile, keyFile string, ca *x509.Certificate) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cdc-outbox"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("client.pem", "CERTIFICATE", der), write("client.key", "EC PRIVATE KEY", keyDER), ca
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestKafkaTLSConfig(t *testing.T) {
	caFile, certFile, keyFile, ca := testPKI(t)
	c := withKafkaSecurity(t, func(c *runConfig) {
		c.KafkaTLS, c.KafkaTLSCAFile, c.KafkaTLSCertFile, c.KafkaTLSKeyFile = true, caFile, certFile, keyFile
		c.KafkaTLSServerName = "kafka.internal"
	})
	cfg, err := c.kafkaTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ServerName != "kafka.internal" || cfg.MinVersion != tls.VersionTLS12 || len(cfg.Certificates) != 1 {
		t.Fatalf("tls.Config: server name %q, min version %x, %d certificates", cfg.ServerName, cfg.MinVersion, len(cfg.Certificates))
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	// The pool is the CA file's: the client certificate, signed by that
	// CA, verifies against it.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cfg.RootCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("a certificate of the CA in --kafka-tls-ca-file (%s) does not verify: %v", ca.Subject, err)
	}

	// Without a CA file the system's CAs verify (RootCAs nil); without a
	// server name franz-go uses each broker's host.
	c = withKafkaSecurity(t, func(c *runConfig) { c.KafkaTLS = true })
	if cfg, err = c.kafkaTLSConfig(); err != nil || cfg.RootCAs != nil || cfg.ServerName != "" || cfg.Certificates != nil {
		t.Fatalf("plain --kafka-tls: %+v, %v", cfg, err)
	}
}

func TestKafkaTLSConfigFileErrors(t *testing.T) {
	caFile, certFile, keyFile, _ := testPKI(t)
	for _, tc := range []struct {
		name string
		edit func(c *runConfig)
		want string
	}{
		{"missing CA file", func(c *runConfig) { c.KafkaTLSCAFile = "/nonexistent/ca.pem" }, "--kafka-tls-ca-file: open /nonexistent/ca.pem"},
		{"CA file without PEM", func(c *runConfig) { c.KafkaTLSCAFile = writeFile(t, "not a certificate") }, "no PEM certificate in it"},
		{"key of another file", func(c *runConfig) { c.KafkaTLSCertFile, c.KafkaTLSKeyFile = certFile, caFile }, "--kafka-tls-cert-file " + certFile + ", --kafka-tls-key-file " + caFile},
		{"missing certificate", func(c *runConfig) { c.KafkaTLSCertFile, c.KafkaTLSKeyFile = "/nonexistent/c.pem", keyFile }, "/nonexistent/c.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := withKafkaSecurity(t, func(c *runConfig) { c.KafkaTLS = true; tc.edit(c) })
			_, err := c.kafkaSecurityOpts()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// plainCredentials is what a PLAIN mechanism sends: the way to see which
// password it was given.
func plainCredentials(t *testing.T, m sasl.Mechanism) string {
	t.Helper()
	_, msg, err := m.Authenticate(context.Background(), "127.0.0.1:9092")
	if err != nil {
		t.Fatal(err)
	}
	return string(msg)
}

func TestKafkaSASL(t *testing.T) {
	for mech, name := range map[string]string{"plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "SCRAM-SHA-512": "SCRAM-SHA-512"} {
		c := withKafkaSecurity(t, func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPassword = mech, "cdc", secretPassword
		})
		m, err := c.kafkaSASL()
		if err != nil || m == nil || m.Name() != name {
			t.Errorf("--kafka-sasl-mechanism %s: %v, %v; want %s", mech, m, err, name)
		}
	}
	if m, err := withKafkaSecurity(t, func(c *runConfig) {}).kafkaSASL(); m != nil || err != nil {
		t.Errorf("no mechanism: %v, %v", m, err)
	}

	// The file's trailing newline is not part of the password; other
	// whitespace is.
	for content, want := range map[string]string{
		secretPassword + "\n":   secretPassword,
		secretPassword + "\r\n": secretPassword,
		secretPassword:          secretPassword,
		" " + secretPassword:    " " + secretPassword,
	} {
		c := withKafkaSecurity(t, func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPasswordFile = "plain", "cdc", writeFile(t, content)
		})
		m, err := c.kafkaSASL()
		if err != nil {
			t.Fatal(err)
		}
		if got := plainCredentials(t, m); got != "\x00cdc\x00"+want {
			t.Errorf("password file %q: PLAIN sends %q, want password %q", content, got, want)
		}
	}

	for _, tc := range []struct{ path, want string }{
		{"/nonexistent/pw", "--kafka-sasl-password-file: open /nonexistent/pw: no such file or directory"},
		{writeFile(t, "\n"), "is empty: put the password in it"},
	} {
		c := withKafkaSecurity(t, func(c *runConfig) {
			c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPasswordFile = "scram-sha-512", "cdc", tc.path
		})
		if _, err := c.kafkaSecurityOpts(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("password file %s: err = %v, want %q", tc.path, err, tc.want)
		}
	}
}

// TestKafkaSecurityOpts: the options reach a franz-go client as TLS and
// SASL settings.
func TestKafkaSecurityOpts(t *testing.T) {
	caFile, _, _, _ := testPKI(t)
	c := withKafkaSecurity(t, func(c *runConfig) {
		c.KafkaTLS, c.KafkaTLSCAFile = true, caFile
		c.KafkaSASLMechanism, c.KafkaSASLUsername, c.KafkaSASLPasswordFile = "scram-sha-512", "cdc", writeFile(t, secretPassword+"\n")
	})
	opts, err := c.kafkaSecurityOpts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers("127.0.0.1:1"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if cfg, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config); cfg == nil || cfg.RootCAs == nil {
		t.Errorf("client TLS config: %v", cl.OptValue(kgo.DialTLSConfig))
	}
	if ms, _ := cl.OptValue(kgo.SASL).([]sasl.Mechanism); len(ms) != 1 || ms[0].Name() != "SCRAM-SHA-512" {
		t.Errorf("client SASL: %v", cl.OptValue(kgo.SASL))
	}

	// No TLS, no SASL: no options, the client dials in plain text.
	if opts, err := withKafkaSecurity(t, func(c *runConfig) {}).kafkaSecurityOpts(); len(opts) != 0 || err != nil {
		t.Errorf("defaults: %d options, %v", len(opts), err)
	}
}
