package schema

import (
	"bytes"
	"testing"
)

func TestSubject(t *testing.T) {
	for _, c := range []struct {
		strategy      Strategy
		topic, record string
		want          string
		wantErr       bool
	}{
		{TopicName, "outbox.event.payment", "com.example.PaymentCreated", "outbox.event.payment-value", false},
		{TopicName, "outbox.event.payment", "", "outbox.event.payment-value", false},
		{RecordName, "outbox.event.payment", "com.example.PaymentCreated", "com.example.PaymentCreated", false},
		{RecordName, "outbox.event.payment", "", "", true},
		{TopicRecordName, "outbox.event.payment", "com.example.PaymentCreated", "outbox.event.payment-com.example.PaymentCreated", false},
		{TopicRecordName, "outbox.event.payment", "", "", true},
	} {
		got, err := Subject(c.strategy, c.topic, c.record)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("Subject(%s, %q, %q) = %q, %v; want %q (error: %v)", c.strategy, c.topic, c.record, got, err, c.want, c.wantErr)
		}
	}
}

func TestRecordFullName(t *testing.T) {
	for _, c := range []struct{ namespace, named, eventType, want string }{
		{"", "", "PaymentCreated", "PaymentCreated"},
		{"com.example", "", "PaymentCreated", "com.example.PaymentCreated"},
		{"com.example", "Refund", "PaymentCreated", "com.example.Refund"},
		{"com.example", "org.other.Refund", "PaymentCreated", "org.other.Refund"},
		{"com.example", "", "payments.PaymentCreated", "payments.PaymentCreated"},
		{"com.example", "", "", ""},
	} {
		if got := RecordFullName(c.namespace, c.named, c.eventType); got != c.want {
			t.Errorf("RecordFullName(%q, %q, %q) = %q, want %q", c.namespace, c.named, c.eventType, got, c.want)
		}
	}
}

func TestParseNames(t *testing.T) {
	for _, f := range []Format{Avro, Protobuf, JSONSchema} {
		if got, err := ParseFormat(f.String()); err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %v, %v", f, got, err)
		}
	}
	for _, s := range []Strategy{TopicName, RecordName, TopicRecordName} {
		if got, err := ParseStrategy(s.String()); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseFormat("xml"); err == nil {
		t.Error("ParseFormat(xml) took it")
	}
	if _, err := ParseStrategy("name"); err == nil {
		t.Error("ParseStrategy(name) took it")
	}
}

// TestWireHeader pins the bytes Confluent's deserializers read: magic byte
// 0, the id big-endian, and for Protobuf the message indexes (the first
// message as the single byte 0, another as a count and zig-zag varints).
func TestWireHeader(t *testing.T) {
	for _, c := range []struct {
		id    int
		index []int
		want  []byte
	}{
		{1, nil, []byte{0, 0, 0, 0, 1, 'x'}},
		{0x01020304, nil, []byte{0, 1, 2, 3, 4, 'x'}},
		{7, []int{0}, []byte{0, 0, 0, 0, 7, 0, 'x'}},
		{7, []int{1}, []byte{0, 0, 0, 0, 7, 2, 2, 'x'}},
		{7, []int{1, 0}, []byte{0, 0, 0, 0, 7, 4, 2, 0, 'x'}},
	} {
		got, err := appendWire(nil, c.id, c.index, []byte("x"))
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("appendWire(%d, %v) = %v, %v; want %v", c.id, c.index, got, err, c.want)
		}
	}
}
