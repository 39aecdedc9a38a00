package mapping

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// Format is how a row's record is laid out: the streamer's own headers, or
// a CloudEvent in one of the two modes of the CloudEvents Kafka protocol
// binding. It is a field of Config, so each outbox may have its own.
type Format string

// Record formats.
const (
	// FormatNative: the headers id, event_type, aggregate_type and source,
	// the payload as the value (the package doc).
	FormatNative Format = "native"
	// FormatCloudEventsBinary: the payload as the value, the event's
	// attributes in ce_* headers and its media type in content-type.
	FormatCloudEventsBinary Format = "cloudevents-binary"
	// FormatCloudEventsStructured: the value is the whole event in the
	// CloudEvents JSON format (content-type application/cloudevents+json).
	FormatCloudEventsStructured Format = "cloudevents-structured"
)

// Formats lists the record formats, the default first.
func Formats() []Format {
	return []Format{FormatNative, FormatCloudEventsBinary, FormatCloudEventsStructured}
}

// cloudEvents reports whether f is one of the CloudEvents formats.
func (f Format) cloudEvents() bool {
	return f == FormatCloudEventsBinary || f == FormatCloudEventsStructured
}

// Header keys and values of the CloudEvents formats (Kafka protocol
// binding 1.0: attributes are headers named ce_<attribute>).
const (
	HeaderContentType = "content-type"
	ceSpecVersion     = "ce_specversion"
	ceID              = "ce_id"
	ceSource          = "ce_source"
	ceType            = "ce_type"
	ceTime            = "ce_time"
	ceSubject         = "ce_subject"
	// The aggregate type, which the native format carries as a header,
	// goes on as an extension attribute (lower-case letters and digits
	// only, as the specification requires of attribute names).
	ceAggregateType = "ce_aggregatetype"
	ceDataSchema    = "ce_dataschema"

	// ContentTypeStructured is a structured record's content-type.
	ContentTypeStructured = "application/cloudevents+json; charset=UTF-8"
)

// Content types by payload column type, unless the headers column names one.
var (
	specVersion     = []byte("1.0")
	ctJSON          = []byte("application/json")
	ctOctets        = []byte("application/octet-stream")
	ctStructuredVal = []byte(ContentTypeStructured)
)

// ceHeader reports whether the (unescaped) header key k would collide with
// a CloudEvents attribute header. The binding reads header names without
// regard to case, so neither does this.
func ceHeader(k []byte) bool {
	return len(k) >= 3 && (k[0] == 'c' || k[0] == 'C') && (k[1] == 'e' || k[1] == 'E') && k[2] == '_'
}

// ValidSource reports whether s can be a CloudEvents source: a non-empty
// URI-reference (RFC 3986), that is only the characters a URI may hold,
// with any other character percent-encoded. The default source,
// "<system identifier>/<database OID>/<table OID>", is a relative one.
func ValidSource(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", c) >= 0:
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// mediaJSON reports whether the content type ct is JSON, so a structured
// event carries the payload inline as JSON rather than as a string:
// application/json or text/json, parameters aside. The JSON event format
// would allow it for a +json suffix too, but the CloudEvents Go SDK then
// expects a string, and a string is what every reader can take.
func mediaJSON(ct []byte) bool {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	return bytes.EqualFold(ct, []byte("application/json")) || bytes.EqualFold(ct, []byte("text/json"))
}

// cloudEvent lays the native record rec out as a CloudEvent. rec holds
// what Map made: headers id, event_type, aggregate_type, source, then the
// headers column's members (from index extra). ts is created_at (zero for
// none); oid is the payload column's type.
func (m *Mapper) cloudEvent(cols []Column, rec *kgo.Record, extra int, ts time.Time, oid uint32) error {
	id, typ, aggType := rec.Headers[0].Value, rec.Headers[1].Value, rec.Headers[2].Value
	// A text or varchar payload is JSON as much as a json one: the mapping
	// refused it otherwise (payloadLen). Only bytea holds anything.
	ct := ctJSON
	if oid == oidBytea {
		ct = ctOctets
	}
	extras := rec.Headers[extra:]
	for _, h := range extras {
		if h.Key == HeaderContentType {
			ct = h.Value
		}
	}
	var tsText []byte
	if !ts.IsZero() {
		tsText = ts.UTC().AppendFormat(make([]byte, 0, len(time.RFC3339Nano)), time.RFC3339Nano)
	}

	if m.format == FormatCloudEventsBinary {
		hdrs := make([]kgo.RecordHeader, 0, 8+len(extras))
		hdrs = append(hdrs,
			kgo.RecordHeader{Key: ceSpecVersion, Value: specVersion},
			kgo.RecordHeader{Key: ceID, Value: id},
			kgo.RecordHeader{Key: ceSource, Value: m.source},
			kgo.RecordHeader{Key: ceType, Value: typ})
		if tsText != nil {
			hdrs = append(hdrs, kgo.RecordHeader{Key: ceTime, Value: tsText})
		}
		hdrs = append(hdrs,
			kgo.RecordHeader{Key: ceSubject, Value: rec.Key},
			kgo.RecordHeader{Key: ceAggregateType, Value: aggType},
			kgo.RecordHeader{Key: HeaderContentType, Value: ct})
		for _, h := range extras {
			if h.Key != HeaderContentType {
				hdrs = append(hdrs, h)
			}
		}
		rec.Headers = hdrs
		return nil
	}

	// Structured: the JSON event format. Every attribute value was checked
	// to be UTF-8 (they are headers in the native format); the payload is
	// JSON (json, jsonb, or text checked by payloadLen) or bytes.
	data := rec.Value
	doc := make([]byte, 0, 160+len(id)+len(m.source)+len(typ)+len(rec.Key)+len(aggType)+len(ct)+len(tsText)+base64.StdEncoding.EncodedLen(len(data))+len(data)/8)
	doc = append(doc, `{"specversion":"1.0","id":`...)
	doc = appendJSONString(doc, id)
	doc = append(doc, `,"source":`...)
	doc = appendJSONString(doc, m.source)
	doc = append(doc, `,"type":`...)
	doc = appendJSONString(doc, typ)
	doc = append(doc, `,"subject":`...)
	doc = appendJSONString(doc, rec.Key)
	if tsText != nil {
		doc = append(doc, `,"time":`...)
		doc = appendJSONString(doc, tsText)
	}
	doc = append(doc, `,"aggregatetype":`...)
	doc = appendJSONString(doc, aggType)
	doc = append(doc, `,"datacontenttype":`...)
	doc = appendJSONString(doc, ct)
	switch {
	case oid == oidBytea:
		doc = append(doc, `,"data_base64":"`...)
		doc = base64.StdEncoding.AppendEncode(doc, data)
		doc = append(doc, '"')
	case mediaJSON(ct):
		doc = append(doc, `,"data":`...)
		doc = append(doc, data...)
	default:
		// A text payload of another media type is carried as a JSON
		// string, which must then be UTF-8 (the bytes cannot be altered).
		if !utf8.Valid(data) {
			return m.bad(cols, m.cols[m.idx[rolePayload]], fmt.Sprintf("is not valid UTF-8, which a structured CloudEvent of content type %s must carry as a string", excerpt(ct)))
		}
		doc = append(doc, `,"data":`...)
		doc = appendJSONString(doc, data)
	}
	doc = append(doc, '}')
	hdrs := make([]kgo.RecordHeader, 0, 1+len(extras))
	hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderContentType, Value: ctStructuredVal})
	for _, h := range extras {
		if h.Key != HeaderContentType {
			hdrs = append(hdrs, h)
		}
	}
	rec.Value, rec.Headers = doc, hdrs
	return nil
}

