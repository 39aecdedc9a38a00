package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestWALLost: the server's errors for a slot whose WAL is gone are told
// apart from other errors with the same SQLSTATE, and the error states the
// facts, the server's detail among them. (What to do is the command's to
// say: cmd/cdc-outbox's advice_test.go.)
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
		if got := CauseOf(tc.err) == CauseWALLost; got != tc.want {
			t.Errorf("CauseOf(%v) == CauseWALLost is %v, want %v", tc.err, got, tc.want)
		}
	}

	err := walLostError("s", 0x152E2B0, "", invalidated)
	var e *Error
	if !errors.Is(err, ErrWALLost) || !errors.Is(err, invalidated) || !errors.As(err, &e) || e.Slot != "s" || e.Confirmed != 0x152E2B0 {
		t.Fatalf("%v does not wrap ErrWALLost and the server's error with the slot and position", err)
	}
	for _, want := range []string{`"s"`, "0/152E2B0", "skipped, not delayed", "max_slot_wal_keep_size", "exceeded the maximum reserved size"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the explanation lacks %q: %v", want, err)
		}
	}
}

// TestCauseOf: every cause the streamer decides on, by SQLSTATE. The
// server's words are read only where one code has several causes (42704
// for a slot or a publication, 28000 for pg_hba.conf or a role, 55000 and
// 58P01 for lost WAL or something else); elsewhere a translated message
// (lc_messages = 'de_DE') is classified as the English one.
func TestCauseOf(t *testing.T) {
	pg := func(code, message string) error { return &pgconn.PgError{Code: code, Message: message} }
	for _, tc := range []struct {
		err       error
		want      Cause
		retryable bool
	}{
		{errors.New("EOF"), CauseNetwork, true},
		{fmt.Errorf("receive message: %w", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}), CauseNetwork, true},
		{pg("57P01", "terminating connection due to administrator command"), CauseServer, true},
		{pg("55006", `replication slot "s" is active for PID 42`), CauseSlotInUse, true},
		{pg("55006", `Replikations-Slot »s« ist aktiv für PID 42`), CauseSlotInUse, true},
		{fmt.Errorf("start replication: %w", pg("42704", `replication slot "s" does not exist`)), CauseSlotMissing, false},
		{pg("42704", `publication "p" does not exist`), CausePublicationMissing, false},
		{pg("42704", `type "x" does not exist`), CauseUndefinedObject, false},
		{pg("55000", `can no longer get changes from replication slot "s"`), CauseWALLost, false},
		{&pgconn.PgError{Code: "55000", Message: `cannot read from logical replication slot "s"`, Detail: "This slot has been invalidated because it exceeded the maximum reserved size."}, CauseWALLost, false},
		{pg("58P01", "requested WAL segment 000000010000000000000001 has already been removed"), CauseWALLost, false},
		{pg("58P01", `could not open file "x"`), CauseFileMissing, false},
		{pg("55000", `replication slot "s" was not created in this database`), CausePrerequisite, false},
		{pg("28P01", `password authentication failed for user "u"`), CausePassword, false},
		{pg("28P01", `Passwort-Authentifizierung für Benutzer »u« fehlgeschlagen`), CausePassword, false},
		{pg("28000", `pg_hba.conf rejects connection for host "127.0.0.1", user "u", database "d", no encryption`), CausePgHBA, false},
		{pg("28000", `role "u" does not exist`), CauseAuthorization, false},
		{pg("42501", "permission denied for table outbox"), CausePrivilege, false},
		{pg("42501", "keine Berechtigung für Tabelle outbox"), CausePrivilege, false},
		{pg("3D000", `database "d" does not exist`), CauseNoDatabase, false},
		{pg("0A000", "logical decoding requires a database connection"), CauseUnsupported, false},
		// Connecting over TLS to a server whose certificate does not
		// verify, as pgconn reports it: retried, as a network error is.
		{connectErr(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), CauseTLSUnknownCA, true},
		{connectErr(&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "10.0.0.1", Certificate: &x509.Certificate{}}}), CauseTLSHostname, true},
		{connectErr(x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}}), CauseTLSCertificate, true},
		{connectErr(&tls.CertificateVerificationError{Err: errors.New("other")}), CauseTLSVerify, true},
		{connectErr(&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "u"`}), CausePassword, false},
	} {
		got := CauseOf(tc.err)
		if got != tc.want || got.Retryable() != tc.retryable {
			t.Errorf("CauseOf(%v) = %d (retryable %v), want %d (retryable %v)", tc.err, got, got.Retryable(), tc.want, tc.retryable)
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
		for _, want := range []string{tc.what, tc.label, "skipped, not delayed", "0/152E2B0"} {
			if !strings.Contains(err, want) {
				t.Errorf("%s: the error lacks %q: %s", tc.reason, want, err)
			}
		}
		if _, prevent := Invalidation(tc.reason); !strings.Contains(prevent, tc.avoid) {
			t.Errorf("%s: the prevention %q lacks %q", tc.reason, prevent, tc.avoid)
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

// connectErr is err as connecting returns it.
func connectErr(err error) error {
	return &ConnectError{Err: fmt.Errorf("failed to connect to `user=u database=d`: 127.0.0.1:5432 (127.0.0.1): %w", err)}
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
	var e *Error
	if !errors.Is(err, ErrPublicationGone) || !errors.As(err, &e) || e.Slot != "s" || e.Publication != "cdc_outbox" || e.Confirmed != 0x152E2B0 {
		t.Fatalf("the error lacks the facts (ErrPublicationGone, slot, publication, confirmed position): %#v", err)
	}
	for _, want := range []string{`publication "cdc_outbox" does not exist`, "skipped loading publication"} {
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

// TestConnectErrorOneLine: a failed connection is told in one line, with
// every address tried, the user and database, and each cause once (pgconn
// tries each address twice under sslmode=prefer and joins the failures,
// with the address, over several lines).
func TestConnectErrorOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	notFound := func(_ context.Context, host string) ([]string, error) {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	for _, tc := range []struct {
		url    string
		lookup pgconn.LookupFunc
		want   string
	}{
		{"postgres://u@" + closed + "/d?connect_timeout=5", nil,
			"cannot connect to PostgreSQL at " + closed + " as user u to database d: connection refused"},
		{"postgres://u@nosuchhost.invalid:5432/d", notFound,
			"cannot connect to PostgreSQL at nosuchhost.invalid:5432 as user u to database d: host nosuchhost.invalid not found"},
		{"postgres://u@nosuchhost.invalid:5432," + closed + "/d?connect_timeout=5", func(ctx context.Context, host string) ([]string, error) {
			if host == "nosuchhost.invalid" {
				return notFound(ctx, host)
			}
			return []string{host}, nil
		}, "cannot connect to PostgreSQL at nosuchhost.invalid:5432, " + closed + " as user u to database d: host nosuchhost.invalid not found; connection refused"},
		{"host=" + t.TempDir() + " user=u dbname=d", nil, "/.s.PGSQL.5432 as user u to database d: no such file or directory"},
	} {
		cfg, err := pgconn.ParseConfig(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if tc.lookup != nil {
			cfg.LookupFunc = tc.lookup
		}
		_, err = pgconn.ConnectConfig(context.Background(), cfg)
		if err == nil {
			t.Fatalf("%s: connected", tc.url)
		}
		got := NewConnectError(tc.url, err)
		if msg := got.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s:\n got %q\nwant %q", tc.url, msg, tc.want)
		}
		if got.Defaults || CauseOf(got) != CauseNetwork {
			t.Errorf("%s: defaults %v, cause %v", tc.url, got.Defaults, CauseOf(got))
		}
	}
	if !NewConnectError(" ", errors.New("x")).Defaults {
		t.Error("an empty connection string is not reported as the defaults")
	}
}
