package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
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
	a := digest(rec("c1", `{"n":1}`, "PaymentCreated", "00-a-b-01"))
	if b := digest(rec("c1", `{"n":1}`, "PaymentCreated", "00-c-d-01")); a != b {
		t.Error("two copies of one event have different digests")
	}
	for name, r := range map[string]*kgo.Record{
		"key":        rec("c2", `{"n":1}`, "PaymentCreated", ""),
		"value":      rec("c1", `{"n":2}`, "PaymentCreated", ""),
		"event type": rec("c1", `{"n":1}`, "PaymentRefunded", ""),
		"boundary":   rec("c1{", `"n":1}`, "PaymentCreated", ""),
	} {
		if digest(r) == a {
			t.Errorf("another %s has the same digest", name)
		}
	}
}
