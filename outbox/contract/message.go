package contract

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// An outbox without a table: a service writes each event as a transactional
// logical decoding message,
//
//	SELECT pg_logical_emit_message(true, 'cdc_outbox', '{"v":1,...}');
//
// which PostgreSQL writes to the WAL alone (no heap tuple, no index entry,
// nothing to delete or vacuum later) and logical decoding delivers inside
// its transaction, at its place among the transaction's rows, once the
// transaction commits, and never if it rolls back. The streamer publishes a
// message of its prefix as the record an outbox row of the same values
// would become. The content is an envelope: one JSON object.
//
//	{
//	  "v": 1,                           required: EnvelopeVersion
//	  "id": "9f0c…",                    required: the event id (a string, or a number taken as its text)
//	  "aggregate_type": "payment",      required
//	  "aggregate_id": "42",             required (a string, or a number taken as its text)
//	  "event_type": "payment.captured", required
//	  "payload": {"amount": 100},       the record value, any JSON, kept byte for byte
//	  "payload_base64": "AAEC",         or instead: a binary record value, standard base64
//	  "headers": {"traceparent": "…"},  optional: extra headers, as the headers column
//	  "created_at": "2024-05-01T12:00:00.123456+00:00" optional: the record timestamp, RFC 3339
//	}
//
// A null member is an absent one, as json_build_object writes a SQL NULL,
// but for the payload, where null is the JSON value null (as a jsonb
// payload column may hold it, and package outbox writes for an event
// without data).
// Any other member, a member twice, or another version is a bad event:
// a typo must not drop a header silently. A version that adds members will
// be a new "v".

// DefaultMessagePrefix is the prefix of outbox messages: the streamer
// publishes the messages of its prefix (this, by default) and passes over
// the others.
const DefaultMessagePrefix = "cdc_outbox"

// EnvelopeVersion is the version of the envelope this package reads and
// writes, the value of its "v" member.
const EnvelopeVersion = 1

// The members of an envelope.
const (
	MemberVersion       = "v"
	MemberID            = "id"
	MemberAggregateType = "aggregate_type"
	MemberAggregateID   = "aggregate_id"
	MemberEventType     = "event_type"
	MemberPayload       = "payload"
	MemberPayloadBase64 = "payload_base64"
	MemberHeaders       = "headers"
	MemberCreatedAt     = "created_at"
)

// Envelope is an outbox event carried by a logical decoding message.
type Envelope struct {
	ID, AggregateType, AggregateID, EventType string
	// Payload is the record value: JSON text as written, byte for byte, or,
	// when Binary, any bytes (payload_base64 decoded).
	Payload []byte
	Binary  bool
	// Headers is a JSON object's text, as written; nil for none.
	Headers []byte
	// CreatedAt is the record timestamp; zero for none.
	CreatedAt time.Time
}

// EnvelopeError says why message content is not an envelope.
type EnvelopeError struct {
	Member string // the member at fault; "" when it is the whole content
	Reason string
}

func (e *EnvelopeError) Error() string {
	if e.Member == "" {
		return "message content " + e.Reason
	}
	return "message member " + strconv.Quote(e.Member) + " " + e.Reason
}

// ErrNotEnvelope is wrapped by every *EnvelopeError, for errors.Is.
var ErrNotEnvelope = errors.New("not an outbox message envelope")

func (e *EnvelopeError) Unwrap() error { return ErrNotEnvelope }

