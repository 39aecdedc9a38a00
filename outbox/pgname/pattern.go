package pgname

import (
	"fmt"
	"strings"
)

// Pattern is a relation name whose unquoted parts may hold "*", which stands
// for any run of characters (none included): "*.outbox", "tenant_*.outbox".
// A quoted part is literal, a "*" in it too, as PostgreSQL reads it. A
// pattern without any "*" names one table, as Parse does.
type Pattern struct {
	Schema, Relation Part
}

// Part is one part of a Pattern: the text as the catalog would store it
// (unquoted text folded to lower case), and whether its "*" are wildcards.
type Part struct {
	Text string
	Glob bool // an unquoted part holding "*"
}

// ParsePattern parses one pattern: relation, or schema.relation, with the
// syntax of Parse. A pattern without a schema is in DefaultSchema.
func ParsePattern(s string) (Pattern, error) {
	parts, quoted, err := splitQuoted(s)
	if err != nil {
		return Pattern{}, err
	}
	part := func(i int) Part {
		return Part{Text: parts[i], Glob: !quoted[i] && strings.Contains(parts[i], "*")}
	}
	switch len(parts) {
	case 1:
		return Pattern{Schema: Part{Text: DefaultSchema}, Relation: part(0)}, nil
	case 2:
		return Pattern{Schema: part(0), Relation: part(1)}, nil
	}
	return Pattern{}, fmt.Errorf("%w: %d dot-separated parts; give table or schema.table (quote a part that contains a dot: \"my.schema\".outbox)", ErrSyntax, len(parts))
}

// ParseList parses a comma-separated list of patterns
// ("svc_a.outbox, svc_b.events", "*.outbox"). A comma inside double quotes
// belongs to the name. Each error names the item it is about.
func ParseList(s string) ([]Pattern, error) {
	var out []Pattern
	for _, item := range splitList(s) {
		p, err := ParsePattern(item)
		if err != nil {
			if strings.TrimSpace(item) == "" {
				return nil, fmt.Errorf("%w: an empty item in the list", ErrSyntax)
			}
			return nil, fmt.Errorf("%q: %w", strings.TrimSpace(item), err)
		}
		out = append(out, p)
	}
	return out, nil
}

// splitList splits s at the commas outside double quotes.
func splitList(s string) []string {
	var items []string
	quoted := false
	start := 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			quoted = !quoted // a doubled quote toggles twice
		case s[i] == ',' && !quoted:
			items = append(items, s[start:i])
			start = i + 1
		}
	}
	return append(items, s[start:])
}

// IsGlob reports whether p may match more than one name.
func (p Pattern) IsGlob() bool { return p.Schema.Glob || p.Relation.Glob }

// Name is the one name a pattern without wildcards names.
func (p Pattern) Name() Name { return Name{Schema: p.Schema.Text, Relation: p.Relation.Text} }

// Match reports whether n is a name p stands for.
func (p Pattern) Match(n Name) bool { return p.Schema.match(n.Schema) && p.Relation.match(n.Relation) }

func (q Part) match(s string) bool {
	if !q.Glob {
		return q.Text == s
	}
	return glob(q.Text, s)
}

// glob matches s against pattern, in which "*" is any run of bytes: the
// greedy two-pointer match, linear in practice for the short names at hand.
func glob(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// String shows p as it would be written: a part quoted where it must be,
// a wildcard part as it is.
func (p Pattern) String() string { return p.Schema.String() + "." + p.Relation.String() }

func (q Part) String() string {
	if q.Glob {
		return q.Text
	}
	return display(q.Text)
}
