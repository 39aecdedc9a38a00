package pgname

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Name
	}{
		{"outbox", Name{"public", "outbox"}},
		{"app.outbox", Name{"app", "outbox"}},
		{"App.OutBox", Name{"app", "outbox"}},
		{`"Billing"."Outbox Events"`, Name{"Billing", "Outbox Events"}},
		{`"my.schema"."out.box"`, Name{"my.schema", "out.box"}},
		{`Billing."Outbox"`, Name{"billing", "Outbox"}},
		{`"a""b".c`, Name{`a"b`, "c"}},
		{`""""`, Name{"public", `"`}},
		{"  app . outbox  ", Name{"app", "outbox"}},
		{"\tapp.\n\"X\" ", Name{"app", "X"}},
		{"my-table", Name{"public", "my-table"}},     // as to_regclass reads it
		{"ÉVÉNEMENTS", Name{"public", "ÉvÉnements"}}, // ASCII capitals only, as in a UTF-8 database
		{strings.Repeat("a", 70), Name{"public", strings.Repeat("a", 63)}},
		{`"` + strings.Repeat("é", 40) + `"`, Name{"public", strings.Repeat("é", 31)}}, // 62 bytes: no half character
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"   ", "empty"},
		{"a.b.c", "3 dot-separated parts"},
		{"a.", "ends with a dot"},
		{".a", "empty name part at byte 0"},
		{"a..b", "empty name part at byte 2"},
		{`"abc`, "unterminated"},
		{`"a"b`, `unexpected 'b' at byte 3`},
		{`a b`, `unexpected 'b' at byte 2`},
		{`""`, "zero-length"},
		{`a.""`, "zero-length"},
	} {
		_, err := Parse(tc.in)
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): err = %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestQuoteAndString(t *testing.T) {
	for _, tc := range []struct {
		n              Name
		quoted, string string
	}{
		{Name{"public", "outbox"}, `"public"."outbox"`, "public.outbox"},
		{Name{"Billing", "Outbox Events"}, `"Billing"."Outbox Events"`, `"Billing"."Outbox Events"`},
		{Name{"my.schema", `a"b`}, `"my.schema"."a""b"`, `"my.schema"."a""b"`},
		{Name{"s1", "_t$2"}, `"s1"."_t$2"`, "s1._t$2"},
		{Name{"1s", "$t"}, `"1s"."$t"`, `"1s"."$t"`},
	} {
		if got := tc.n.Quoted(); got != tc.quoted {
			t.Errorf("%+v.Quoted() = %s, want %s", tc.n, got, tc.quoted)
		}
		if got := tc.n.String(); got != tc.string {
			t.Errorf("%+v.String() = %s, want %s", tc.n, got, tc.string)
		}
		for _, s := range []string{tc.quoted, tc.string} {
			if back, err := Parse(s); err != nil || back != tc.n {
				t.Errorf("Parse(%s) = %+v, %v; want %+v back", s, back, err, tc.n)
			}
		}
	}
}

// FuzzParse: Parse never panics; what it accepts has two non-empty parts
// of at most 63 bytes, and reads back the same through both renderings.
//
//	go test -fuzz=FuzzParse ./internal/pgname
func FuzzParse(f *testing.F) {
	for _, s := range []string{"outbox", `"Billing"."Outbox Events"`, `"a""b".c`, "a.b.c", ` x . "y" `, `"`, "a.", strings.Repeat("é", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q): error %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		for _, p := range []string{n.Schema, n.Relation} {
			if p == "" || len(p) > maxBytes {
				t.Fatalf("Parse(%q) = %+v: a part is empty or longer than %d bytes", s, n, maxBytes)
			}
		}
		for _, r := range []string{n.Quoted(), n.String()} {
			if back, err := Parse(r); err != nil || back != n {
				t.Fatalf("Parse(%q) = %+v, but Parse(%q) = %+v, %v", s, n, r, back, err)
			}
		}
	})
}
