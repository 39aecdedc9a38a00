package mapping

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// W3C Trace Context headers: the trace context an event carries to its
// consumers, and that the streamer's own span continues.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// spanContext reads the trace context of Debezium's tracing column
// (Config.TracingSpanContextColumn): java.util.Properties text, as its
// outbox extensions write it,
//
//	#Tue Dec 01 10:00:00 UTC 2026
//	traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
//	tracestate=congo\=t61rcWkgMzE
//
// and returns the traceparent and tracestate, nil when absent, or why it
// cannot be read.
func spanContext(doc []byte) (traceparent, tracestate []byte, why string) {
	for len(doc) > 0 {
		var line []byte
		if i := bytes.IndexAny(doc, "\r\n"); i >= 0 {
			line, doc = doc[:i], doc[i+1:]
		} else {
			line, doc = doc, nil
		}
		line = bytes.TrimLeft(line, " \t\f")
		if len(line) == 0 || line[0] == '#' || line[0] == '!' {
			continue
		}
		// The key ends at the first unescaped '=', ':' or space.
		end := 0
		for end < len(line) && line[end] != '=' && line[end] != ':' && line[end] != ' ' {
			if line[end] == '\\' {
				end++
			}
			end++
		}
		// Then spaces, at most one '=' or ':', spaces: the value.
		key := propUnescape(line[:min(end, len(line))])
		value := bytes.TrimLeft(line[min(end, len(line)):], " \t\f")
		if len(value) > 0 && (value[0] == '=' || value[0] == ':') {
			value = bytes.TrimLeft(value[1:], " \t\f")
		}
		switch string(key) {
		case HeaderTraceparent:
			traceparent = propUnescape(value)
		case HeaderTracestate:
			tracestate = propUnescape(value)
		}
	}
	if traceparent != nil && !validTraceparent(traceparent) {
		return nil, nil, fmt.Sprintf("has traceparent %s, which is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", excerpt(traceparent))
	}
	return traceparent, tracestate, ""
}

// propUnescape decodes a java.util.Properties escape sequence (\=, \:, \t,
// \uXXXX, ...) in s; it allocates only when s has one.
func propUnescape(s []byte) []byte {
	if bytes.IndexByte(s, '\\') < 0 {
		return s
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			out = append(out, c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			out = append(out, '\t')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 'f':
			out = append(out, '\f')
		case 'u':
			if i+4 < len(s) {
				if r, err := strconv.ParseUint(string(s[i+1:i+5]), 16, 16); err == nil {
					out = append(out, string(rune(r))...)
					i += 4
					continue
				}
			}
			out = append(out, 'u')
		default:
			out = append(out, s[i])
		}
	}
	return out
}

// validTraceparent checks the W3C traceparent form: version-traceid-
// parentid-flags in lower-case hex, ids not all zeros, version not ff.
func validTraceparent(b []byte) bool {
	if len(b) < 55 || b[2] != '-' || b[35] != '-' || b[52] != '-' || (len(b) > 55 && (b[0] == '0' && b[1] == '0' || b[55] != '-')) {
		return false
	}
	zeros := func(s []byte) bool { return len(bytes.Trim(s, "0")) == 0 }
	for _, f := range [][]byte{b[0:2], b[3:35], b[36:52], b[53:55]} {
		for _, c := range f {
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return !(b[0] == 'f' && b[1] == 'f') && !zeros(b[3:35]) && !zeros(b[36:52])
}

// addSpanContext puts the tracing column's trace context into rec as
// traceparent and tracestate headers, unless the headers column gave them:
// the service set those on purpose.
func addSpanContext(rec *kgo.Record, traceparent, tracestate []byte) {
	for _, h := range rec.Headers {
		if h.Key == HeaderTraceparent {
			return
		}
	}
	if traceparent == nil {
		return
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderTraceparent, Value: bytes.Clone(traceparent)})
	if len(tracestate) > 0 {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderTracestate, Value: bytes.Clone(tracestate)})
	}
}