// ParseEnvelope reads message content. The envelope's slices alias
// content. It checks the form only; whether the values make a record
// (the topic, the header limits) is the streamer's mapping's to say, as
// for a row.
func ParseEnvelope(content []byte) (Envelope, error) {
	var e Envelope
	bad := func(member, format string, args ...any) (Envelope, error) {
		return Envelope{}, &EnvelopeError{Member: member, Reason: fmt.Sprintf(format, args...)}
	}
	if !utf8.Valid(content) {
		return bad("", "is not valid UTF-8; the envelope is JSON text")
	}
	if !json.Valid(content) {
		return bad("", "is not valid JSON; it must be a JSON object such as %s", excerpt([]byte(`{"v":1,"id":"…","aggregate_type":"…","aggregate_id":"…","event_type":"…","payload":{…}}`)))
	}
	// A walk over the top-level members of the (valid) object: encoding/json's
	// Decoder would cost several allocations per member, on every event.
	it := memberWalk{doc: content}
	if !it.open() {
		return bad("", "is JSON but not an object; the envelope is an object such as {\"v\":1,...}")
	}
	// seen: members given; has: those given and not null (bit i: members[i]).
	var seen, has uint16
	var version, payload, payload64 []byte
	for {
		rawName, raw, ok := it.next()
		if !ok {
			break
		}
		i := memberIndex(rawName)
		if i < 0 && bytes.IndexByte(rawName, '\\') >= 0 {
			unescaped, _ := text(it.quoted(rawName), false)
			rawName = []byte(unescaped)
			i = memberIndex(rawName)
		}
		if i < 0 {
			return bad(string(rawName), "is not a member of envelope version %d (%s); check its spelling", EnvelopeVersion, strings.Join(members[:], ", "))
		}
		name := members[i]
		if seen&(1<<i) != 0 {
			return bad(name, "appears twice; give each member once")
		}
		seen |= 1 << i
		if string(raw) == "null" && name != MemberPayload {
			continue // as absent: json_build_object writes NULL so
		}
		has |= 1 << i
		var err error
		switch name {
		case MemberVersion:
			version = raw
		case MemberID:
			e.ID, err = text(raw, true)
		case MemberAggregateType:
			e.AggregateType, err = text(raw, false)
		case MemberAggregateID:
			e.AggregateID, err = text(raw, true)
		case MemberEventType:
			e.EventType, err = text(raw, false)
		case MemberPayload:
			payload = raw
		case MemberPayloadBase64:
			payload64 = raw
		case MemberHeaders:
			if raw[0] != '{' {
				return bad(name, "is not a JSON object; headers are an object such as {\"traceparent\": \"...\"}, or absent")
			}
			e.Headers = raw
		case MemberCreatedAt:
			s, serr := text(raw, false)
			if serr != nil {
				return bad(name, "is not a string; give an RFC 3339 time such as \"2024-05-01T12:00:00Z\" (to_json(now()) writes one)")
			}
			t, perr := time.Parse(time.RFC3339Nano, s)
			if perr != nil {
				return bad(name, "is %s, not an RFC 3339 time with an offset such as \"2024-05-01T12:00:00Z\"; to_json of a timestamptz writes one (a timestamp without time zone has no offset)", excerpt([]byte(s)))
			}
			e.CreatedAt = t
		}
		if err != nil {
			return bad(name, "%v", err)
		}
	}

	switch {
	case version == nil:
		return bad(MemberVersion, "is missing; the envelope begins {\"v\":%d, ...}", EnvelopeVersion)
	case string(version) != strconv.Itoa(EnvelopeVersion):
		return bad(MemberVersion, "is %s; this streamer reads envelope version %d", excerpt(version), EnvelopeVersion)
	}
	// An empty value is the mapping's to refuse, as an empty column's.
	for _, m := range [...]string{MemberID, MemberAggregateType, MemberAggregateID, MemberEventType} {
		if has&(1<<memberIndex([]byte(m))) == 0 {
			return bad(m, "is missing or null; every outbox event needs it")
		}
	}
	switch {
	case payload != nil && payload64 != nil:
		return bad(MemberPayloadBase64, "is given with %q; give one of them", MemberPayload)
	case payload != nil:
		e.Payload = payload
	case payload64 != nil:
		var s string
		if json.Unmarshal(payload64, &s) != nil {
			return bad(MemberPayloadBase64, "is not a string of standard base64")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return bad(MemberPayloadBase64, "is not standard base64 (%v)", err)
		}
		e.Payload, e.Binary = b, true
	default:
		return bad(MemberPayload, "is missing; every outbox event needs a payload (the Kafka value): give a JSON value such as {}, or %q for binary data", MemberPayloadBase64)
	}
	return e, nil
}

// members lists the envelope's members, for the message about another one.
var members = [...]string{MemberVersion, MemberID, MemberAggregateType, MemberAggregateID, MemberEventType, MemberPayload, MemberPayloadBase64, MemberHeaders, MemberCreatedAt}

