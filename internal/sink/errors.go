package sink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Fault is what keeps the client from the brokers for good: a refused SASL
// login or a TLS handshake that failed. No retry cures it; a person must.
type Fault int

// The faults FaultOf tells apart.
const (
	// NoFault: none of these. A broker that is down or slow heals by
	// itself.
	NoFault Fault = iota
	// FaultSASLCredentials: SASL_AUTHENTICATION_FAILED, a wrong user name
	// or password, or a user without credentials for the mechanism.
	FaultSASLCredentials
	// FaultSASLMechanism: UNSUPPORTED_SASL_MECHANISM, the listener does not
	// offer the mechanism.
	FaultSASLMechanism
	// FaultSASLUnexpected: ILLEGAL_SASL_STATE, the listener does not expect
	// SASL.
	FaultSASLUnexpected
	// FaultTLSUnknownCA: the broker's certificate is not signed by a CA the
	// client trusts.
	FaultTLSUnknownCA
	// FaultTLSHostname: the broker's certificate is not valid for the
	// address dialed.
	FaultTLSHostname
	// FaultTLSCertificate: the broker's certificate is expired, not yet
	// valid, or not for server authentication.
	FaultTLSCertificate
	// FaultNotTLS: the listener does not speak TLS.
	FaultNotTLS
)

// FaultOf says what fault err, an error of reaching the brokers, is.
// Neither the error nor anything said about it carries a password: the
// broker's SASL errors do not quote it.
func FaultOf(err error) Fault {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		notTLS    tls.RecordHeaderError
	)
	switch {
	case err == nil:
		return NoFault
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return FaultSASLCredentials
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return FaultSASLMechanism
	case errors.Is(err, kerr.IllegalSaslState):
		return FaultSASLUnexpected
	case errors.As(err, &unknownCA):
		return FaultTLSUnknownCA
	case errors.As(err, &hostname):
		return FaultTLSHostname
	case errors.As(err, &invalid):
		return FaultTLSCertificate
	case errors.As(err, &notTLS):
		return FaultNotTLS
	}
	return NoFault
}
