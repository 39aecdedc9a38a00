package replication

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestWALLost: the server's errors for a slot whose WAL is gone are told
// apart from other errors with the same SQLSTATE, and the explanation
// keeps the server's detail.
func TestWALLost(t *testing.T) {
	invalidated := &pgconn.PgError{Code: "55000", Message: `cannot read from logical replication slot "s"`,
		Detail: "This slot has been invalidated because it exceeded the maximum reserved size."}
	tests := []struct {
		err  error
		want bool
	}{
		{invalidated, true},
		{fmt.Errorf("start replication: %w", invalidated), true},
		{&pgconn.PgError{Code: "55000", Message: `can no longer get changes from replication slot "s"`}, true},
		{&pgconn.PgError{Code: "58P01", Message: `requested WAL segment 000000010000000000000001 has already been removed`}, true},
		{&pgconn.PgError{Code: "55000", Message: `replication slot "s" was not created in this database`}, false},
		{&pgconn.PgError{Code: "55000", Message: `logical decoding requires wal_level >= logical`}, false},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, false},
		{errors.New("EOF"), false},
	}
	for _, tc := range tests {
		if got := walLost(tc.err); got != tc.want {
			t.Errorf("walLost(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}

	err := walLostError("s", 0x152E2B0, invalidated)
	if !errors.Is(err, ErrWALLost) || !errors.Is(err, invalidated) {
		t.Fatalf("%v does not wrap ErrWALLost and the server's error", err)
	}
	for _, want := range []string{`"s"`, "0/152E2B0", "skipped, not delayed", "--recreate-slot", "max_slot_wal_keep_size", "exceeded the maximum reserved size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the explanation lacks %q: %v", want, err)
		}
	}
}
