package mapping

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/topic"
)

// Type OIDs of the column types whose text form the mapper interprets.
const (
	oidBytea       = 17
	oidText        = 25
	oidJSON        = 114
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidJSONB       = 3802
)

// reserved reports whether the escaped JSON key k, once unescaped, is one
// of the headers cdc-outbox sets itself (contract.ReservedHeaders). It
// allocates only for keys with escapes.
func reserved(k []byte) bool {
	if bytes.IndexByte(k, '\\') >= 0 {
		k = appendUnescaped(nil, k)
	}
	return contract.Reserved(k)
}

// Column is one column value as decoded from pgoutput (text format). The
// caller fills a reusable slice in the order given by Mapper.Columns().
type Column struct {
	Data    []byte // text representation; aliases the replication buffer: Map must copy what the record keeps
	Null    bool
	Missing bool // the table has no such column
	TypeOID uint32
}

// Config names the outbox columns and shapes the record.
type Config struct {
	Topic string // template, default topic.DefaultTemplate

	IDColumn, AggregateTypeColumn, AggregateIDColumn, EventTypeColumn, PayloadColumn, HeadersColumn, CreatedAtColumn string // defaults: the contract's column names

	MaxHeaderBytes int // largest header key or value, default contract.MaxHeaderBytes

	// Source is the "source" header of every record: which outbox the
	// events come from, so consumers reading several outboxes, whose ids
	// overlap, tell their events apart. Empty: no source header. The
	// CloudEvents formats need one (their source attribute), a
	// URI-reference (ValidSource).
	Source string

	// TracingSpanContextColumn names an optional text column holding the
	// trace context as Debezium's outbox extensions write it (its
	// tracingspancontext column, java.util.Properties text); its
	// traceparent and tracestate become headers of those names, unless
	// the headers column has a traceparent. Empty: no such column.
	TracingSpanContextColumn string

	// Format lays the record out: FormatNative (the default, also for
	// ""), or a CloudEvents format (format.go).
	Format Format
}

// DefaultConfig matches the default outbox table (package contract).
func DefaultConfig() Config {
	return Config{
		Topic:               topic.DefaultTemplate,
		IDColumn:            contract.ColumnID,
		AggregateTypeColumn: contract.ColumnAggregateType,
		AggregateIDColumn:   contract.ColumnAggregateID,
		EventTypeColumn:     contract.ColumnEventType,
		PayloadColumn:       contract.ColumnPayload,
		HeadersColumn:       contract.ColumnHeaders,
		CreatedAtColumn:     contract.ColumnCreatedAt,
		MaxHeaderBytes:      contract.MaxHeaderBytes,
		Format:              FormatNative,
	}
}

// Column roles, in the order of Mapper.Columns().
const (
	roleID = iota
	roleAggregateType
	roleAggregateID
	roleEventType
	rolePayload
	roleHeaders   // optional
	roleCreatedAt // optional
	numRoles
)

// roleDesc names each role in messages about a missing column.
var roleDesc = [numRoles]string{"event id", "aggregate type", "aggregate id", "event type", "payload", "headers", "created_at"}

// nullReason says why a required column may not be NULL.
var nullReason = [rolePayload + 1]string{
	roleID:            `is NULL; every outbox row needs an event id (it becomes the "id" header)`,
	roleAggregateType: `is NULL; every outbox row needs an aggregate type (it becomes the "aggregate_type" header)`,
	roleAggregateID:   `is NULL; every outbox row needs an aggregate id (it is the Kafka key)`,
	roleEventType:     `is NULL; every outbox row needs an event type (it becomes the "event_type" header)`,
	rolePayload:       `is NULL; every outbox row needs a payload (it is the Kafka value); store a JSON value such as {} instead`,
}

