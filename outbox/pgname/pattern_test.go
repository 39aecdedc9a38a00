package pgname

import (
	"errors"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	ps, err := ParseList(`svc_a.outbox, svc_b.Events,*.outbox,tenant_*.outbox,"a,b"."x*"`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	want := []string{"svc_a.outbox", "svc_b.events", "*.outbox", "tenant_*.outbox", `"a,b"."x*"`}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Fatalf("parsed %q, want %q", got, want)
	}
	if ps[0].IsGlob() || !ps[2].IsGlob() || ps[4].IsGlob() {
		t.Errorf("IsGlob: %v %v %v", ps[0].IsGlob(), ps[2].IsGlob(), ps[4].IsGlob())
	}
	if n := ps[4].Name(); n.Schema != "a,b" || n.Relation != "x*" {
		t.Errorf("a quoted part is literal, its * too: %#v", n)
	}
	for _, bad := range []string{"a.b,", ",a", "a.b.c,d", `"unterminated, x`} {
		if _, err := ParseList(bad); !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseList(%q) = %v, want ErrSyntax", bad, err)
		}
	}
	if _, err := ParseList("a.b.c"); err == nil || !strings.Contains(err.Error(), `"a.b.c"`) {
		t.Errorf("the error names the item: %v", err)
	}
}

func TestPatternMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		name    Name
		want    bool
	}{
		{"*.outbox", Name{"tenant_1", "outbox"}, true},
		{"*.outbox", Name{"public", "outbox"}, true},
		{"*.outbox", Name{"public", "outbox_2026"}, false},
		{"tenant_*.outbox", Name{"tenant_", "outbox"}, true},
		{"tenant_*.outbox", Name{"tenant_acme", "outbox"}, true},
		{"tenant_*.outbox", Name{"svc", "outbox"}, false},
		{"Tenant_*.outbox", Name{"tenant_a", "outbox"}, true}, // folded like any unquoted part
		{`"Tenant_*".outbox`, Name{"Tenant_a", "outbox"}, false},
		{`"Tenant_*".outbox`, Name{"Tenant_*", "outbox"}, true},
		{"outbox", Name{"public", "outbox"}, true},
		{"outbox", Name{"other", "outbox"}, false},
		{"s.*_events_*", Name{"s", "order_events_2026"}, true},
		{"s.*_events_*", Name{"s", "order_events"}, false},
		{"s.a*a*a", Name{"s", "aaaa"}, true},
		{"s.a*a*a", Name{"s", "aab"}, false},
		{"*.*", Name{"x", "y"}, true},
	} {
		p, err := ParsePattern(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Match(tc.name); got != tc.want {
			t.Errorf("%s matches %s: %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}
