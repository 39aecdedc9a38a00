package outbox

import (
	"context"
	"fmt"
	"maps"
	"strings"
)

// TraceparentHeader is the header key WithTraceparent sets, as W3C Trace
// Context names it; consumers continue the trace from it.
const TraceparentHeader = "traceparent"

type traceparentKey struct{}

// ContextWithTraceparent returns a copy of ctx carrying tp, the W3C
// traceparent of the current span, for WithTraceparent to find. Call it in
// the middleware that knows the trace, e.g. with the incoming request's
// "traceparent" header or, with OpenTelemetry, with the value its
// propagator injects; this package needs no tracing dependency.
//
// An invalid tp (see ValidateTraceparent; surrounding spaces are trimmed)
// is ignored and ctx returned as it is, as Trace Context requires of a
// malformed header: a client's bad header must not end up in events.
func ContextWithTraceparent(ctx context.Context, tp string) context.Context {
	tp = strings.Trim(tp, " \t")
	if ValidateTraceparent(tp) != nil {
		return ctx
	}
	return context.WithValue(ctx, traceparentKey{}, tp)
}

// TraceparentFromContext returns the traceparent ContextWithTraceparent
// stored in ctx, and whether there is one.
func TraceparentFromContext(ctx context.Context) (string, bool) {
	tp, ok := ctx.Value(traceparentKey{}).(string)
	return tp, ok && tp != ""
}

// WithTraceparent returns headers plus the "traceparent" header from ctx,
// when ctx carries one, so the event's consumer continues the caller's
// trace. headers itself is not modified: a copy is returned when the header
// is added. A traceparent already in headers is kept, since the caller set
// it on purpose; without one in ctx, headers is returned as it is (nil
// stays nil, stored as NULL).
func WithTraceparent(ctx context.Context, headers map[string]string) map[string]string {
	tp, ok := TraceparentFromContext(ctx)
	if !ok {
		return headers
	}
	if _, set := headers[TraceparentHeader]; set {
		return headers
	}
	out := make(map[string]string, len(headers)+1)
	maps.Copy(out, headers)
	out[TraceparentHeader] = tp
	return out
}

// ValidateTraceparent checks s against the W3C Trace Context traceparent
// format, version-traceid-parentid-flags:
//
//	00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//
// Every field is lower-case hex; the trace id (32 digits) and parent id (16)
// must not be all zeros; version ff is invalid. Version 00 is exactly 55
// characters; a later version may append "-" and more fields, which are
// kept, as the specification asks of a parser that knows only version 00.
// The error wraps ErrInvalidTraceparent.
func ValidateTraceparent(s string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrInvalidTraceparent, s, why) }
	const n = 55 // len("00-" + 32 + "-" + 16 + "-" + "01")
	if len(s) < n {
		return bad("want version-traceid-parentid-flags, 55 characters")
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return bad("want version-traceid-parentid-flags separated by '-'")
	}
	version, trace, parent, flags := s[0:2], s[3:35], s[36:52], s[53:55]
	for _, f := range []struct{ name, v string }{{"version", version}, {"trace id", trace}, {"parent id", parent}, {"flags", flags}} {
		if !lowerHex(f.v) {
			return bad(f.name + " is not lower-case hex")
		}
	}
	switch {
	case version == "ff":
		return bad("version ff is invalid")
	case version == "00" && len(s) != n:
		return bad("version 00 has exactly 55 characters")
	case len(s) > n && s[n] != '-':
		return bad("fields after flags must start with '-'")
	case strings.Trim(trace, "0") == "":
		return bad("trace id is all zeros")
	case strings.Trim(parent, "0") == "":
		return bad("parent id is all zeros")
	}
	return nil
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