// Mapper turns outbox rows into records. It is safe for concurrent use.
type Mapper struct {
	cols       []string
	idx        [numRoles]int // index in cols of each role's column
	tmpl       string
	topic      []topicPart
	constTopic string // the topic when the template has no placeholders
	maxHeader  int
	source     []byte // the source header's value, shared by every record; nil for none
	format     Format
	traceCol   int // index in cols of the tracing column, -1 for none

	// Topics and header keys repeat from row to row; interning them saves
	// an allocation each per record.
	topics, keys internCache
}

// New checks cfg and returns a Mapper for it.
func New(cfg Config) (*Mapper, error) {
	if cfg.MaxHeaderBytes <= 0 {
		return nil, fmt.Errorf("mapping: MaxHeaderBytes is %d; it must be positive (default %d)", cfg.MaxHeaderBytes, DefaultConfig().MaxHeaderBytes)
	}
	def := DefaultConfig()
	names := [numRoles]struct{ field, name, def string }{
		{"IDColumn", cfg.IDColumn, def.IDColumn},
		{"AggregateTypeColumn", cfg.AggregateTypeColumn, def.AggregateTypeColumn},
		{"AggregateIDColumn", cfg.AggregateIDColumn, def.AggregateIDColumn},
		{"EventTypeColumn", cfg.EventTypeColumn, def.EventTypeColumn},
		{"PayloadColumn", cfg.PayloadColumn, def.PayloadColumn},
		{"HeadersColumn", cfg.HeadersColumn, def.HeadersColumn},
		{"CreatedAtColumn", cfg.CreatedAtColumn, def.CreatedAtColumn},
	}
	if !utf8.ValidString(cfg.Source) || len(cfg.Source) > cfg.MaxHeaderBytes {
		return nil, fmt.Errorf("mapping: Source must be valid UTF-8 of at most MaxHeaderBytes (%d) bytes", cfg.MaxHeaderBytes)
	}
	switch cfg.Format {
	case "":
		cfg.Format = FormatNative
	case FormatNative:
	case FormatCloudEventsBinary, FormatCloudEventsStructured:
		if !ValidSource(cfg.Source) {
			return nil, fmt.Errorf("mapping: Source %q: a CloudEvents source must be a non-empty URI-reference (RFC 3986; percent-encode other characters)", cfg.Source)
		}
	default:
		return nil, fmt.Errorf("mapping: Format %q: use %s, %s or %s", cfg.Format, FormatNative, FormatCloudEventsBinary, FormatCloudEventsStructured)
	}
	m := &Mapper{tmpl: cfg.Topic, maxHeader: cfg.MaxHeaderBytes, format: cfg.Format}
	if cfg.Source != "" {
		m.source = []byte(cfg.Source)
	}
	pos := make(map[string]int)
	add := func(name string) int {
		if i, ok := pos[name]; ok {
			return i
		}
		pos[name] = len(m.cols)
		m.cols = append(m.cols, name)
		return len(m.cols) - 1
	}
	for r, n := range names {
		if n.name == "" {
			return nil, fmt.Errorf("mapping: %s is empty; name the outbox table's %s column (default %q)", n.field, roleDesc[r], n.def)
		}
		m.idx[r] = add(n.name)
	}
	m.traceCol = -1
	if cfg.TracingSpanContextColumn != "" {
		m.traceCol = add(cfg.TracingSpanContextColumn)
	}
	parts, err := parseTopicTemplate(cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("mapping: %w", err)
	}
	for i := range parts {
		if parts[i].name != "" {
			parts[i].col = add(parts[i].name)
		}
	}
	if len(parts) == 1 && parts[0].name == "" {
		m.constTopic = parts[0].lit
	}
	m.topic = parts
	return m, nil
}

// Columns returns the column names Map needs, in the order Map expects them:
// the event id, aggregate type, aggregate id, event type, payload, headers
// and created_at columns, the tracing column when configured, then columns
// only the topic template uses. A name
// used twice appears once. The caller must not modify the slice.
func (m *Mapper) Columns() []string { return m.cols }

// Source is the value of every record's source header, nil for none.
// Callers must not modify it.
func (m *Mapper) Source() []byte { return m.source }