// SetDataSchema makes rec, a CloudEvents binary record, one whose data is
// of content type ct by the schema at the URI dataSchema (a schema
// registry's): content-type becomes ct, and the dataschema attribute names
// the schema. The headers column cannot have set a ce_ header (Map refuses
// it), so dataschema is not there yet.
func SetDataSchema(rec *kgo.Record, ct, dataSchema []byte) {
	for i := range rec.Headers {
		if rec.Headers[i].Key == HeaderContentType {
			rec.Headers[i].Value = ct
		}
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: ceDataSchema, Value: dataSchema})
}

// appendJSONString appends the UTF-8 text s as a JSON string.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// RecordEvent is what names the event a record carries: its id, source
// and type, as the mapping wrote them in Format.
type RecordEvent struct {
	Format           Format
	ID, Source, Type string
}

// ReadRecordEvent reads the event a record the mapping made carries, in
// whichever format it was written: native (the headers id, source,
// event_type), CloudEvents binary (ce_id, ce_source, ce_type) or structured
// (the JSON event's id, source and type). ok is false for a record of none
// of them. The headers column never adds a native header to a record of
// any format (Map refuses the reserved names), nor a ce_ header to a
// CloudEvents record; a native record may carry a ce_ header of the row's
// own, so the native id decides first. It is not for the hot path: a
// structured record's value is parsed.
func ReadRecordEvent(r *kgo.Record) (ev RecordEvent, ok bool) {
	var native, binary RecordEvent
	var nativeID, binaryID, structured bool
	for _, h := range r.Headers {
		switch h.Key {
		case contract.HeaderID:
			native.ID, nativeID = string(h.Value), true
		case contract.HeaderSource:
			native.Source = string(h.Value)
		case contract.HeaderEventType:
			native.Type = string(h.Value)
		case ceID:
			binary.ID, binaryID = string(h.Value), true
		case ceSource:
			binary.Source = string(h.Value)
		case ceType:
			binary.Type = string(h.Value)
		case HeaderContentType:
			structured = structured || bytes.Equal(h.Value, ctStructuredVal)
		}
	}
	switch {
	case nativeID:
		native.Format = FormatNative
		return native, true
	case binaryID:
		binary.Format = FormatCloudEventsBinary
		return binary, true
	case structured:
		var doc struct {
			ID     string `json:"id"`
			Source string `json:"source"`
			Type   string `json:"type"`
		}
		if json.Unmarshal(r.Value, &doc) != nil || doc.ID == "" {
			return ev, false
		}
		return RecordEvent{Format: FormatCloudEventsStructured, ID: doc.ID, Source: doc.Source, Type: doc.Type}, true
	}
	return ev, false
}

// RecordEventID returns the event id of a record the mapping made, in any
// format ("" when it has none), for messages about a record the broker
// refused. It is not for the hot path: a structured record's value is
// parsed.
func RecordEventID(r *kgo.Record) string {
	for _, h := range r.Headers {
		switch h.Key {
		case contract.HeaderID, ceID:
			return string(h.Value)
		case HeaderContentType:
			if bytes.Equal(h.Value, ctStructuredVal) {
				var ev struct {
					ID string `json:"id"`
				}
				if json.Unmarshal(r.Value, &ev) == nil {
					return ev.ID
				}
			}
		}
	}
	return ""
}
