package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// The provider's one promise: a key is charged at most once, whatever the
// caller repeats, and a decline is repeated as a decline.
func TestChargeOncePerKey(t *testing.T) {
	p := New(5000)
	srv := httptest.NewServer(p)
	defer srv.Close()
	c := &Client{BaseURL: srv.URL}
	ctx := context.Background()
	req := ChargeRequest{Account: "acct-1", Amount: 1200, Currency: "EUR", Reference: "pay_1"}

	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Go(func() {
			ch, err := c.Charge(ctx, "key-1", req)
			if err != nil {
				t.Error(err)
			}
			ids[i] = ch.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("one key, several charges: %v", ids)
		}
	}
	if p.Charges() != 1 || p.Replays() != 19 {
		t.Fatalf("charges=%d replays=%d, want 1 and 19", p.Charges(), p.Replays())
	}

	// The same key for another request is refused, not answered with the
	// first charge.
	other := req
	other.Amount = 1300
	if _, err := c.Charge(ctx, "key-1", other); err == nil || !strings.Contains(err.Error(), "422") {
		t.Fatalf("reused key: %v, want a 422", err)
	}

	// A decline is final and repeated; it is not a charge.
	big := req
	big.Amount = 6000
	for range 2 {
		_, err := c.Charge(ctx, "key-2", big)
		var d *DeclinedError
		if !errors.As(err, &d) {
			t.Fatalf("over the limit: %v, want a *DeclinedError", err)
		}
	}
	if p.Charges() != 1 {
		t.Fatalf("charges=%d after declines, want 1", p.Charges())
	}

	// No key, no charge.
	resp, err := http.Post(srv.URL+"/charges", "application/json", strings.NewReader(`{"account":"a","amount":1,"currency":"EUR"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("without a key: %s, want 400", resp.Status)
	}
}
