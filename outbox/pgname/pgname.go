// Package pgname parses and quotes PostgreSQL qualified names, so that the
// outbox table's configured name means what the same text means to
// PostgreSQL.
//
// Parse follows the server's SplitIdentifierString, the parser behind
// to_regclass and the regclass type: dots separate the parts, double quotes
// keep a part as it is (dots, spaces and capitals included; "" is one
// quote), an unquoted part is folded to lower case (ASCII letters only, as
// in a UTF-8 database), white space around a part is ignored, and a part
// longer than 63 bytes is cut to 63 the way the server cuts it.
//
// It is pure: no connection, no catalog. Whether the name exists is for the
// caller to ask the server.
package pgname

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// DefaultSchema is the schema of a name given without one. It is fixed
// rather than taken from a search_path, so that the streamer and the
// services that write the outbox agree on the table whatever their roles'
// search_path says.
const DefaultSchema = "public"

// maxBytes is NAMEDATALEN - 1: the longest identifier PostgreSQL keeps.
const maxBytes = 63

// Name is a schema-qualified relation name as the catalog stores it:
// case-folded, unquoted.
type Name struct {
	Schema, Relation string
}

// ErrSyntax is wrapped by every error Parse returns.
var ErrSyntax = errors.New("invalid name syntax")

// Parse parses a relation name: relation, or schema.relation; either part
// may be double-quoted. A name without a schema is in DefaultSchema.
func Parse(s string) (Name, error) {
	parts, err := split(s)
	if err != nil {
		return Name{}, err
	}
	switch len(parts) {
	case 1:
		return Name{Schema: DefaultSchema, Relation: parts[0]}, nil
	case 2:
		return Name{Schema: parts[0], Relation: parts[1]}, nil
	}
	return Name{}, fmt.Errorf("%w: %d dot-separated parts; give table or schema.table (quote a part that contains a dot: \"my.schema\".outbox)", ErrSyntax, len(parts))
}

// split is SplitIdentifierString with '.' as separator.
func split(s string) ([]string, error) {
	parts, _, err := splitQuoted(s)
	return parts, err
}

// splitQuoted is split that also says which parts were double-quoted.
func splitQuoted(s string) (parts []string, quoted []bool, err error) {
	i := skipSpace(s, 0)
	if i == len(s) {
		return nil, nil, fmt.Errorf("%w: the name is empty", ErrSyntax)
	}
	for {
		var part string
		if s[i] == '"' {
			// Quoted: up to the next quote that is not doubled.
			var b strings.Builder
			j := i + 1
			for {
				k := strings.IndexByte(s[j:], '"')
				if k < 0 {
					return nil, nil, fmt.Errorf("%w: unterminated quoted identifier at byte %d", ErrSyntax, i)
				}
				b.WriteString(s[j : j+k])
				j += k + 1
				if j < len(s) && s[j] == '"' {
					b.WriteByte('"')
					j++
					continue
				}
				break
			}
			if b.Len() == 0 {
				return nil, nil, fmt.Errorf("%w: zero-length quoted identifier at byte %d", ErrSyntax, i)
			}
			part, i = b.String(), j
			quoted = append(quoted, true)
		} else {
			// Unquoted: up to a dot or white space, folded to lower case.
			j := i
			for j < len(s) && s[j] != '.' && !isSpace(s[j]) {
				j++
			}
			if j == i {
				return nil, nil, fmt.Errorf("%w: empty name part at byte %d", ErrSyntax, i)
			}
			part, i = lower(s[i:j]), j
			quoted = append(quoted, false)
		}
		parts = append(parts, truncate(part))
		i = skipSpace(s, i)
		if i == len(s) {
			return parts, quoted, nil
		}
		if s[i] != '.' {
			return nil, nil, fmt.Errorf("%w: unexpected %q at byte %d after a name part; quote a part that contains it", ErrSyntax, s[i], i)
		}
		i = skipSpace(s, i+1)
		if i == len(s) {
			return nil, nil, fmt.Errorf("%w: the name ends with a dot", ErrSyntax)
		}
	}
}

// isSpace is the server's scanner_isspace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// lower folds ASCII capitals only, as the server does for identifiers in a
// multibyte encoding.
func lower(s string) string {
	b := []byte(s) // bytes, not runes: a byte that is not UTF-8 stays as it is
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// truncate cuts an identifier to 63 bytes without splitting a UTF-8
// character, as the server's truncate_identifier does.
func truncate(s string) string {
	if len(s) <= maxBytes {
		return s
	}
	// s[n] is the first byte cut off; if it continues a character, the
	// character goes too. A UTF-8 character has at most 3 continuation
	// bytes; beyond that the text is not UTF-8 and is cut where it is.
	n := maxBytes
	for k := 0; k < utf8.UTFMax-1 && !utf8.RuneStart(s[n]); k++ {
		n--
	}
	if !utf8.RuneStart(s[n]) {
		n = maxBytes
	}
	return s[:n]
}

// Quote returns an identifier in double quotes, for SQL text.
func Quote(ident string) string {
	return `"` + strings.ReplaceAll(ident, `"`, `""`) + `"`
}

// Quoted is the name for SQL text: both parts quoted.
func (n Name) Quoted() string { return Quote(n.Schema) + "." + Quote(n.Relation) }

// String is the name for people and for configuration: each part quoted only
// when it must be for Parse to read it back (capitals, dots, spaces,
// quotes). It does not know SQL keywords; SQL text uses Quoted.
func (n Name) String() string { return display(n.Schema) + "." + display(n.Relation) }

func display(ident string) string {
	if ident == "" {
		return Quote(ident)
	}
	for i := 0; i < len(ident); i++ {
		c := ident[i]
		if !('a' <= c && c <= 'z' || c == '_' || c >= 0x80 || i > 0 && ('0' <= c && c <= '9' || c == '$')) {
			return Quote(ident)
		}
	}
	return ident
}
