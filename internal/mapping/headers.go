package mapping

import (
	"unicode/utf16"
	"unicode/utf8"
)

// memberIter walks the top-level members of a JSON object without decoding
// it: a json.Decoder costs several allocations per member, this costs none.
// It relies on the document being valid JSON (checked by json.Valid, or by
// PostgreSQL for json and jsonb columns), so it only has to find
// boundaries, never to diagnose syntax; on other input it stops early and
// never panics.
type memberIter struct {
	doc []byte
	pos int
}

// open reports whether the document is an object, positioning the iterator
// at its first member.
func (it *memberIter) open() bool {
	it.pos = skipSpace(it.doc, 0)
	if it.pos >= len(it.doc) || it.doc[it.pos] != '{' {
		return false
	}
	it.pos++
	return true
}

// next returns the next member: key is the key's string content (still
// escaped, without quotes); val is a string's content (escaped, without
// quotes) when str is true, and the value's JSON text otherwise.
func (it *memberIter) next() (key, val []byte, str, ok bool) {
	d := it.doc
	i := skipSpace(d, it.pos)
	if i < len(d) && d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	if i >= len(d) || d[i] != '"' {
		return nil, nil, false, false // '}' or, on invalid input, anything else
	}
	end := skipString(d, i)
	key = d[i+1 : max(end-1, i+1)]
	i = skipSpace(d, end)
	if i >= len(d) || d[i] != ':' {
		return nil, nil, false, false
	}
	i = skipSpace(d, i+1)
	if i >= len(d) {
		return nil, nil, false, false
	}
	if d[i] == '"' {
		end = skipString(d, i)
		val, str = d[i+1:max(end-1, i+1)], true
	} else {
		end = skipValue(d, i)
		val = d[i:end]
	}
	it.pos = end
	return key, val, str, true
}

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at d[i] == '"'.
func skipString(d []byte, i int) int {
	for i++; i < len(d); i++ {
		switch d[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(d)
}

// skipValue returns the index just past the non-string value at d[i]: a
// number or literal ends at a delimiter, an array or object at its matching
// bracket (brackets inside strings do not count).
func skipValue(d []byte, i int) int {
	depth := 0
	for ; i < len(d); i++ {
		switch d[i] {
		case '"':
			i = skipString(d, i) - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
	}
	return len(d)
}

// unescapedLen is the byte length of the JSON string content s once decoded.
// It reports false for an escape with no UTF-8 form (a lone surrogate) or a
// malformed one: publishing U+FFFD instead, as encoding/json would, would
// alter the value.
func unescapedLen(s []byte) (int, bool) {
	n := 0
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			n++
			i++
			continue
		}
		r, w := decodeEscape(s, i)
		if w == 0 {
			return 0, false
		}
		n += utf8.RuneLen(r)
		i += w
	}
	return n, true
}

// appendUnescaped appends the decoded JSON string content s to dst; s must
// have passed unescapedLen.
func appendUnescaped(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] != '\\' {
			j++
		}
		dst = append(dst, s[i:j]...)
		if i = j; i == len(s) {
			break
		}
		r, w := decodeEscape(s, i)
		if w == 0 {
			break
		}
		dst = utf8.AppendRune(dst, r)
		i += w
	}
	return dst
}

// decodeEscape decodes the escape at s[i] == '\\', returning the rune and the
// escape's width in bytes, or width 0 when it is malformed or a lone surrogate.
func decodeEscape(s []byte, i int) (rune, int) {
	if i+1 >= len(s) {
		return 0, 0
	}
	switch c := s[i+1]; c {
	case '"', '\\', '/':
		return rune(c), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r := hex4(s, i+2)
		if r < 0 {
			return 0, 0
		}
		if !utf16.IsSurrogate(r) {
			return r, 6
		}
		if r >= 0xDC00 || i+7 >= len(s) || s[i+6] != '\\' || s[i+7] != 'u' {
			return 0, 0 // a low surrogate first, or a high one alone
		}
		lo := hex4(s, i+8)
		if lo < 0xDC00 || lo > 0xDFFF {
			return 0, 0
		}
		return utf16.DecodeRune(r, lo), 12
	}
	return 0, 0
}

// hex4 decodes the four hex digits at s[i:], or returns -1.
func hex4(s []byte, i int) rune {
	if i+4 > len(s) {
		return -1
	}
	var r rune
	for _, c := range s[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
