package idempotency

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	a := DeriveKey("order-7", "charge")
	if a != DeriveKey("order-7", "charge") {
		t.Fatal("DeriveKey is not stable")
	}
	// A fixed value (checked with Python hashlib): changing the derivation would change every key already
	// sent to providers, so it must stay this.
	if want := "60ad3136-0807-8dff-9af5-4df446cc7b4b"; a != want {
		t.Errorf("DeriveKey(order-7, charge) = %s, want %s", a, want)
	}
	seen := map[string]string{}
	for _, in := range [][2]string{
		{"order-7", "charge"}, {"order-7", "refund"}, {"order-8", "charge"},
		{"order-7charge", ""}, {"order-7", "charge\x00"}, {"\x00", ""},
	} {
		k := DeriveKey(in[0], in[1])
		if !uuidRE.MatchString(k) {
			t.Errorf("DeriveKey(%q, %q) = %q: not a version 8 UUID", in[0], in[1], k)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("DeriveKey(%q, %q) = DeriveKey of %s", in[0], in[1], prev)
		}
		seen[k] = in[0] + "/" + in[1]
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []string
		want string
		ok   bool
	}{
		{[]string{"abc-123"}, "abc-123", true},
		{[]string{` "8e03978e-40d5-43e8-bc93-6894a57f9324" `}, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{[]string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), true},
		{[]string{strings.Repeat("k", 256)}, "", false},
		{[]string{""}, "", false},
		{[]string{`""`}, "", false},
		{[]string{"a b"}, "", false},
		{[]string{"é"}, "", false},
		{[]string{"a", "b"}, "", false},
	} {
		got, ok := parseKey(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseKey(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRequestHash(t *testing.T) {
	t.Parallel()
	h := func(method, target, body string) string {
		return string(requestHash(httptest.NewRequest(method, target, nil), []byte(body)))
	}
	base := h("POST", "/orders?x=1", `{"a":1}`)
	if base != h("POST", "/orders?x=1", `{"a":1}`) {
		t.Fatal("requestHash is not stable")
	}
	for _, other := range []string{
		h("PUT", "/orders?x=1", `{"a":1}`),
		h("POST", "/orders?x=2", `{"a":1}`),
		h("POST", "/orders", `{"a":1}`),
		h("POST", "/orders2?x=1", `{"a":1}`),
		h("POST", "/orders?x=1", `{"a":2}`),
		h("POST", "/orders?x=1", ``),
	} {
		if other == base {
			t.Error("two different requests hash alike")
		}
	}
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	r.Header().Set("Location", "/a")
	r.WriteHeader(http.StatusEarlyHints) // informational: not the status
	r.WriteHeader(http.StatusCreated)
	r.Header().Set("X-Late", "ignored, as net/http does")
	r.WriteHeader(http.StatusTeapot)
	_, _ = r.Write([]byte("<html>hi</html>"))
	got := r.result()
	if got.code != http.StatusCreated || got.headers.Get("Location") != "/a" || got.headers.Get("X-Late") != "" ||
		got.headers.Get("Content-Type") != "text/html; charset=utf-8" || !bytes.Equal(got.body, []byte("<html>hi</html>")) {
		t.Errorf("result = %+v", got)
	}
	kept := keep(got.headers, []string{"Content-Type", "X-Missing"})
	if len(kept) != 1 || kept.Get("Content-Type") == "" {
		t.Errorf("keep = %v", kept)
	}

	empty := newRecorder().result()
	if empty.code != http.StatusOK || len(empty.body) != 0 || empty.headers.Get("Content-Type") != "" {
		t.Errorf("handler that wrote nothing: %+v, want 200, no body, no Content-Type", empty)
	}
}

func TestDeriveKeyRefusesEmptyParent(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error(`DeriveKey("", "charge") did not panic: every caller would share one key`)
		}
	}()
	DeriveKey(RequestKey(context.Background()), "charge") // outside a request: ""
}
