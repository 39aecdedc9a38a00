package contract_test

import (
	"slices"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// TestReserved: every header the streamer sets is reserved, as a string or
// as bytes, and nothing else is; the list handed out cannot change the
// contract.
func TestReserved(t *testing.T) {
	for _, h := range []string{contract.HeaderID, contract.HeaderEventType, contract.HeaderAggregateType, contract.HeaderSource} {
		if !contract.Reserved(h) || !contract.Reserved([]byte(h)) || !slices.Contains(contract.ReservedHeaders(), h) {
			t.Errorf("header %q is not reserved", h)
		}
	}
	for _, k := range []string{"", "traceparent", "ID", "id ", "sources"} {
		if contract.Reserved(k) {
			t.Errorf("header %q is reserved", k)
		}
	}
	contract.ReservedHeaders()[0] = "changed"
	if !contract.Reserved(contract.HeaderID) {
		t.Error("changing the returned list changed the contract")
	}
	if n := testing.AllocsPerRun(100, func() { contract.Reserved([]byte("traceparent")) }); n != 0 {
		t.Errorf("Reserved allocates %v times", n)
	}
}
