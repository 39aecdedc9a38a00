package sink_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// TestFaultOf: what no retry cures (a refused SASL login, a TLS handshake
// that failed) is told from a broker that is merely away, wrapped or not.
func TestFaultOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want sink.Fault
	}{
		{fmt.Errorf("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512: %w", kerr.SaslAuthenticationFailed),
			sink.FaultSASLCredentials},
		{kerr.UnsupportedSaslMechanism, sink.FaultSASLMechanism},
		{kerr.IllegalSaslState, sink.FaultSASLUnexpected},
		{&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, sink.FaultTLSUnknownCA},
		{fmt.Errorf("dial: %w", x509.HostnameError{Host: "10.0.0.1"}), sink.FaultTLSHostname},
		{x509.CertificateInvalidError{Reason: x509.Expired}, sink.FaultTLSCertificate},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, sink.FaultNotTLS},
		{io.EOF, sink.NoFault},
		{errors.New("dial tcp 127.0.0.1:9092: connect: connection refused"), sink.NoFault},
		{kerr.NotLeaderForPartition, sink.NoFault},
		{nil, sink.NoFault},
	} {
		if got := sink.FaultOf(tc.err); got != tc.want {
			t.Errorf("FaultOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}
