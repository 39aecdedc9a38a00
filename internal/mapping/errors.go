package mapping

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// BadEventError says why a row cannot be published. The caller adds the LSN
// and decides whether to fail or dead-letter.
type BadEventError struct {
	EventID string // the row's event id text, "" when it is NULL or missing
	Column  string // the column at fault, "" when it is not one column
	Reason  string // what is wrong and what to fix
}

// Error reads like `event 42: column "aggregate_id": is NULL; ...`.
func (e *BadEventError) Error() string {
	s := "event with unknown id"
	if e.EventID != "" {
		s = "event " + printable(e.EventID)
	}
	if e.Column != "" {
		s += ": column " + strconv.Quote(e.Column)
	}
	return s + ": " + e.Reason
}

// printable returns s as is when it is readable in a log line, and quoted
// (escaped, so control bytes and bad UTF-8 cannot garble the log) otherwise.
func printable(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == ' ' {
			return strconv.Quote(s)
		}
	}
	return s
}

// excerpt quotes at most 64 bytes of b for an error message, so a huge value
// does not become a huge log line.
func excerpt(b []byte) string {
	const max = 64
	if len(b) <= max {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:max])) + "..."
}
