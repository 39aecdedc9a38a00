package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// TestLostEventsValidation: lost-events needs the topics to read, and an
// epoch's number if one is given; the flags come with their variables.
func TestLostEventsValidation(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--topics is empty"},
		{[]string{"--topics", " , "}, "--topics is empty"},
		{[]string{"--topics", "payment", "--epoch", "-1"}, "--epoch -1: give an epoch's number"},
		{[]string{"--topics", "payment", "--checkpoint-topic", ""}, "--checkpoint-topic is empty"},
		{[]string{"--topics", "payment", "--table", "a,b"}, "name one table here"},
	} {
		var out, errOut bytes.Buffer
		code := cli(append([]string{"lost-events", "--postgres-url", "postgres://u@h/db"}, c.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("lost-events %v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut.String(), c.want)
		}
	}
	var out bytes.Buffer
	if code := cli([]string{"lost-events", "--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "CDC_OUTBOX_TOPICS") {
		t.Errorf("lost-events --help: exit %d, want 0 and the flags with their variables:\n%s", code, out.String())
	}
}

// TestDigestTellsEventsApart: two copies of one event (another
// traceparent, another timestamp) have one digest; another key, value or
// event type is another event, as is a value that only moves bytes
// between key and value.
func TestDigestTellsEventsApart(t *testing.T) {
	rec := func(key, value, eventType, traceparent string) *kgo.Record {
		return &kgo.Record{Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte("7")}, {Key: "event_type", Value: []byte(eventType)}, {Key: "traceparent", Value: []byte(traceparent)}}}
	}
	d := func(r *kgo.Record) [32]byte { return digest(r, recordHeader(r, "event_type")) }
	a := d(rec("c1", `{"n":1}`, "PaymentCreated", "00-a-b-01"))
	if b := d(rec("c1", `{"n":1}`, "PaymentCreated", "00-c-d-01")); a != b {
		t.Error("two copies of one event have different digests")
	}
	for name, r := range map[string]*kgo.Record{
		"key":        rec("c2", `{"n":1}`, "PaymentCreated", ""),
		"value":      rec("c1", `{"n":2}`, "PaymentCreated", ""),
		"event type": rec("c1", `{"n":1}`, "PaymentRefunded", ""),
		"boundary":   rec("c1{", `"n":1}`, "PaymentCreated", ""),
	} {
		if d(r) == a {
			t.Errorf("another %s has the same digest", name)
		}
	}
}

// TestJudgeLost: in a partition, the first copy of the newest event the
// table still holds bounds the shared history: older records whose rows
// were deleted (a cleaned table) are not lost, and a repeat of a shared
// event after the lost ones does not move the bound. Past it, a record
// with no row, or whose row is another event, is lost. A partition with no
// shared event has no bound: its records are listed, marked unbounded,
// unless older than since.
func TestJudgeLost(t *testing.T) {
	sum := func(s string) [sha256.Size]byte { return sha256.Sum256([]byte(s)) }
	at := func(min int) time.Time { return time.Date(2026, 12, 1, 12, min, 0, 0, time.UTC) }
	rec := func(topic string, offset int64, id, content string, min int) sourceRecord {
		return sourceRecord{Topic: topic, Offset: offset, ID: id, sum: sum(content), Timestamp: at(min)}
	}
	records := []sourceRecord{
		rec("a", 0, "1", "e1", 0), // cleaned: no row
		rec("a", 1, "2", "e2", 1), // cleaned
		rec("a", 2, "3", "e3", 2), // shared: the table holds it
		rec("a", 3, "4", "e4", 3), // cleaned, but before a shared one
		rec("a", 4, "5", "e5", 4), // shared: the bound
		rec("a", 5, "6", "lost6", 5),
		rec("a", 6, "7", "lost7", 6), // the table's 7 is another event
		rec("a", 7, "5", "e5", 7),    // a repeat of 5 after a restart
		rec("a", 8, "6", "lost6", 8), // a repeat of a lost event
		rec("b", 0, "8", "e8", 0),    // no shared event in b
		rec("b", 1, "9", "lost9", 9),
	}
	rows := map[string][sha256.Size]byte{"3": sum("e3"), "5": sum("e5"), "7": sum("new7")}
	describe := func(v lostVerdict) string {
		var out []string
		for _, l := range v.lost {
			out = append(out, fmt.Sprintf("%s@%d:%s:unbounded=%v", l.record.Topic, l.record.Offset, l.record.ID, l.unbounded))
		}
		return strings.Join(out, " ")
	}
	v := judgeLost(records, rows, time.Time{})
	want := "a@5:6:unbounded=false a@6:7:unbounded=false a@8:6:unbounded=false b@0:8:unbounded=true b@1:9:unbounded=true"
	if got := describe(v); got != want || v.shared != 5 || v.unbounded != 2 || len(v.unboundedParts) != 1 {
		t.Errorf("judgeLost:\n got %s (shared %d, unbounded %d %v)\nwant %s (shared 5, unbounded 2 [b/0])", got, v.shared, v.unbounded, v.unboundedParts, want)
	}
	if !strings.Contains(v.lost[1].why, "another event") || !strings.Contains(v.lost[0].why, "no row") {
		t.Errorf("why: %q, %q", v.lost[0].why, v.lost[1].why)
	}
	v = judgeLost(records, rows, at(5))
	want = "a@5:6:unbounded=false a@6:7:unbounded=false a@8:6:unbounded=false b@1:9:unbounded=true"
	if got := describe(v); got != want || v.beforeSince != 1 {
		t.Errorf("judgeLost since 12:05:\n got %s (before since %d)\nwant %s (before since 1)", got, v.beforeSince, want)
	}
}

// TestLostEventsFormatMismatch: records of another format than
// --record-format are an error naming the record and the fix, never a
// list of every record as lost.
func TestLostEventsFormatMismatch(t *testing.T) {
	records := []sourceRecord{{Topic: "payment", Partition: 0, Offset: 7, ID: "42", Format: mapping.FormatCloudEventsBinary}}
	err := sameFormat(records, mapping.FormatNative)
	if err == nil || !strings.Contains(err.Error(), "payment/0@7 (event id 42) is cloudevents-binary") || !strings.Contains(err.Error(), "give --record-format cloudevents-binary") {
		t.Errorf("sameFormat: %v", err)
	}
	if err := sameFormat(records, mapping.FormatCloudEventsBinary); err != nil {
		t.Errorf("sameFormat of the same format: %v", err)
	}
}

// recordHeader is the value of a record's header key, "" when absent.
func recordHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
