// Package topic is the one definition of the Kafka topics cdc-outbox
// publishes to: the topic template (the streamer's --topic, Config.Topic of
// package outbox) and Kafka's rules for a topic name.
//
// The streamer renders the template for every row it publishes, and a row
// whose topic Kafka would refuse is a bad event there: under the default
// policy it stops the stream. Package outbox renders the same template with
// the same rules for every event it writes, so such an event is refused
// before it is committed instead.
//
// The package is pure: no I/O, nothing outside the standard library, so
// both the streamer and the libraries services import can share it.
package topic

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// MaxLen is the longest topic name Kafka accepts, in bytes.
const MaxLen = 249

// DefaultTemplate is the streamer's default topic template: one topic per
// aggregate type, "outbox.event.{aggregate_type}".
const DefaultTemplate = "outbox.event.{" + contract.ColumnAggregateType + "}"

// allowed describes ValidByte in messages.
const allowed = "a-z, A-Z, 0-9, '.', '_' and '-'"

// ValidByte reports whether c may appear in a topic name: Kafka allows
// only a-z, A-Z, 0-9, '.', '_' and '-'.
func ValidByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Error says why a name is not a legal topic name.
type Error struct {
	Name   string // the name, at most 64 bytes of it
	Reason string // e.g. `contains '/'; Kafka topic names allow only ...`
}

func (e *Error) Error() string {
	return "topic " + strconv.Quote(e.Name) + " " + e.Reason
}

// Check returns nil if name is a legal Kafka topic name, and an *Error
// saying why not otherwise. It allocates nothing for a legal name.
func Check[T ~string | ~[]byte](name T) error {
	bad := func(why string) error {
		n := string(name)
		if len(n) > 64 {
			n = n[:64]
		}
		return &Error{Name: n, Reason: why}
	}
	switch {
	case len(name) == 0:
		return bad("is empty")
	case len(name) > MaxLen:
		return bad(fmt.Sprintf("is %d bytes, over Kafka's %d-byte limit", len(name), MaxLen))
	case string(name) == "." || string(name) == "..":
		return bad("is a name Kafka does not allow")
	}
	for i := 0; i < len(name); i++ {
		if !ValidByte(name[i]) {
			return bad(fmt.Sprintf("contains %q; Kafka topic names allow only %s", name[i], allowed))
		}
	}
	return nil
}

// Part is a piece of a template: literal text or, when Column is set, a
// placeholder for that column's value.
type Part struct {
	Literal string
	Column  string
}

// Template is a parsed topic template: literal text with {column}
// placeholders, each replaced by the value of that column of the outbox
// row. It is immutable and safe for concurrent use.
type Template struct {
	text  string
	parts []Part
}

// ParseTemplate parses tmpl. Its literal text is checked here, so a
// template that can never render a legal topic is refused at once rather
// than on every row.
func ParseTemplate(tmpl string) (*Template, error) {
	if tmpl == "" {
		return nil, fmt.Errorf("topic template is empty; use e.g. %q", DefaultTemplate)
	}
	var parts []Part
	literal := 0
	for i := 0; i < len(tmpl); {
		switch c := tmpl[i]; {
		case c == '{':
			end := strings.IndexAny(tmpl[i+1:], "{}")
			if end < 0 || tmpl[i+1+end] == '{' {
				return nil, fmt.Errorf("topic template %q: unclosed '{' at offset %d; placeholders look like {aggregate_type}", tmpl, i)
			}
			name := tmpl[i+1 : i+1+end]
			if name == "" {
				return nil, fmt.Errorf("topic template %q: empty placeholder {} at offset %d; put a column name inside the braces", tmpl, i)
			}
			parts = append(parts, Part{Column: name})
			i += end + 2
		case c == '}':
			return nil, fmt.Errorf("topic template %q: unmatched '}' at offset %d; braces only enclose column names, as in {aggregate_type}", tmpl, i)
		default:
			end := strings.IndexAny(tmpl[i:], "{}")
			if end < 0 {
				end = len(tmpl) - i
			}
			lit := tmpl[i : i+end]
			for j := 0; j < len(lit); j++ {
				if !ValidByte(lit[j]) {
					return nil, fmt.Errorf("topic template %q: character %q at offset %d is not allowed in a Kafka topic name (only %s)", tmpl, lit[j], i+j, allowed)
				}
			}
			parts = append(parts, Part{Literal: lit})
			literal += len(lit)
			i += end
		}
	}
	if literal > MaxLen {
		return nil, fmt.Errorf("topic template %q: its literal text alone is %d bytes, over Kafka's %d-byte topic name limit", tmpl, literal, MaxLen)
	}
	if len(parts) == 1 && parts[0].Column == "" {
		if err := Check(tmpl); err != nil {
			return nil, fmt.Errorf("topic template %q: %s", tmpl, err.(*Error).Reason)
		}
	}
	return &Template{text: tmpl, parts: parts}, nil
}

// String returns the template as it was parsed.
func (t *Template) String() string { return t.text }

// Parts returns the template's literal text and placeholders in order. The
// caller must not modify the slice.
func (t *Template) Parts() []Part { return t.parts }

// Columns returns the columns the placeholders name, each once, in order
// of first use.
func (t *Template) Columns() []string {
	var cols []string
	for _, p := range t.parts {
		if p.Column != "" && !slices.Contains(cols, p.Column) {
			cols = append(cols, p.Column)
		}
	}
	return cols
}

// Render replaces each placeholder with value(column) and checks the
// result: the topic, or an *Error saying why Kafka would refuse it.
func (t *Template) Render(value func(column string) string) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.Column == "" {
			b.WriteString(p.Literal)
		} else {
			b.WriteString(value(p.Column))
		}
	}
	name := b.String()
	if err := Check(name); err != nil {
		return "", err
	}
	return name, nil
}
