package replication

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
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

	err := walLostError("s", 0x152E2B0, "", invalidated)
	if !errors.Is(err, ErrWALLost) || !errors.Is(err, invalidated) {
		t.Fatalf("%v does not wrap ErrWALLost and the server's error", err)
	}
	for _, want := range []string{`"s"`, "0/152E2B0", "skipped, not delayed", "--recreate-slot", "max_slot_wal_keep_size", "exceeded the maximum reserved size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the explanation lacks %q: %v", want, err)
		}
	}
}

// TestInvalidationReasons: each reason PostgreSQL gives for invalidating a
// slot (invalidation_reason, 17+; conflicting, 16) is explained in its own
// words, with its own prevention, and named; the cost and the recovery are
// the same for all.
func TestInvalidationReasons(t *testing.T) {
	for _, tc := range []struct {
		reason             string
		what, avoid, label string
	}{
		{"wal_removed", "max_slot_wal_keep_size", "raise max_slot_wal_keep_size", "(invalidation_reason wal_removed)"},
		{"idle_timeout", "inactive longer than idle_replication_slot_timeout", "raise idle_replication_slot_timeout", "(invalidation_reason idle_timeout)"},
		{"rows_removed", "catalog rows", "hot_standby_feedback = on", "(invalidation_reason rows_removed)"},
		{"wal_level_insufficient", "wal_level was lowered", "keep wal_level = logical", "(invalidation_reason wal_level_insufficient)"},
		{reasonConflict, "conflicted with recovery", "hot_standby_feedback = on", "(conflicting)"},
		{"some_future_reason", "invalidated the slot", "documentation of invalidation_reason", "(invalidation_reason some_future_reason)"},
	} {
		err := walLostError("s", 0x152E2B0, tc.reason, nil).Error()
		for _, want := range []string{tc.what, tc.avoid, tc.label,
			"skipped, not delayed", "--recreate-slot", "0/152E2B0"} {
			if !strings.Contains(err, want) {
				t.Errorf("%s: the explanation lacks %q: %s", tc.reason, want, err)
			}
		}
	}
	if info := (SlotInfo{WALStatus: "lost", Conflicting: true}); !info.Invalidated() || info.Reason() != reasonConflict {
		t.Errorf("a conflicting slot (16): invalidated %v, reason %q", info.Invalidated(), info.Reason())
	}
	if info := (SlotInfo{WALStatus: "lost"}); !info.Invalidated() || info.Reason() != "" {
		t.Errorf("a lost slot (before 17): invalidated %v, reason %q", info.Invalidated(), info.Reason())
	}
	if info := (SlotInfo{WALStatus: "unreserved"}); info.Invalidated() {
		t.Error("an unreserved slot is not invalidated yet")
	}
}

// TestExplainConnect: connection errors a person has to fix get the fix;
// others pass through unchanged.
func TestExplainConnect(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("failed to connect to `user=u database=d`: 127.0.0.1:5432 (127.0.0.1): %w", err)
	}
	tests := []struct {
		name string
		err  error
		want string // "" means unchanged
	}{
		{"unknown CA", wrap(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), "point sslrootcert"},
		{"wrong host", wrap(&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "10.0.0.1", Certificate: &x509.Certificate{}}}), "not issued for the host"},
		{"expired", wrap(x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}}), "renew it"},
		{"password", wrap(&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "u"`}), "check the password"},
		{"pg_hba.conf", wrap(&pgconn.PgError{Code: "28000", Message: `pg_hba.conf rejects connection for host "127.0.0.1", user "u", database "d", no encryption`}), "hostssl"},
		{"no role", wrap(&pgconn.PgError{Code: "28000", Message: `role "u" does not exist`}), ""},
		{"refused", wrap(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")), ""},
	}
	for _, tc := range tests {
		got := ExplainConnect(tc.err)
		if !errors.Is(got, tc.err) {
			t.Errorf("%s: %v does not wrap the original error", tc.name, got)
		}
		switch {
		case tc.want == "" && got.Error() != tc.err.Error():
			t.Errorf("%s: changed to %v", tc.name, got)
		case tc.want != "" && !strings.Contains(got.Error(), tc.want):
			t.Errorf("%s: %v does not say %q", tc.name, got, tc.want)
		}
	}
	if ExplainConnect(nil) != nil {
		t.Error("ExplainConnect(nil) is not nil")
	}
}

// confirmedAt is a Position that stays at one LSN.
type confirmedAt pglogrepl.LSN

func (c confirmedAt) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(c) }
func (confirmedAt) Idle(pglogrepl.LSN) bool    { return false }
func (confirmedAt) Wait() <-chan struct{}      { return nil }

// TestPublicationSkippedStops: PostgreSQL 18 warns (55000, "skipped loading
// publication") where older versions fail; that warning stops the stream
// for good with the same recovery, and other notices do not.
func TestPublicationSkippedStops(t *testing.T) {
	s := New(Config{Slot: "s", Publication: "cdc_outbox"}, nil, confirmedAt(0x152E2B0), slog.New(slog.DiscardHandler))
	err := s.notice(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "55000", Message: `skipped loading publication "cdc_outbox"`,
		Detail: "The publication does not exist at this point in the WAL."})
	var f fatal
	if !errors.As(err, &f) {
		t.Fatalf("the skipped publication does not stop the stream for good: %v", err)
	}
	for _, want := range []string{`publication "cdc_outbox" does not exist`, "skipped loading publication", "pg_drop_replication_slot('s')",
		"--recreate-slot", "0/152E2B0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	for _, other := range []*pgproto3.NoticeResponse{
		{Severity: "WARNING", Code: "01000", Message: "something else"},
		{Severity: "WARNING", Code: "55000", Message: `skipped loading publication "another"`},
	} {
		if err := s.notice(other); err != nil {
			t.Errorf("notice %q stopped the stream: %v", other.Message, err)
		}
	}
}
