package topic

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, want string // want: "" for legal, else a substring of the error
	}{
		{"outbox.event.payment", ""},
		{"A-Z_a-z.0-9", ""},
		{strings.Repeat("x", MaxLen), ""},
		{"", "is empty"},
		{".", "does not allow"},
		{"..", "does not allow"},
		{"...", ""},
		{strings.Repeat("x", MaxLen+1), "is 250 bytes, over Kafka's 249-byte limit"},
		{"payments/eu", `contains '/'`},
		{"payment refund", `contains ' '`},
		{"paymént", "allow only a-z, A-Z, 0-9"},
		{"a\x00b", `contains '\x00'`},
	} {
		for _, err := range []error{Check(tc.name), Check([]byte(tc.name))} {
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check(%q) = %v, want nil", tc.name, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Check(%q) = %v, want an error containing %q", tc.name, err, tc.want)
			case tc.want != "":
				var te *Error
				if !errors.As(err, &te) || len(te.Name) > 64 || !strings.HasPrefix(tc.name, te.Name) {
					t.Errorf("Check(%q): %#v, want an *Error naming (the start of) the name", tc.name, err)
				}
			}
		}
	}
}

// A legal name costs no allocation: the streamer checks one per record.
func TestCheckAllocs(t *testing.T) {
	b := []byte("outbox.event.payment")
	if n := testing.AllocsPerRun(100, func() { _ = Check(b) }); n != 0 {
		t.Errorf("Check allocates %v times per legal name, want 0", n)
	}
}

func TestParseTemplate(t *testing.T) {
	for _, tc := range []struct {
		tmpl  string
		parts []Part
		err   string
	}{
		{tmpl: DefaultTemplate, parts: []Part{{Literal: "outbox.event."}, {Column: "aggregate_type"}}},
		{tmpl: "events", parts: []Part{{Literal: "events"}}},
		{tmpl: "{tenant}.{aggregate_type}-v1", parts: []Part{{Column: "tenant"}, {Literal: "."}, {Column: "aggregate_type"}, {Literal: "-v1"}}},
		{tmpl: ".{x}", parts: []Part{{Literal: "."}, {Column: "x"}}},
		{tmpl: "", err: "topic template is empty"},
		{tmpl: "outbox.{aggregate_type", err: `unclosed '{' at offset 7`},
		{tmpl: "a{b{c}}", err: `unclosed '{' at offset 1`},
		{tmpl: "a}b", err: `unmatched '}' at offset 1`},
		{tmpl: "a.{}", err: `empty placeholder {} at offset 2`},
		{tmpl: "outbox event.{aggregate_type}", err: `character ' ' at offset 6`},
		{tmpl: strings.Repeat("a", 250), err: "over Kafka's 249-byte"},
		{tmpl: ".", err: "does not allow"},
		{tmpl: "..", err: "does not allow"},
	} {
		tt, err := ParseTemplate(tc.tmpl)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseTemplate(%q) = %v, want an error containing %q", tc.tmpl, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseTemplate(%q): %v", tc.tmpl, err)
			continue
		}
		if got := tt.Parts(); len(got) != len(tc.parts) {
			t.Errorf("ParseTemplate(%q) parts %q, want %q", tc.tmpl, got, tc.parts)
		} else {
			for i := range got {
				if got[i] != tc.parts[i] {
					t.Errorf("ParseTemplate(%q) part %d = %+v, want %+v", tc.tmpl, i, got[i], tc.parts[i])
				}
			}
		}
		if tt.String() != tc.tmpl {
			t.Errorf("String() = %q, want %q", tt.String(), tc.tmpl)
		}
	}
}

func TestRender(t *testing.T) {
	tt, err := ParseTemplate("{tenant}.{aggregate_type}.{tenant}")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tt.Columns(), ","); got != "tenant,aggregate_type" {
		t.Errorf("Columns() = %s", got)
	}
	values := map[string]string{"tenant": "acme", "aggregate_type": "order"}
	if got, err := tt.Render(func(c string) string { return values[c] }); err != nil || got != "acme.order.acme" {
		t.Errorf("Render = %q, %v", got, err)
	}
	values["aggregate_type"] = "order/line"
	var te *Error
	if _, err := tt.Render(func(c string) string { return values[c] }); !errors.As(err, &te) || te.Name != "acme.order/line.acme" {
		t.Errorf("Render with a bad value = %v, want an *Error for the rendered name", err)
	}
}