// EventID returns the event id text from cols (for error messages and
// dead-letter), or "" when it is NULL or missing.
func (m *Mapper) EventID(cols []Column) string {
	i := m.idx[roleID]
	if i >= len(cols) || cols[i].Null || cols[i].Missing {
		return ""
	}
	return string(cols[i].Data)
}

// EventType returns the event type text from cols, aliasing them, or nil
// when it is NULL or missing.
func (m *Mapper) EventType(cols []Column) []byte {
	i := m.idx[roleEventType]
	if i >= len(cols) || cols[i].Null || cols[i].Missing {
		return nil
	}
	return cols[i].Data
}

// Map fills rec from cols (len == len(Columns())): Topic, Key, Value, Headers
// and Timestamp; every other field of rec is reset to its zero value. The
// record shares no memory with cols. On a bad row it returns a
// *BadEventError and rec is left undefined.
func (m *Mapper) Map(cols []Column, rec *kgo.Record) error {
	if len(cols) != len(m.cols) {
		return fmt.Errorf("mapping: Map got %d columns, want %d in the order of Mapper.Columns()", len(cols), len(m.cols))
	}

	// Check everything before allocating, so bad rows cost little.
	var req [rolePayload + 1][]byte
	for r := range req {
		c := &cols[m.idx[r]]
		switch {
		case c.Missing:
			return m.bad(cols, m.cols[m.idx[r]], fmt.Sprintf("is not a column of the outbox table; check the column flags (it is configured as the %s column)", roleDesc[r]))
		case c.Null:
			return m.bad(cols, m.cols[m.idx[r]], nullReason[r])
		}
		req[r] = c.Data
	}
	key := req[roleAggregateID]
	if len(key) == 0 {
		return m.bad(cols, m.cols[m.idx[roleAggregateID]], "is empty; every outbox row needs an aggregate id (it is the Kafka key)")
	}
	if !utf8.Valid(key) {
		return m.bad(cols, m.cols[m.idx[roleAggregateID]], notUTF8)
	}
	for _, r := range [...]int{roleID, roleEventType, roleAggregateType} {
		if err := m.checkHeaderValue(cols, m.cols[m.idx[r]], req[r]); err != nil {
			return err
		}
	}
	topic, err := m.renderTopic(cols)
	if err != nil {
		return err
	}
	payload := &cols[m.idx[rolePayload]]
	valueLen, why := payloadLen(payload)
	if why != "" {
		return m.bad(cols, m.cols[m.idx[rolePayload]], why)
	}
	var hdrDoc []byte
	extra, extraBytes := 0, 0
	if c := &cols[m.idx[roleHeaders]]; !c.Missing && !c.Null {
		hdrDoc = c.Data
		if extra, extraBytes, err = m.scanHeaders(cols, c); err != nil {
			return err
		}
	}
	var traceparent, tracestate []byte
	if m.traceCol >= 0 {
		if c := &cols[m.traceCol]; !c.Missing && !c.Null {
			var why string
			switch c.TypeOID {
			case oidText, oidVarchar:
				traceparent, tracestate, why = spanContext(c.Data)
			default:
				why = fmt.Sprintf("has type OID %d; the tracing span context column must be text or varchar", c.TypeOID)
			}
			if why != "" {
				return m.bad(cols, m.cols[m.traceCol], why)
			}
			if err := m.checkHeaderValue(cols, m.cols[m.traceCol], tracestate); err != nil {
				return err
			}
		}
	}
	var ts time.Time
	if c := &cols[m.idx[roleCreatedAt]]; !c.Missing && !c.Null {
		if ts, err = m.timestamp(cols, c); err != nil {
			return err
		}
	}

	// One buffer holds every byte the record keeps; each field is a capped
	// slice of it, so appending to one field cannot overwrite the next.
	buf := make([]byte, 0, len(key)+valueLen+len(req[roleID])+len(req[roleEventType])+len(req[roleAggregateType])+extraBytes)
	var value []byte
	buf, key = carve(buf, key)
	if payload.TypeOID == oidBytea {
		n := len(buf)
		buf = buf[:n+valueLen]
		if _, err := hex.Decode(buf[n:], payload.Data[2:]); err != nil {
			return m.bad(cols, m.cols[m.idx[rolePayload]], "is bytea with invalid hex digits ("+err.Error()+")")
		}
		value = buf[n:len(buf):len(buf)]
	} else {
		buf, value = carve(buf, payload.Data)
	}
	hdrs := make([]kgo.RecordHeader, 3, 4+extra)
	buf, hdrs[0].Value = carve(buf, req[roleID])
	buf, hdrs[1].Value = carve(buf, req[roleEventType])
	buf, hdrs[2].Value = carve(buf, req[roleAggregateType])
	hdrs[0].Key, hdrs[1].Key, hdrs[2].Key = contract.HeaderID, contract.HeaderEventType, contract.HeaderAggregateType
	if m.source != nil {
		// Shared by every record: nothing downstream modifies a header.
		hdrs = append(hdrs, kgo.RecordHeader{Key: contract.HeaderSource, Value: m.source})
	}
	firstExtra := len(hdrs)
	if extra > 0 {
		it := memberIter{doc: hdrDoc}
		it.open()
		for {
			k, v, str, ok := it.next()
			if !ok {
				break
			}
			h := kgo.RecordHeader{Key: m.headerKey(k)}
			if str {
				n := len(buf)
				buf = appendUnescaped(buf, v)
				h.Value = buf[n:len(buf):len(buf)]
			} else {
				buf, h.Value = carve(buf, v)
			}
			hdrs = append(hdrs, h)
		}
	}
	*rec = kgo.Record{Topic: topic, Key: key, Value: value, Headers: hdrs, Timestamp: ts}
	if traceparent != nil {
		addSpanContext(rec, traceparent, tracestate)
	}
	if m.format != FormatNative {
		return m.cloudEvent(cols, rec, firstExtra, ts, payload.TypeOID)
	}
	return nil
}

