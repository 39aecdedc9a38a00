package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// bad applies the bad-event policy to a row that cannot be published.
// Under fail the stream stops: the row's transaction never commits in the
// checkpoint, so the confirmed position stays before it and a restart after
// the fix streams it again. Under dead-letter the raw row goes to the
// dead-letter topic as part of its transaction, so the checkpoint passes it
// only once the broker has the dead-letter record.
//
// A message's dead-letter record holds its content as it came.
func (p *Pipeline) bad(ev *decoder.Event, be *BadEventError) error {
	be.Message = ev.Kind == decoder.KindMessage
	var o *outbox
	if ev.Relation != nil {
		o = p.reg.byRel[ev.Relation.ID]
	}
	if be.Table == "" && ev.Relation != nil {
		be.Table = ev.Relation.Namespace + "." + ev.Relation.Name
		if o != nil {
			be.Table = o.Table()
		}
	}
	if p.policy(o) == Fail {
		kind := KindRow
		if be.Message {
			kind = KindMessage
		}
		p.obs.Bad("failed", kind)
		if o != nil {
			o.failed.Add(1)
		}
		return be
	}
	pd := p.newPending(be.LSN, ev.Relation)
	value := func(limit int) []byte { return rawRow(ev, limit) }
	if ev.Kind == decoder.KindMessage {
		value = func(limit int) []byte { return messageContent(ev.Content, limit) }
	}
	p.deadLetterRecord(pd, be.EventID, be.LSN, p.deadLetterText(be), value)
	p.send(pd)
	return nil
}

// policy is the bad-event policy of an event of outbox o: its own, or the
// stream's (also for an event of no outbox, o nil).
func (p *Pipeline) policy(o *outbox) string {
	if o != nil && o.policy != "" {
		return o.policy
	}
	return p.cfg.OnBadEvent
}

// checkPolicy checks a bad-event policy: fail, or dead-letter with a
// dead-letter topic to write to.
func checkPolicy(policy, deadLetterTopic string) error {
	switch policy {
	case Fail:
	case DeadLetter:
		if deadLetterTopic == "" {
			return errors.New("the dead-letter policy needs a dead-letter topic")
		}
	default:
		return fmt.Errorf("unknown bad-event policy %q: use %s or %s", policy, Fail, DeadLetter)
	}
	return nil
}

// messageContent is a message's content as it came, or, when it is longer
// than limit, a JSON note of its size, as a long column value is noted.
func messageContent(content []byte, limit int) []byte {
	if len(content) > limit {
		return marshal(map[string]int{"omitted_bytes": len(content)})
	}
	return append([]byte(nil), content...)
}

// deadLetterText is DeadLetterReason with the pipeline's Explain.
func (p *Pipeline) deadLetterText(be *BadEventError) string {
	return DeadLetterReason(be.EventID, be.Err, p.explain)
}

// DeadLetterReason is the cause of bad event id as its dead-letter record's
// error header says it, `event 42: column "payload": is NULL; ...`, each
// cause rendered by explain (the command's, with what to do). Package
// republish's dead letters say it the same way.
func DeadLetterReason(id string, cause error, explain func(error) string) string {
	var me *mapping.BadEventError
	if errors.As(cause, &me) {
		return explain(me)
	}
	return (&mapping.BadEventError{EventID: id, Reason: explain(cause)}).Error()
}

// deadLetter is what a dead-letter record sets aside.
type deadLetter struct {
	id     string // event id, for the log
	reason string // the error header
}

// deadLetterRecord makes pd the dead-letter record of event id at lsn. The
// value is encoded by value(limit), where longer column values are left
// out; limit halves until the whole record, measured once encoded, fits
// Config.MaxRecordBytes (JSON escaping can make a value several times
// longer).
func (p *Pipeline) deadLetterRecord(pd *pending, id string, lsn pglogrepl.LSN, reason string, value func(limit int) []byte) {
	// The row's outbox's source; the messages' source (p.mapper's) for a
	// message or a row no outbox can be told for.
	source := p.mapper.Source()
	if pd.outbox != nil {
		source = pd.outbox.mapper.Source()
	}
	if pd.rel != nil {
		// The table as named when the row was written.
		pd.rec = DeadLetterRecord(p.cfg.DeadLetterTopic, id, lsn.String(), pd.rel.Namespace+"."+pd.rel.Name, source, reason, p.cfg.MaxRecordBytes, value)
	} else {
		// A message: its prefix instead of a table.
		pd.rec = DeadLetterRecord(p.cfg.DeadLetterTopic, id, lsn.String(), "", source, reason, p.cfg.MaxRecordBytes-len(HeaderMessagePrefix)-len(p.cfg.MessagePrefix)-8, value)
		pd.rec.Headers = append(pd.rec.Headers, kgo.RecordHeader{Key: HeaderMessagePrefix, Value: []byte(p.cfg.MessagePrefix)})
	}
	pd.size = RecordSize(&pd.rec)
	if id == "" {
		id = "(no id)"
	}
	pd.rec.Context = pd
	pd.dead = &deadLetter{id: id, reason: reason}
}

// HeaderMessagePrefix is the header of a message's dead-letter record that
// names the message's prefix, where a row's names its table.
const HeaderMessagePrefix = "message_prefix"

// DeadLetterRecord is the dead-letter record of event id: key the id,
// headers id, error, lsn (where the row was in the WAL; none when lsn is
// ""), source_table (when sourceTable is not "") and source (when source
// is not nil), and the value
// value(limit) encodes, where column values longer than limit are left
// out; limit halves until the whole record, measured once encoded, fits
// maxBytes (JSON escaping can make a value several times longer). reason
// is the error header: the cause as DeadLetterReason says it. Package
// republish makes its dead letters with it too.
func DeadLetterRecord(topic, id, lsn, sourceTable string, source []byte, reason string, maxBytes int, value func(limit int) []byte) kgo.Record {
	r := kgo.Record{Topic: topic, Key: []byte(id)}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderID, Value: []byte(id)}, kgo.RecordHeader{Key: "error", Value: []byte(reason)})
	if lsn != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "lsn", Value: []byte(lsn)})
	}
	if sourceTable != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "source_table", Value: []byte(sourceTable)})
	}
	if source != nil {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: contract.HeaderSource, Value: source})
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
	reason := p.deadLetterText(&BadEventError{EventID: id, LSN: pd.lsn, Err: &RefusedError{Topic: r.Topic, Err: err}})
	p.deadLetterRecord(pd, id, pd.lsn, reason, func(limit int) []byte { return refusedRecord(&r, limit) })
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
