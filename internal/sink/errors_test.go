package sink_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

func TestAdvice(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string // "" for no advice
	}{
		{fmt.Errorf("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512: %w", kerr.SaslAuthenticationFailed),
			"SASL authentication failed: check --kafka-sasl-username and the password (--kafka-sasl-password-file or --kafka-sasl-password)"},
		{kerr.UnsupportedSaslMechanism, "the listener does not offer --kafka-sasl-mechanism"},
		{kerr.IllegalSaslState, "set --kafka-sasl-mechanism=none"},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, "--kafka-tls-ca-file"},
		{fmt.Errorf("dial: %w", x509.HostnameError{Host: "10.0.0.1"}), "--kafka-tls-server-name"},
		{x509.CertificateInvalidError{Reason: x509.Expired}, "renew it on the broker"},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "drop --kafka-tls"},
		{io.EOF, ""},
		{errors.New("dial tcp 127.0.0.1:9092: connect: connection refused"), ""},
		{kerr.NotLeaderForPartition, ""},
		{nil, ""},
	} {
		got := sink.Advice(tc.err)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("Advice(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestRefused: refusals that concern the record are told from those that
// concern the cluster, wrapped or not.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("%w (uncompressed_bytes=5000)", kerr.MessageTooLarge), true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidTimestamp, true},
		{kerr.InvalidRecord, true},
		{kerr.CorruptMessage, true},
		{kerr.InvalidTopicException, true},
		{kerr.TopicAuthorizationFailed, false},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.SaslAuthenticationFailed, false},
		{io.EOF, false},
		{nil, false},
	} {
		if got := sink.Refused(tc.err); got != tc.want {
			t.Errorf("Refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
