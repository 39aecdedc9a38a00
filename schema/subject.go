package schema

import (
	"fmt"
	"strings"
)

// Format is the value format a schema describes.
type Format int

const (
	Avro Format = iota + 1
	Protobuf
	JSONSchema
)

func (f Format) String() string {
	switch f {
	case Avro:
		return "avro"
	case Protobuf:
		return "protobuf"
	case JSONSchema:
		return "json-schema"
	}
	return fmt.Sprintf("format(%d)", int(f))
}

// ParseFormat reads a format's name as String writes it.
func ParseFormat(s string) (Format, error) {
	for _, f := range []Format{Avro, Protobuf, JSONSchema} {
		if s == f.String() {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown schema format %q (avro, protobuf, json-schema)", s)
}

// Strategy is a subject naming strategy, as Confluent's serializers define
// them (io.confluent.kafka.serializers.subject).
type Strategy int

const (
	// TopicName: "<topic>-value", one schema (and its versions) per topic.
	TopicName Strategy = iota
	// RecordName: "<fully qualified record name>", the same schema for a
	// record type on every topic.
	RecordName
	// TopicRecordName: "<topic>-<fully qualified record name>", several
	// record types on one topic, each with versions of its own.
	TopicRecordName
)

func (s Strategy) String() string {
	switch s {
	case TopicName:
		return "topic"
	case RecordName:
		return "record"
	case TopicRecordName:
		return "topic-record"
	}
	return fmt.Sprintf("strategy(%d)", int(s))
}

// ParseStrategy reads a strategy's name as String writes it.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range []Strategy{TopicName, RecordName, TopicRecordName} {
		if s == st.String() {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown subject naming strategy %q (topic, record, topic-record)", s)
}

// UsesRecordName says whether the strategy's subject names the record.
func (s Strategy) UsesRecordName() bool { return s == RecordName || s == TopicRecordName }

// Subject is the subject of a record value's schema under the strategy:
// topic is the record's Kafka topic, record the fully qualified name of its
// record type (an Avro record's full name, a Protobuf message's full name),
// which the topic strategy ignores. An empty record under a strategy that
// names it is an error: the subject would be "<topic>-".
func Subject(s Strategy, topic, record string) (string, error) {
	switch s {
	case TopicName:
		return topic + "-value", nil
	case RecordName:
		if record == "" {
			return "", fmt.Errorf("the record name strategy needs a record name; the event has none")
		}
		return record, nil
	case TopicRecordName:
		if record == "" {
			return "", fmt.Errorf("the topic record name strategy needs a record name; the event has none")
		}
		return topic + "-" + record, nil
	}
	return "", fmt.Errorf("unknown subject naming strategy %d", int(s))
}

// RecordFullName is the fully qualified record name of an event: the name
// the event gives (a column), else its event type; either within namespace
// unless it already holds a dot (is qualified) or namespace is empty.
func RecordFullName(namespace, named, eventType string) string {
	name := named
	if name == "" {
		name = eventType
	}
	if name == "" || namespace == "" || strings.Contains(name, ".") {
		return name
	}
	return namespace + "." + name
}
