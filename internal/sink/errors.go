package sink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Refused reports whether err is the broker's refusal of a record for
// something about the record itself: too large for the topic, a timestamp
// out of the topic's range, a record or batch it finds invalid or corrupt,
// a topic name it does not accept. Sent again the record would be refused
// again, while other records go through: it is a bad event. The broker
// refuses whole batches, so the records batched with it fail with the same
// error. Refusals that concern the cluster (authorization, a missing topic,
// a broker out of reach) are not among these: every record would fail
// alike.
func Refused(err error) bool {
	for _, e := range refusals {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

var refusals = []error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTimestamp,
	kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException,
}

// Advice says what to check for an error of reaching the brokers that no
// retry can cure: a refused SASL login or a TLS handshake that failed. It is
// "" for every other error (a broker that is down or slow heals by itself).
// Neither the error nor the advice carries a password: the broker's SASL
// errors do not quote it.
func Advice(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		notTLS    tls.RecordHeaderError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return "SASL authentication failed: check --kafka-sasl-username and the password " +
			"(--kafka-sasl-password-file or --kafka-sasl-password), that the user exists on the broker " +
			"with credentials for --kafka-sasl-mechanism, and that --kafka-brokers names its SASL listener"
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return "SASL authentication failed: the listener does not offer --kafka-sasl-mechanism; " +
			"use one of the broker's sasl.enabled.mechanisms, or check that --kafka-brokers names its SASL listener"
	case errors.Is(err, kerr.IllegalSaslState):
		return "SASL authentication failed: the listener does not expect SASL; point --kafka-brokers at the broker's " +
			"SASL_SSL (or SASL_PLAINTEXT) listener, or set --kafka-sasl-mechanism=none"
	case errors.As(err, &unknownCA):
		return "TLS: the broker's certificate is not signed by a CA this client trusts; " +
			"give that CA's PEM certificate with --kafka-tls-ca-file"
	case errors.As(err, &hostname):
		return "TLS: the broker's certificate is not valid for the address dialed; " +
			"use a name the certificate lists in --kafka-brokers, or set --kafka-tls-server-name"
	case errors.As(err, &invalid):
		return "TLS: the broker's certificate is not valid (expired, not yet valid, or not for server authentication); renew it on the broker"
	case errors.As(err, &notTLS):
		return "TLS: the listener does not speak TLS; point --kafka-brokers at the broker's SSL or SASL_SSL listener, or drop --kafka-tls"
	}
	return ""
}
