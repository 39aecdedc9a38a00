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

// TracestateHeader is the header key of the W3C tracestate that
// ContextWithTraceContext stores beside the traceparent: vendors' data
// that travels with the trace.
const TracestateHeader = "tracestate"

type traceparentKey struct{}

// traceContext is what the context carries: a valid traceparent and its
// tracestate, "" for none.
type traceContext struct{ parent, state string }

// maxTracestate is W3C Trace Context's limit a propagator must accept
// (512 characters); a longer one is dropped rather than cut, as the
// specification allows.
const maxTracestate = 512

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
	return ContextWithTraceContext(ctx, tp, "")
}

// ContextWithTraceContext is ContextWithTraceparent with the tracestate
// that came with tp (the "tracestate" header of the request, or the value
// an OpenTelemetry propagator injects), which WithTraceparent then stores
// too. A tracestate over 512 characters, or with characters outside
// printable ASCII, is left out; an invalid tp leaves ctx as it is.
func ContextWithTraceContext(ctx context.Context, tp, tracestate string) context.Context {
	tp = strings.Trim(tp, " \t")
	if ValidateTraceparent(tp) != nil {
		return ctx
	}
	tracestate = strings.Trim(tracestate, " \t")
	if len(tracestate) > maxTracestate || strings.ContainsFunc(tracestate, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		tracestate = ""
	}
	return context.WithValue(ctx, traceparentKey{}, traceContext{tp, tracestate})
}

// TraceparentFromContext returns the traceparent ContextWithTraceparent
// stored in ctx, and whether there is one.
func TraceparentFromContext(ctx context.Context) (string, bool) {
	tc, ok := ctx.Value(traceparentKey{}).(traceContext)
	return tc.parent, ok && tc.parent != ""
}

// WithTraceparent returns headers plus the "traceparent" header from ctx,
// when ctx carries one, so the event's consumer continues the caller's
// trace, and its "tracestate" when ContextWithTraceContext stored one. headers itself is not modified: a copy is returned when the header
// is added. A traceparent already in headers is kept, since the caller set
// it on purpose; without one in ctx, headers is returned as it is (nil
// stays nil, stored as NULL).
func WithTraceparent(ctx context.Context, headers map[string]string) map[string]string {
	tc, _ := ctx.Value(traceparentKey{}).(traceContext)
	if tc.parent == "" {
		return headers
	}
	if _, set := headers[TraceparentHeader]; set {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	maps.Copy(out, headers)
	out[TraceparentHeader] = tc.parent
	if tc.state != "" {
		out[TracestateHeader] = tc.state
	}
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
