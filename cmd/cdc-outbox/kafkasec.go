package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms, as --kafka-sasl-mechanism takes them.
const (
	saslNone        = "none"
	saslPlain       = "plain"
	saslScramSHA256 = "scram-sha-256"
	saslScramSHA512 = "scram-sha-512"
)

// saslMechanism is --kafka-sasl-mechanism, case-insensitively ("" is none).
func (c *runConfig) saslMechanism() string {
	m := strings.ToLower(strings.TrimSpace(c.KafkaSASLMechanism))
	if m == "" {
		return saslNone
	}
	return m
}

// validateKafkaSecurity checks that the TLS and SASL flags make one
// setting, without reading the files they name (kafkaSecurityOpts does, at
// start). No message quotes a password.
func (c *runConfig) validateKafkaSecurity(p *problems) {
	check := p.check
	if !c.KafkaTLS {
		for _, f := range []struct{ name, value string }{
			{"kafka-tls-ca-file", c.KafkaTLSCAFile},
			{"kafka-tls-cert-file", c.KafkaTLSCertFile},
			{"kafka-tls-key-file", c.KafkaTLSKeyFile},
			{"kafka-tls-server-name", c.KafkaTLSServerName},
		} {
			check(f.value == "", "--%s is set but --kafka-tls is false: add --kafka-tls, or drop --%s", f.name, f.name)
		}
	}
	check(c.KafkaTLSCertFile == "" || c.KafkaTLSKeyFile != "", "--kafka-tls-cert-file needs --kafka-tls-key-file (the certificate's private key)")
	check(c.KafkaTLSKeyFile == "" || c.KafkaTLSCertFile != "", "--kafka-tls-key-file needs --kafka-tls-cert-file (the client certificate)")

	mech := c.saslMechanism()
	switch mech {
	case saslNone:
		var set []string
		for _, f := range []struct{ name, value string }{
			{"--kafka-sasl-username", c.KafkaSASLUsername},
			{"--kafka-sasl-password", c.KafkaSASLPassword},
			{"--kafka-sasl-password-file", c.KafkaSASLPasswordFile},
		} {
			if f.value != "" {
				set = append(set, f.name)
			}
		}
		check(len(set) == 0, "%s given but --kafka-sasl-mechanism is none: set --kafka-sasl-mechanism to plain, scram-sha-256 or scram-sha-512, or drop %s",
			strings.Join(set, " and "), strings.Join(set, " and "))
	case saslPlain, saslScramSHA256, saslScramSHA512:
		check(c.KafkaSASLUsername != "", "--kafka-sasl-mechanism=%s needs --kafka-sasl-username", mech)
		check(c.KafkaSASLPassword != "" || c.KafkaSASLPasswordFile != "",
			"--kafka-sasl-mechanism=%s needs a password: give --kafka-sasl-password-file (or --kafka-sasl-password)", mech)
	default:
		check(false, "--kafka-sasl-mechanism %q: use none, plain, scram-sha-256 or scram-sha-512", c.KafkaSASLMechanism)
	}
	check(c.KafkaSASLPassword == "" || c.KafkaSASLPasswordFile == "",
		"--kafka-sasl-password and --kafka-sasl-password-file are both set: give only one (the file is safer)")
}

// kafkaSecurityOpts turns the TLS and SASL flags into client options,
// reading the certificate, key and password files. It runs after validate;
// its errors name the flag and the file, never a password.
func (c *runConfig) kafkaSecurityOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if c.KafkaTLS {
		cfg, err := c.kafkaTLSConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	m, err := c.kafkaSASL()
	if err != nil {
		return nil, err
	}
	if m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// kafkaTLSConfig is the TLS configuration for dialing brokers. Without
// --kafka-tls-server-name, ServerName stays empty and franz-go sets it to
// the host of each broker it dials.
func (c *runConfig) kafkaTLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.KafkaTLSServerName}
	if c.KafkaTLSCAFile != "" {
		pem, err := os.ReadFile(c.KafkaTLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca-file %s: no PEM certificate in it (want -----BEGIN CERTIFICATE-----)", c.KafkaTLSCAFile)
		}
	}
	if c.KafkaTLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.KafkaTLSCertFile, c.KafkaTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert-file %s, --kafka-tls-key-file %s: %w", c.KafkaTLSCertFile, c.KafkaTLSKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// kafkaSASL is the SASL mechanism with its credentials, or nil for none.
func (c *runConfig) kafkaSASL() (sasl.Mechanism, error) {
	mech := c.saslMechanism()
	if mech == saslNone {
		return nil, nil
	}
	password := c.KafkaSASLPassword
	if c.KafkaSASLPasswordFile != "" {
		var err error
		if password, err = readPasswordFile(c.KafkaSASLPasswordFile); err != nil {
			return nil, err
		}
	}
	switch mech {
	case saslPlain:
		return plain.Auth{User: c.KafkaSASLUsername, Pass: password}.AsMechanism(), nil
	case saslScramSHA256:
		return scram.Auth{User: c.KafkaSASLUsername, Pass: password}.AsSha256Mechanism(), nil
	case saslScramSHA512:
		return scram.Auth{User: c.KafkaSASLUsername, Pass: password}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("--kafka-sasl-mechanism %q: use none, plain, scram-sha-256 or scram-sha-512", c.KafkaSASLMechanism)
}

// readPasswordFile reads a password file as secret managers and `echo`
// write it: the whole file, less a trailing newline (\n or \r\n).
func readPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError names the file and the cause, not its content.
		return "", fmt.Errorf("--kafka-sasl-password-file: %w", err)
	}
	p := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if p == "" {
		return "", errors.New("--kafka-sasl-password-file " + path + " is empty: put the password in it")
	}
	return p, nil
}