// memberIndex is name's index in members, -1 when it is none.
func memberIndex(name []byte) int {
	for i, m := range members {
		if string(name) == m {
			return i
		}
	}
	return -1
}

// memberWalk walks the top-level members of a JSON object that json.Valid
// accepted: it only finds boundaries, never diagnoses syntax.
type memberWalk struct {
	doc []byte
	pos int
}

// open reports whether the document is an object, positioning the walk at
// its first member.
func (w *memberWalk) open() bool {
	w.pos = skipSpace(w.doc, 0)
	if w.pos >= len(w.doc) || w.doc[w.pos] != '{' {
		return false
	}
	w.pos++
	return true
}

// next returns the next member: its name's content (without quotes, still
// escaped) and its value's JSON text.
func (w *memberWalk) next() (name, value []byte, ok bool) {
	d := w.doc
	i := skipSpace(d, w.pos)
	if i < len(d) && d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	if i >= len(d) || d[i] != '"' {
		return nil, nil, false // the closing brace
	}
	end := skipString(d, i)
	name = d[i+1 : end-1]
	i = skipSpace(d, end) // at ':'
	i = skipSpace(d, i+1) // at the value
	end = skipValue(d, i)
	w.pos = end
	return name, d[i:end], true
}

// quoted is a member name's content with its quotes, for text.
func (w *memberWalk) quoted(name []byte) []byte {
	return append(append([]byte{'"'}, name...), '"')
}

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string at d[i] == '"'.
func skipString(d []byte, i int) int {
	for i++; i < len(d); i++ {
		switch d[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(d)
}

// skipValue returns the index just past the value at d[i].
func skipValue(d []byte, i int) int {
	if d[i] == '"' {
		return skipString(d, i)
	}
	depth := 0
	for ; i < len(d); i++ {
		switch d[i] {
		case '"':
			i = skipString(d, i) - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return len(d)
}

// text is a member that becomes a header or the key: a JSON string, or,
// when number is set, a number taken as its JSON text (json_build_object
// writes a bigint id so).
func text(raw []byte, number bool) (string, error) {
	if raw[0] != '"' {
		if number && (raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9') {
			return string(raw), nil
		}
		if number {
			return "", errors.New("is neither a string nor a number")
		}
		return "", errors.New("is not a string")
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil // valid UTF-8 without escapes: as it is
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	// encoding/json turns an escape with no UTF-8 form (a lone surrogate)
	// into U+FFFD: that would alter the value.
	if strings.ContainsRune(s, utf8.RuneError) && !bytes.Contains(raw, []byte("\uFFFD")) && !bytes.Contains(bytes.ToLower(raw), []byte(`\ufffd`)) {
		return "", errors.New("has an escape that is not valid UTF-8 (a lone surrogate)")
	}
	return s, nil
}

// excerpt quotes at most 64 bytes of b for an error message.
func excerpt(b []byte) string {
	const limit = 64
	if len(b) <= limit {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:limit])) + "..."
}

// AppendEnvelope appends e's JSON text to dst: what package outbox's Emit
// sends, and the form the streamer reads. e.Payload must be valid JSON
// unless Binary; e.Headers a JSON object or nil. A zero CreatedAt is left
// out.
func AppendEnvelope(dst []byte, e Envelope) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, EnvelopeVersion, 10)
	str := func(name, v string) {
		dst = append(dst, ',')
		dst = strconv.AppendQuote(dst, name)
		dst = append(dst, ':')
		b, _ := json.Marshal(v) // a string always marshals
		dst = append(dst, b...)
	}
	str(MemberID, e.ID)
	str(MemberAggregateType, e.AggregateType)
	str(MemberAggregateID, e.AggregateID)
	str(MemberEventType, e.EventType)
	if e.Binary {
		str(MemberPayloadBase64, base64.StdEncoding.EncodeToString(e.Payload))
	} else {
		dst = append(dst, `,"payload":`...)
		dst = append(dst, e.Payload...)
	}
	if e.Headers != nil {
		dst = append(dst, `,"headers":`...)
		dst = append(dst, e.Headers...)
	}
	if !e.CreatedAt.IsZero() {
		str(MemberCreatedAt, e.CreatedAt.Format(time.RFC3339Nano))
	}
	return append(dst, '}')
}