const notUTF8 = "is not valid UTF-8; is the database encoding UTF8?"

func (m *Mapper) bad(cols []Column, column, reason string) error {
	return &BadEventError{EventID: m.EventID(cols), Column: column, Reason: reason}
}

// carve appends b to buf and returns the appended part, capped at its length.
func carve(buf, b []byte) ([]byte, []byte) {
	n := len(buf)
	buf = append(buf, b...)
	return buf, buf[n:len(buf):len(buf)]
}

func (m *Mapper) checkHeaderValue(cols []Column, column string, v []byte) error {
	if !utf8.Valid(v) {
		return m.bad(cols, column, notUTF8+" (it becomes a Kafka header)")
	}
	if len(v) > m.maxHeader {
		return m.bad(cols, column, fmt.Sprintf("is %d bytes, over the %d-byte header limit (MaxHeaderBytes); it becomes a Kafka header", len(v), m.maxHeader))
	}
	return nil
}

// renderTopic fills the template on the stack and interns the result, so a
// record's topic normally costs no allocation.
func (m *Mapper) renderTopic(cols []Column) (string, error) {
	if m.constTopic != "" {
		return m.constTopic, nil
	}
	n := 0
	for _, p := range m.topic {
		n += len(p.lit)
		if p.name != "" {
			c := &cols[p.col]
			switch {
			case c.Missing:
				return "", m.bad(cols, p.name, fmt.Sprintf("is not a column of the outbox table, but the topic template %q uses it; check the template and the column flags", m.tmpl))
			case c.Null:
				return "", m.bad(cols, p.name, fmt.Sprintf("is NULL, but the topic template %q needs it to name the topic", m.tmpl))
			}
			n += len(c.Data)
		}
	}
	if n > maxTopicLen {
		return "", m.bad(cols, "", fmt.Sprintf("topic rendered from template %q would be %d bytes, over Kafka's %d-byte limit", m.tmpl, n, maxTopicLen))
	}
	var arr [maxTopicLen]byte
	t := arr[:0]
	for _, p := range m.topic {
		if p.name != "" {
			t = append(t, cols[p.col].Data...)
		} else {
			t = append(t, p.lit...)
		}
	}
	if why := badTopic(t); why != "" {
		// Blame the column whose value holds a bad character or, failing
		// that, the only column the template uses.
		column, only, names := "", "", 0
		for _, p := range m.topic {
			if p.name == "" {
				continue
			}
			names, only = names+1, p.name
			if column == "" && bytes.ContainsFunc(cols[p.col].Data, func(r rune) bool { return r > 0x7f || !topicChar(byte(r)) }) {
				column = p.name
			}
		}
		if column == "" && names == 1 {
			column = only
		}
		return "", m.bad(cols, column, fmt.Sprintf("topic %s rendered from template %q %s", excerpt(t), m.tmpl, why))
	}
	return m.topics.get(t), nil
}

