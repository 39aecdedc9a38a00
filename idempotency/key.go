package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// DeriveKey returns a stable idempotency key for a call made on behalf of
// parent, e.g. to a payment provider: a UUID (version 8, RFC 9562) built
// from sha256(parent + "\x00" + purpose). The same parent and purpose always
// give the same key, so when our request is retried, its call to the
// provider is retried with the same key and the provider does the work
// once; different purposes (say "charge" and "refund") give different keys.
// Inside a handler, use RequestKey(ctx) as parent.
//
// An empty parent panics: it would give every caller the same key, and a
// provider would take unrelated calls for retries of one.
func DeriveKey(parent, purpose string) string {
	if parent == "" {
		panic("idempotency: DeriveKey with an empty parent key")
	}
	return deriveKey(parent, purpose)
}

// deriveKey is DeriveKey without its check: RequestKey derives from the
// client id, which is "" when every client shares one scope.
func deriveKey(parent, purpose string) string {
	h := sha256.New()
	h.Write([]byte(parent))
	h.Write([]byte{0})
	h.Write([]byte(purpose))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8: custom
	u[8] = u[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	return formatUUID(u)
}

func formatUUID(u [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// requestHash is what a retry must repeat exactly: method, path with query
// (as sent, escaped), and body. NUL separates the parts; neither the method
// nor an escaped request URI can contain one.
func requestHash(r *http.Request, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.RequestURI()))
	h.Write([]byte{0})
	h.Write(body)
	return h.Sum(nil)
}

// parseKey returns the request's key and whether it is usable. Exactly one
// header value of 1 to 255 visible ASCII characters; the quoted form of the
// IETF draft (Idempotency-Key: "abc") is accepted and means abc.
func parseKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	k := strings.TrimSpace(values[0])
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if k == "" || len(k) > 255 {
		return "", false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return "", false
		}
	}
	return k, true
}
