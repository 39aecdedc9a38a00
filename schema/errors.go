package schema

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
)

// MismatchError: a payload does not fit the schema it is encoded by (or is
// not JSON at all). It is the event's fault, not the registry's: the same
// payload fails the same way every time.
type MismatchError struct {
	Subject  string // the subject the schema was chosen under ("" when chosen by id alone)
	SchemaID int    // the schema's global id in the registry
	Version  int    // the schema's version in the subject; 0 when chosen by id (unknown)
	Format   Format
	Path     string // JSON path of the first mismatch in the payload, "$" for the whole
	Reason   string // what is wrong there
}

func (e *MismatchError) Error() string {
	v := "version unknown"
	if e.Version > 0 {
		v = fmt.Sprintf("version %d", e.Version)
	}
	subject := e.Subject
	if subject == "" {
		subject = "(no subject)"
	}
	return fmt.Sprintf("payload does not fit %s schema %d (subject %q, %s) at %s: %s", e.Format, e.SchemaID, subject, v, e.Path, e.Reason)
}

// RegistryError: the registry did not answer a request usefully: it could
// not be reached, was slow past the call's timeout, refused the
// credentials, or failed. Status is the HTTP status, 0 when no response
// came; Code the registry's own error code when it sent one.
type RegistryError struct {
	URL    string // the request's URL
	Op     string // what was asked: "schema by id", "subject version", "latest version", "register"
	Status int
	Code   int
	Err    error
}

func (e *RegistryError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("schema registry %s: %s: no response: %v", e.URL, e.Op, e.Err)
	}
	return fmt.Sprintf("schema registry %s: %s: HTTP %d %s: %v", e.URL, e.Op, e.Status, http.StatusText(e.Status), e.Err)
}

func (e *RegistryError) Unwrap() error { return e.Err }

// NotFoundError: the registry has no such subject, version or schema id:
// deleted under the stream, or never registered. Waiting does not bring it
// back; the schema has to be registered again (or the event changed).
type NotFoundError struct {
	URL     string
	Subject string // "" when looked up by id
	Version int    // 0 for the latest version, or when looked up by id
	ID      int    // 0 unless looked up by id
	Code    int    // the registry's error code: 40401 subject, 40402 version, 40403 schema
}

func (e *NotFoundError) Error() string {
	switch {
	case e.ID != 0:
		return fmt.Sprintf("schema registry %s: no schema with id %d (error code %d)", e.URL, e.ID, e.Code)
	case e.Version != 0:
		return fmt.Sprintf("schema registry %s: subject %q has no version %d (error code %d)", e.URL, e.Subject, e.Version, e.Code)
	case e.Code == 40402:
		return fmt.Sprintf("schema registry %s: subject %q has no version left (error code %d)", e.URL, e.Subject, e.Code)
	}
	return fmt.Sprintf("schema registry %s: no subject %q (error code %d)", e.URL, e.Subject, e.Code)
}

// SchemaError: the registry returned a schema this package cannot use: text
// that does not compile, a type of another format than the encoder's, or
// references to other schemas, which are not read yet. Like a
// NotFoundError, it lasts until the registry's schema is changed.
type SchemaError struct {
	Subject string
	ID      int
	Format  Format
	Err     error
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("schema %d (subject %q) is no usable %s schema: %v", e.ID, e.Subject, e.Format, e.Err)
}

func (e *SchemaError) Unwrap() error { return e.Err }

// Retryable says whether the same call may succeed later without anything
// changing but the registry: it had no answer, was too slow, refused the
// credentials (which are rotated), throttled, or failed on its side. A
// mismatch, a missing subject, an unusable schema, a certificate that does
// not verify or any other refused request is not retryable.
func Retryable(err error) bool {
	var re *RegistryError
	if !errors.As(err, &re) {
		return false
	}
	switch {
	case re.Status == 0:
		// No answer at all: refused connection, reset, or the call's
		// timeout passed; but a certificate that does not verify stays
		// so until the CA file or the registry's certificate is changed.
		var cv *tls.CertificateVerificationError
		var ua x509.UnknownAuthorityError
		var he x509.HostnameError
		var ci x509.CertificateInvalidError
		return !errors.As(re.Err, &cv) && !errors.As(re.Err, &ua) && !errors.As(re.Err, &he) && !errors.As(re.Err, &ci)
	case re.Status == http.StatusUnauthorized, re.Status == http.StatusForbidden,
		re.Status == http.StatusRequestTimeout, re.Status == http.StatusTooManyRequests,
		re.Status >= 500:
		return true
	}
	return false
}

// SubjectError: the event does not give what its subject's name needs (a
// record name, under the record name strategies).
type SubjectError struct {
	Topic    string
	Strategy Strategy
	Err      error
}

func (e *SubjectError) Error() string {
	return fmt.Sprintf("no subject for topic %q under the %s strategy: %v", e.Topic, e.Strategy, e.Err)
}

func (e *SubjectError) Unwrap() error { return e.Err }

// WireError: a record value the Decoder was given is not in the Confluent
// wire format: shorter than its five-byte header, or without the zero magic
// byte (a value written without a schema, such as plain JSON). The same
// value fails the same way every time.
type WireError struct {
	Len int // the value's length in bytes
	Err error
}

func (e *WireError) Error() string {
	return fmt.Sprintf("record value (%d bytes) is not in the Confluent wire format (magic byte 0, 4-byte schema id): %v", e.Len, e.Err)
}

func (e *WireError) Unwrap() error { return e.Err }

// DecodeError: a record value's bytes do not decode by the schema its
// header names (truncated, written by another schema, or Protobuf message
// indexes the schema does not have). Like a MismatchError it is the
// record's fault, not the registry's.
type DecodeError struct {
	SchemaID int
	Format   Format
	Err      error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("record value does not decode by %s schema %d: %v", e.Format, e.SchemaID, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }
