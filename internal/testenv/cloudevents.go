package testenv

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/twmb/franz-go/pkg/kgo"
)

// CloudEvent decodes r with the CloudEvents Go SDK, as its Kafka protocol
// binding reads a record, and validates the event: the SDK, not the
// streamer, judges what the streamer wrote. The SDK's own Kafka bindings
// are tied to other Kafka clients (sarama, confluent-kafka-go), so this is
// the binding's record reading (header names in lower case, content-type
// picking the structured format, ce_* attributes otherwise) over a franz-go
// record, and the SDK does the rest.
func CloudEvent(r *kgo.Record) (*event.Event, error) {
	m := &ceMessage{value: r.Value, headers: make(map[string][]byte, len(r.Headers))}
	for _, h := range r.Headers {
		m.headers[strings.ToLower(h.Key)] = h.Value
	}
	m.contentType = string(m.headers["content-type"])
	if f := format.Lookup(m.contentType); f != nil {
		m.format = f
	} else if v := ceSpecs.Version(string(m.headers[ceSpecs.PrefixedSpecVersionName()])); v != nil {
		m.version = v
	}
	if m.format == nil && m.version == nil {
		return nil, fmt.Errorf("record is neither a structured nor a binary CloudEvent (content-type %q, no ce_specversion)", m.contentType)
	}
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return nil, err
	}
	if err := ev.Validate(); err != nil {
		return nil, err
	}
	return ev, nil
}

var ceSpecs = spec.WithPrefix("ce_")

type ceMessage struct {
	value       []byte
	contentType string
	headers     map[string][]byte
	format      format.Format
	version     spec.Version
}

func (m *ceMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *ceMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.value))
}

func (m *ceMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.headers {
		var err error
		switch {
		case strings.HasPrefix(k, "ce_"):
			if attr := m.version.Attribute(k); attr != nil {
				err = w.SetAttribute(attr, string(v))
			} else {
				err = w.SetExtension(strings.TrimPrefix(k, "ce_"), string(v))
			}
		case k == "content-type":
			err = w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), string(v))
		}
		if err != nil {
			return err
		}
	}
	if m.value != nil {
		return w.SetData(bytes.NewReader(m.value))
	}
	return nil
}

// GetAttribute and GetExtension read the binary-mode metadata, as the
// binding's message does.
func (m *ceMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.contentType
	}
	if v, ok := m.headers[attr.PrefixedName()]; ok {
		return attr, string(v)
	}
	return attr, nil
}

func (m *ceMessage) GetExtension(name string) any {
	if v, ok := m.headers["ce_"+name]; ok {
		return string(v)
	}
	return nil
}

func (m *ceMessage) Finish(error) error { return nil }