// payloadLen returns the length the value will have, or why the payload
// cannot be published.
func payloadLen(c *Column) (int, string) {
	switch c.TypeOID {
	case oidJSON, oidJSONB:
		// PostgreSQL has validated it; re-checking would cost a full scan.
		if len(c.Data) == 0 {
			return 0, "is empty, which is not JSON"
		}
	case oidText, oidVarchar:
		if !json.Valid(c.Data) {
			return 0, "is text but not valid JSON; store a JSON document, or make the column json, jsonb or bytea"
		}
	case oidBytea:
		if len(c.Data) < 2 || c.Data[0] != '\\' || c.Data[1] != 'x' {
			return 0, `is bytea but not in hex output format (\x...); set bytea_output = 'hex' for the replication user`
		}
		if len(c.Data)%2 != 0 {
			return 0, "is bytea with an odd number of hex digits"
		}
		return (len(c.Data) - 2) / 2, ""
	default:
		return 0, fmt.Sprintf("has type OID %d; the payload must be json or jsonb, text or varchar holding JSON, or bytea", c.TypeOID)
	}
	return len(c.Data), ""
}

// scanHeaders checks the headers document and returns how many headers it
// adds and how many value bytes they need.
func (m *Mapper) scanHeaders(cols []Column, c *Column) (n, size int, err error) {
	column := m.cols[m.idx[roleHeaders]]
	switch c.TypeOID {
	case oidJSON, oidJSONB, oidText, oidVarchar:
	default:
		return 0, 0, m.bad(cols, column, fmt.Sprintf("has type OID %d; headers must be json or jsonb (or text holding a JSON object)", c.TypeOID))
	}
	// PostgreSQL parsed json and jsonb values when they were written; only
	// text needs the full syntax check. UTF-8 is checked whatever the type
	// (json.Valid does not, and a SQL_ASCII database stores any bytes):
	// utf8.Valid covers raw bytes and unescapedLen the \u escapes.
	if (c.TypeOID == oidText || c.TypeOID == oidVarchar) && !json.Valid(c.Data) {
		return 0, 0, m.bad(cols, column, "is not valid JSON; headers must be a JSON object")
	}
	if !utf8.Valid(c.Data) {
		return 0, 0, m.bad(cols, column, notUTF8)
	}
	it := memberIter{doc: c.Data}
	if !it.open() {
		return 0, 0, m.bad(cols, column, "is not a JSON object; headers must be an object such as {\"traceparent\": \"...\"}, or NULL")
	}
	for {
		k, v, str, ok := it.next()
		if !ok {
			return n, size, nil
		}
		kl, kok := unescapedLen(k)
		vl, vok := len(v), true
		if str {
			vl, vok = unescapedLen(v)
		}
		switch {
		case !kok:
			return 0, 0, m.bad(cols, column, fmt.Sprintf("has key %s with an escape that is not valid UTF-8 (a lone surrogate)", excerpt(k)))
		case !vok:
			return 0, 0, m.bad(cols, column, fmt.Sprintf("header %s has a value with an escape that is not valid UTF-8 (a lone surrogate)", excerpt(k)))
		case kl > m.maxHeader:
			return 0, 0, m.bad(cols, column, fmt.Sprintf("has a %d-byte key %s, over the %d-byte header limit (MaxHeaderBytes)", kl, excerpt(k), m.maxHeader))
		case vl > m.maxHeader:
			return 0, 0, m.bad(cols, column, fmt.Sprintf("header %s is %d bytes, over the %d-byte header limit (MaxHeaderBytes); put large data in the payload", excerpt(k), vl, m.maxHeader))
		case m.format.cloudEvents() && ceHeader(unescaped(k)):
			// A second ce_id or ce_source would let a consumer take
			// another event's identity, as a second "id" would.
			return 0, 0, m.bad(cols, column, fmt.Sprintf("has key %s, which collides with the CloudEvents attribute headers (ce_*) of the record format %s; rename the key in the row",
				excerpt(unescaped(k)), m.format))
		case m.format.cloudEvents() && !str && bytes.Equal(unescaped(k), []byte(HeaderContentType)):
			return 0, 0, m.bad(cols, column, fmt.Sprintf("has key %q with the value %s; it names the payload's media type in the CloudEvents formats and must be a string such as \"application/json\"", HeaderContentType, excerpt(v)))
		case reserved(k):
			// A second "id" header would make consumers that read one
			// header by name (Java's lastHeader) take this value for the
			// event id, and dedupe different events as one.
			return 0, 0, m.bad(cols, column, fmt.Sprintf("has key %s, a header cdc-outbox sets itself (%s); rename the key in the row",
				excerpt(appendUnescaped(nil, k)), strings.Join(contract.ReservedHeaders(), ", ")))
		}
		n++
		size += vl
	}
}

