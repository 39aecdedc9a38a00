package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

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
	pd := p.newPending(lsn)
	pd.rec.Topic = p.cfg.DeadLetterTopic
	pd.rec.Key = []byte(id)
	pd.rec.Value = rawRow(ev, p.cfg.MaxRecordBytes/2)
	pd.rec.Headers = []kgo.RecordHeader{
		{Key: "id", Value: []byte(be.EventID)},
		{Key: "error", Value: []byte(be.Error())},
		{Key: "lsn", Value: []byte(lsn.String())},
		{Key: "source_table", Value: []byte(ev.Relation.Namespace + "." + ev.Relation.Name)}, // as named when the row was written
	}
	p.obs.Bad("dead_lettered")
	p.log.Warn("bad event sent to the dead-letter topic", "event_id", id, "lsn", lsn, "topic", p.cfg.DeadLetterTopic, "error", be)
	p.send(pd)
	return nil
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
// its text value (null for NULL). Values longer than limit are replaced by
// a note of their size, so the dead-letter record of an oversize row still
// fits the broker.
func rawRow(ev *decoder.Event, limit int) []byte {
	row := make(map[string]any, len(ev.Tuple))
	for i, v := range ev.Tuple {
		name := ev.Relation.Columns[i].Name
		switch {
		case v.Null(), v.Missing():
			row[name] = nil
		case len(v.Data) > limit:
			row[name] = map[string]int{"omitted_bytes": len(v.Data)}
		default:
			row[name] = string(v.Data)
		}
	}
	b, err := json.Marshal(row)
	if err != nil { // maps of strings always marshal
		panic(err)
	}
	return b
}

// refusalHint says what to do about a record the broker refused for good.
func refusalHint(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "; the broker's (or topic's) max.message.bytes is below --max-record-bytes: lower --max-record-bytes to match, so such rows are caught as bad events before they are sent"
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return "; create the topic, or allow auto-creation (broker auto.create.topics.enable and --kafka-auto-create-topics)"
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "; grant the producer WRITE on the topic"
	case errors.Is(err, kerr.InvalidTopicException):
		return "; the topic name is not valid for this broker: check --topic"
	case errors.Is(err, kgo.ErrClientClosed):
		return "; the producer was closed before the broker acknowledged it"
	}
	if advice := sink.Advice(err); advice != "" {
		return "; " + advice
	}
	return ""
}
