package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

// bad applies the bad-event policy to a row that cannot be published.
// Under fail the stream stops: the row's transaction never commits in the
// checkpoint, so the confirmed position stays before it and a restart after
// the fix streams it again. Under dead-letter the raw row goes to the
// dead-letter topic as part of its transaction, so the checkpoint passes it
// only once the broker has the dead-letter record.
func (p *Pipeline) bad(lsn pglogrepl.LSN, ev *decoder.Event, err error) error {
	var be *mapping.BadEventError
	if !errors.As(err, &be) {
		return fmt.Errorf("map the row at LSN %s: %w", lsn, err)
	}
	id := be.EventID
	if id == "" {
		id = "(no id)"
	}
	if p.cfg.OnBadEvent == Fail {
		p.obs.Bad("failed")
		return fmt.Errorf("bad event %s at LSN %s: %s; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside",
			id, lsn, cause(be))
	}
	pd := p.newPending(lsn, ev.Relation)
	p.deadLetterRecord(pd, be.EventID, lsn, be, func(limit int) []byte { return rawRow(ev, limit) })
	p.send(pd)
	return nil
}

// deadLetter is what a dead-letter record sets aside.
type deadLetter struct {
	id     string // event id, for the log
	reason error
}

// deadLetterRecord makes pd the dead-letter record of event id at lsn. The
// value is encoded by value(limit), where longer column values are left
// out; limit halves until the whole record, measured once encoded, fits
// --max-record-bytes (JSON escaping can make a value several times longer).
func (p *Pipeline) deadLetterRecord(pd *pending, id string, lsn pglogrepl.LSN, reason error, value func(limit int) []byte) {
	// The table as named when the row was written.
	pd.rec = DeadLetterRecord(p.cfg.DeadLetterTopic, id, lsn.String(), pd.rel.Namespace+"."+pd.rel.Name, p.mapper.Source(), reason, p.cfg.MaxRecordBytes, value)
	pd.size = RecordSize(&pd.rec)
	if id == "" {
		id = "(no id)"
	}
	pd.rec.Context = pd
	pd.dead = &deadLetter{id: id, reason: reason}
}

// DeadLetterRecord is the dead-letter record of event id: key the id,
// headers id, error, lsn (where the row was in the WAL; none when lsn is
// ""), source_table and source (when source is not nil), and the value
// value(limit) encodes, where column values longer than limit are left
// out; limit halves until the whole record, measured once encoded, fits
// maxBytes (JSON escaping can make a value several times longer).
// cdc-outbox republish makes its dead letters with it too.
func DeadLetterRecord(topic, id, lsn, sourceTable string, source []byte, reason error, maxBytes int, value func(limit int) []byte) kgo.Record {
	r := kgo.Record{Topic: topic, Key: []byte(id)}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: mapping.HeaderID, Value: []byte(id)}, kgo.RecordHeader{Key: "error", Value: []byte(reason.Error())})
	if lsn != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "lsn", Value: []byte(lsn)})
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "source_table", Value: []byte(sourceTable)})
	if source != nil {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: mapping.HeaderSource, Value: source})
	}
	for limit := maxBytes; ; limit /= 2 {
		r.Value = value(limit)
		if RecordSize(&r) <= int64(maxBytes) || limit == 0 {
			return r
		}
	}
}

// refusedRecordToDeadLetter turns pd, a record the broker refused on its
// own, into its dead-letter record: the record as JSON (topic, key,
// headers, value, timestamp) and the broker's error.
func (p *Pipeline) refusedRecordToDeadLetter(pd *pending, err error) {
	r := pd.rec
	id := eventID(&r)
	reason := fmt.Errorf("event %s: Kafka refused the record for topic %q: %w%s", id, r.Topic, err, refusalHint(err))
	p.deadLetterRecord(pd, id, pd.lsn, reason, func(limit int) []byte { return refusedRecord(&r, limit) })
}

// cause is the error without the event id, which the caller's message
// already names.
func cause(be *mapping.BadEventError) string {
	if be.Column == "" {
		return be.Reason
	}
	return "column " + strconv.Quote(be.Column) + ": " + be.Reason
}

// rawRow renders every column of the row as a JSON object of column name to
// its text value (null for NULL). Values longer than limit bytes are
// replaced by a note of their size, so the dead-letter record of an
// oversize row still fits the broker.
func rawRow(ev *decoder.Event, limit int) []byte {
	names := make([]string, len(ev.Tuple))
	values := make([][]byte, len(ev.Tuple))
	for i, v := range ev.Tuple {
		names[i] = ev.Relation.Columns[i].Name
		if !v.Null() && !v.Missing() {
			values[i] = v.Data
			if values[i] == nil {
				values[i] = []byte{} // an empty value, not NULL
			}
		}
	}
	return RowJSON(names, values, limit)
}

// RowJSON renders a row as a JSON object of column name to its text value
// (null for a nil value), values longer than limit bytes replaced by a note
// of their size: the value of a dead-letter record.
func RowJSON(names []string, values [][]byte, limit int) []byte {
	row := make(map[string]any, len(names))
	for i, name := range names {
		if values[i] == nil {
			row[name] = nil
		} else {
			row[name] = within(values[i], limit)
		}
	}
	return marshal(row)
}

// refusedRecord renders a record as JSON: topic, key, headers (in order),
// value and timestamp, with values longer than limit bytes replaced by a
// note of their size.
func refusedRecord(r *kgo.Record, limit int) []byte {
	headers := make([][2]any, len(r.Headers))
	for i, h := range r.Headers {
		headers[i] = [2]any{h.Key, within(h.Value, limit)}
	}
	doc := map[string]any{"topic": r.Topic, "key": within(r.Key, limit), "headers": headers, "value": within(r.Value, limit)}
	if !r.Timestamp.IsZero() {
		doc["timestamp"] = r.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	return marshal(doc)
}

// within is b as a string, or a note of its size when it is longer than
// limit.
func within(b []byte, limit int) any {
	if len(b) > limit {
		return map[string]int{"omitted_bytes": len(b)}
	}
	return string(b)
}

// marshal encodes v as JSON without escaping <, > and & (which would take 6
// bytes each) and without a trailing newline.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps and slices of strings always encode
		panic(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// refusalHint says what to do about a record the broker refused for good.
func refusalHint(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "; the topic's max.message.bytes (or the broker's message.max.bytes) is below --max-record-bytes: lower --max-record-bytes to match, so such rows are caught as bad events before they are sent, or raise the topic's limit"
	case errors.Is(err, kerr.InvalidTimestamp):
		return "; the record's timestamp (the row's created_at) is out of the range the topic accepts (message.timestamp.before.max.ms and message.timestamp.after.max.ms): fix created_at in the row, or widen the topic's range"
	case errors.Is(err, kerr.InvalidRecord):
		return "; the broker's validation of the record failed (a compacted topic needs a key; check the broker's log for the reason)"
	case errors.Is(err, kerr.CorruptMessage):
		return "; the broker found the record batch corrupt (CRC mismatch): check the network and the broker, and --kafka-compression"
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return "; create the topic, or allow auto-creation (broker auto.create.topics.enable and --kafka-auto-create-topics); " +
			"if both allow it, the broker refused to create it (a name that differs from an existing topic's only in '.' and '_' collides with it): see the broker's log"
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "; grant the producer WRITE on the topic"
	case errors.Is(err, kerr.InvalidTopicException):
		return "; the broker does not accept this topic name (invalid, or an internal topic such as __consumer_offsets): check --topic and the row's columns it uses"
	}
	if advice := sink.Advice(err); advice != "" {
		return "; " + advice
	}
	return ""
}
