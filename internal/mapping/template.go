package mapping

import (
	"fmt"
	"strconv"
	"strings"
)

// maxTopicLen is Kafka's limit on a topic name.
const maxTopicLen = 249

// topicPart is a literal piece of the topic template (col < 0) or a
// placeholder naming a column (col is its index in Mapper.Columns()).
type topicPart struct {
	lit  string
	name string
	col  int
}

// parseTopicTemplate splits tmpl into literal parts and {column} placeholders.
// Literals are checked here, so a template that can never render a legal
// topic fails at startup rather than on every row.
func parseTopicTemplate(tmpl string) ([]topicPart, error) {
	if tmpl == "" {
		return nil, fmt.Errorf("topic template is empty; use e.g. %q", DefaultConfig().Topic)
	}
	var parts []topicPart
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
			parts = append(parts, topicPart{name: name, col: -1})
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
				if !topicChar(lit[j]) {
					return nil, fmt.Errorf("topic template %q: character %q at offset %d is not allowed in a Kafka topic name (only a-z, A-Z, 0-9, '.', '_' and '-')", tmpl, lit[j], i+j)
				}
			}
			parts = append(parts, topicPart{lit: lit, col: -1})
			i += end
		}
	}
	n := 0
	for _, p := range parts {
		n += len(p.lit)
	}
	if n > maxTopicLen {
		return nil, fmt.Errorf("topic template %q: its literal text alone is %d bytes, over Kafka's %d-byte topic name limit", tmpl, n, maxTopicLen)
	}
	if len(parts) == 1 && parts[0].name == "" {
		if why := badTopic([]byte(tmpl)); why != "" {
			return nil, fmt.Errorf("topic template %q: %s", tmpl, why)
		}
	}
	return parts, nil
}

func topicChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// badTopic says why t is not a legal Kafka topic name, or "" when it is.
func badTopic(t []byte) string {
	switch {
	case len(t) == 0:
		return "is empty"
	case len(t) > maxTopicLen:
		return fmt.Sprintf("is %d bytes, over Kafka's %d-byte limit", len(t), maxTopicLen)
	case string(t) == "." || string(t) == "..":
		return "is " + strconv.Quote(string(t)) + ", which Kafka does not allow as a topic name"
	}
	for _, c := range t {
		if !topicChar(c) {
			return fmt.Sprintf("contains %q; Kafka topic names allow only a-z, A-Z, 0-9, '.', '_' and '-'", c)
		}
	}
	return ""
}