// unescaped is the JSON string content k decoded; it allocates only for
// keys with escapes.
func unescaped(k []byte) []byte {
	if bytes.IndexByte(k, '\\') >= 0 {
		return appendUnescaped(nil, k)
	}
	return k
}

func (m *Mapper) headerKey(k []byte) string {
	if bytes.IndexByte(k, '\\') >= 0 {
		k = appendUnescaped(nil, k)
	}
	return m.keys.get(k)
}

func (m *Mapper) timestamp(cols []Column, c *Column) (time.Time, error) {
	column := m.cols[m.idx[roleCreatedAt]]
	if c.TypeOID != oidTimestamptz && c.TypeOID != oidTimestamp {
		return time.Time{}, m.bad(cols, column, fmt.Sprintf("has type OID %d; created_at must be timestamptz or timestamp", c.TypeOID))
	}
	t, ok := parseTimestamp(c.Data, c.TypeOID == oidTimestamptz)
	if ok {
		// A Kafka timestamp counts milliseconds since 1970: -1 means "none",
		// the Java producer refuses negative ones, and a zero time.Time
		// would make franz-go stamp the record with the current time.
		if t.Before(unixEpoch) {
			return time.Time{}, m.bad(cols, column, fmt.Sprintf("is %s, before 1970-01-01 00:00:00 UTC, which a Kafka timestamp cannot carry; store a real time, or NULL to let the producer stamp the record", excerpt(c.Data)))
		}
		return t, nil
	}
	if s := string(c.Data); s == "infinity" || s == "-infinity" {
		return time.Time{}, m.bad(cols, column, "is "+s+", which is no time a Kafka record can carry; store a real time, or NULL to let the producer stamp the record")
	}
	kind := "timestamptz"
	if c.TypeOID == oidTimestamp {
		kind = "timestamp"
	}
	return time.Time{}, m.bad(cols, column, fmt.Sprintf("is %s, which is not PostgreSQL's ISO output of a %s; the replication connection must use DateStyle ISO", excerpt(c.Data), kind))
}

var unixEpoch = time.Unix(0, 0)
