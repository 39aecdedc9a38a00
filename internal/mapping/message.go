package mapping

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// roleMember is the envelope member of each role (package contract).
var roleMember = [numRoles]string{
	roleID:            contract.MemberID,
	roleAggregateType: contract.MemberAggregateType,
	roleAggregateID:   contract.MemberAggregateID,
	roleEventType:     contract.MemberEventType,
	rolePayload:       contract.MemberPayload,
	roleHeaders:       contract.MemberHeaders,
	roleCreatedAt:     contract.MemberCreatedAt,
}

// MapMessage fills rec from the content of an outbox message (a
// contract envelope) as Map fills it from a row of the same values: each
// member stands for its role's column, in the text form pgoutput would
// send for a text id, json payload and headers, bytea for a binary payload
// and timestamptz created_at, and Map does the rest, so topic, key, value,
// headers, timestamp and every check are the row's. cols is scratch space
// of len(Columns()). Content that is no envelope, or values a row could
// not publish either, are a *BadEventError naming the member.
func (m *Mapper) MapMessage(content []byte, cols []Column, rec *kgo.Record) error {
	if len(cols) != len(m.cols) {
		return fmt.Errorf("mapping: MapMessage got %d columns, want %d", len(cols), len(m.cols))
	}
	e, err := contract.ParseEnvelope(content)
	if err != nil {
		var ee *contract.EnvelopeError
		if errors.As(err, &ee) {
			return &BadEventError{EventID: envelopeID(content), Reason: ee.Error() + "; " + envelopeFix}
		}
		return err
	}
	for _, p := range m.topic {
		if p.name != "" && !m.isRole(p.col) {
			return &BadEventError{EventID: e.ID, Reason: fmt.Sprintf(
				"the topic template %q uses {%s}, which is no member of a message; a template for messages may use only the columns of the envelope's members (%s, %s, %s)",
				m.tmpl, p.name, m.cols[m.idx[roleAggregateType]], m.cols[m.idx[roleAggregateID]], m.cols[m.idx[roleEventType]])}
		}
	}
	for i := range cols {
		cols[i] = Column{Missing: true}
	}
	set := func(r int, data []byte, oid uint32) {
		cols[m.idx[r]] = Column{Data: data, TypeOID: oid}
	}
	// One buffer for the four texts: Map copies what the record keeps.
	buf := make([]byte, 0, len(e.ID)+len(e.AggregateType)+len(e.AggregateID)+len(e.EventType))
	for _, f := range [...]struct {
		r int
		v string
	}{{roleID, e.ID}, {roleAggregateType, e.AggregateType}, {roleAggregateID, e.AggregateID}, {roleEventType, e.EventType}} {
		n := len(buf)
		buf = append(buf, f.v...)
		set(f.r, buf[n:len(buf):len(buf)], oidText)
	}
	if e.Binary {
		set(rolePayload, hex.AppendEncode([]byte(`\x`), e.Payload), oidBytea)
	} else {
		set(rolePayload, e.Payload, oidJSON)
	}
	for _, r := range [...]int{roleHeaders, roleCreatedAt} {
		cols[m.idx[r]] = Column{Null: true}
	}
	if e.Headers != nil {
		set(roleHeaders, e.Headers, oidJSON)
	}
	if !e.CreatedAt.IsZero() {
		// PostgreSQL's ISO output of a timestamptz, which Map reads.
		set(roleCreatedAt, e.CreatedAt.UTC().AppendFormat(nil, "2006-01-02 15:04:05.999999999-07:00"), oidTimestamptz)
	}
	err = m.Map(cols, rec)
	var be *BadEventError
	if errors.As(err, &be) && be.Column != "" {
		// Name the member, not the column it stands for.
		for r := range numRoles {
			if m.cols[m.idx[r]] == be.Column {
				return &BadEventError{EventID: be.EventID, Reason: "message member " + strconv.Quote(roleMember[r]) + " " + be.Reason}
			}
		}
	}
	return err
}

// envelopeFix closes the message about content that is no envelope.
const envelopeFix = `an outbox message is pg_logical_emit_message(true, prefix, content) with content a version 1 envelope: {"v":1,"id":…,"aggregate_type":…,"aggregate_id":…,"event_type":…,"payload":…}`

// isRole reports whether column index i is one of the roles' columns.
func (m *Mapper) isRole(i int) bool {
	for _, j := range m.idx {
		if i == j {
			return true
		}
	}
	return false
}

// MessageEventID is the event id of an outbox message, "" when its content
// does not give one: for messages about a message that cannot be mapped.
func MessageEventID(content []byte) string { return envelopeID(content) }

// MessageAggregateID is the aggregate_id member of a message's content, the
// string that tells which shard streams it; ok is false when it cannot be
// read (not a string, or the content no JSON object), which makes the
// message a bad event.
func MessageAggregateID(content []byte) (id string, ok bool) {
	it := memberIter{doc: content}
	if !it.open() {
		return "", false
	}
	for {
		k, v, str, more := it.next()
		if !more {
			return "", false
		}
		if string(k) == contract.MemberAggregateID {
			if !str {
				return "", false
			}
			return string(appendUnescaped(nil, v)), true
		}
	}
}

// envelopeID is the id member of content that is not a whole envelope,
// when it can be read: the event an error names.
func envelopeID(content []byte) string {
	it := memberIter{doc: content}
	if !it.open() {
		return ""
	}
	for {
		k, v, str, ok := it.next()
		if !ok {
			return ""
		}
		if string(k) != contract.MemberID {
			continue
		}
		if l, ok := unescapedLen(v); !str || !ok || l > contract.MaxHeaderBytes {
			if !str && len(v) <= 64 {
				return string(v) // a number
			}
			return ""
		}
		return string(appendUnescaped(nil, v))
	}
}
