package replication

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotInUse means another process streams from the slot: this instance
// is a hot standby and waits.
var ErrSlotInUse = errors.New("replication slot is in use by another process")

// ErrWALLost means PostgreSQL removed WAL the slot still needed
// (wal_status lost, the slot invalidated): the slot can never stream the
// changes in it. Streaming stops for good; only a person can decide to
// recreate the slot, since that skips those changes.
var ErrWALLost = errors.New("the replication slot lost WAL it still needed (wal_status lost)")

// ErrSlotGone means the replication slot does not exist where cdc-outbox
// streams: dropped while it ran, or not carried over to a standby that was
// promoted. A new slot would skip what was committed in between, so only a
// person may decide to create one (--recreate-slot).
var ErrSlotGone = errors.New("the replication slot is gone")

// ErrServerSilent means the replication connection was given up because the
// server sent nothing, not even an answer to a requested reply, for the
// receive timeout: the network or the server hangs. Streaming resumes on a
// new connection.
var ErrServerSilent = errors.New("PostgreSQL stopped answering on the replication connection")

// SQLSTATE codes the streamer decides on.
const (
	codeObjectInUse        = "55006" // replication slot is active for PID ...
	codeUndefinedObject    = "42704" // slot or publication does not exist
	codeInvalidPassword    = "28P01"
	codeInvalidAuthSpec    = "28000"
	codeInsufficientPriv   = "42501"
	codeInvalidCatalogName = "3D000" // database does not exist
	codeObjectNotInState   = "55000" // e.g. the slot can no longer get changes (WAL removed)
	codeFeatureNotSupport  = "0A000"
	codeUndefinedFile      = "58P01" // requested WAL segment has already been removed
)

// sqlState returns the SQLSTATE of a server error, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// walLost reports whether a server error says the slot's WAL is gone: the
// slot was invalidated (START_REPLICATION: "cannot read from logical
// replication slot", the SQL functions: "can no longer get changes from
// replication slot", both with the detail "This slot has been invalidated
// because it exceeded the maximum reserved size"), or a WAL segment it
// needs was removed. Other errors of the same SQLSTATE (a slot of another
// database, wal_level too low) are not this.
func walLost(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case codeUndefinedFile:
		return strings.Contains(pgErr.Message, "has already been removed")
	case codeObjectNotInState:
		return strings.Contains(pgErr.Message, "can no longer get changes") || strings.Contains(pgErr.Detail, "invalidated")
	}
	return false
}

// reasonConflict is SlotInfo.Reason for a slot that PostgreSQL 16 reports
// conflicting, without saying which conflict.
const reasonConflict = "conflict"

// Invalidation explains a reason for which PostgreSQL invalidates a slot
// (SlotInfo.Reason): what happened, and how to keep it from happening
// again. An empty reason is the only one before PostgreSQL 16: the WAL was
// removed.
func Invalidation(reason string) (what, prevent string) {
	switch reason {
	case "", "wal_removed":
		return "PostgreSQL removed WAL the slot still needed, usually because the slot held more than max_slot_wal_keep_size while cdc-outbox was stopped or behind",
			"raise max_slot_wal_keep_size or alert on cdc_outbox_slot_wal_status{status=\"unreserved\"}"
	case "idle_timeout":
		return "the slot stayed inactive longer than idle_replication_slot_timeout, so PostgreSQL invalidated it and let go of the WAL it held",
			"keep cdc-outbox running (a hot standby instance on the same slot takes over within seconds), or raise idle_replication_slot_timeout (0 turns it off)"
	case "rows_removed":
		return "this server is a standby, and the primary removed catalog rows the slot still needed (a conflict with recovery)",
			"between the primary and this standby, use a physical replication slot with hot_standby_feedback = on"
	case "wal_level_insufficient":
		return "this server is a standby, and the primary's wal_level was lowered below logical",
			"keep wal_level = logical on the primary"
	case reasonConflict:
		return "this server is a standby, and the slot conflicted with recovery (the primary removed rows it needed, or lowered wal_level)",
			"between the primary and this standby, use a physical replication slot with hot_standby_feedback = on, and keep wal_level = logical on the primary"
	}
	return "PostgreSQL invalidated the slot", "see the PostgreSQL documentation of invalidation_reason " + reason
}

// walLostError is ErrWALLost for slot, with why (the invalidation reason, as
// SlotInfo.Reason gives it), what it costs and how to recover; cause is the
// server's error, if there was one.
func walLostError(slot string, confirmed pglogrepl.LSN, reason string, cause error) error {
	what, prevent := Invalidation(reason)
	switch reason {
	case "":
	case reasonConflict:
		what += " (conflicting)"
	default:
		what += " (invalidation_reason " + reason + ")"
	}
	err := fmt.Errorf("replication slot %q: %w. %s. Outbox events committed after %s (the last confirmed position) "+
		"have not reached Kafka and never will through this slot: they are skipped, not delayed, so cdc-outbox stops instead of going on without them. "+
		"To recover: start once with --recreate-slot, which drops this slot and creates a new one that streams only what commits from then on, "+
		"then re-publish the outbox rows committed after that position from the table: cdc-outbox republish --after-id <the last id up to which Kafka has every event> "+
		"(or --since <a time before it>); consumers skip the repeats by event id; "+
		"to prevent it, %s",
		slot, ErrWALLost, what, confirmed, prevent)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(cause, &pgErr) && pgErr.Detail != "":
		// The detail says why the slot was invalidated; the error alone
		// does not.
		err = fmt.Errorf("%w (PostgreSQL said: %w; %s)", err, cause, pgErr.Detail)
	case cause != nil:
		err = fmt.Errorf("%w (PostgreSQL said: %w)", err, cause)
	}
	return err
}

// ExplainConnect adds what to check to an error from connecting to
// PostgreSQL, for the causes a person has to fix: a server certificate that
// does not verify, a refused password, a pg_hba.conf rule. Other errors are
// returned as they are. It never adds the password, and the errors it
// wraps (pgconn's) name only the user and database.
func ExplainConnect(err error) error {
	var host x509.HostnameError
	var authority x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &host):
		return fmt.Errorf("%w: the server's TLS certificate is not issued for the host in --postgres-url: connect by a name or IP address "+
			"that the certificate lists (sslmode=verify-full checks it), or reissue the certificate with that name", err)
	case errors.As(err, &authority):
		return fmt.Errorf("%w: the server's TLS certificate is not signed by a CA that cdc-outbox trusts: point sslrootcert in --postgres-url "+
			"(or PGSSLROOTCERT) at the CA certificate that signed the server's", err)
	case errors.As(err, &invalid):
		return fmt.Errorf("%w: the server's TLS certificate was refused (expired, not yet valid, or not for a server): renew it on the server", err)
	case errors.As(err, &verify):
		return fmt.Errorf("%w: the server's TLS certificate did not verify: check sslrootcert in --postgres-url and the server's certificate", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == codeInvalidPassword:
		return fmt.Errorf("%w: check the password (in --postgres-url, PGPASSWORD or ~/.pgpass) and that the role has one set "+
			"(ALTER ROLE ... PASSWORD, or sql/role.sql)", err)
	case pgErr.Code == codeInvalidAuthSpec && strings.Contains(pgErr.Message, "pg_hba.conf"):
		return fmt.Errorf("%w: the server's pg_hba.conf does not let this role connect this way: for cdc-outbox, allow the role on the outbox's "+
			"database (a logical replication connection matches the database name), over TLS with scram-sha-256 (hostssl), "+
			"and connect with sslmode=verify-full", err)
	}
	return err
}

// slotInUse reports whether err says another backend holds the slot.
func slotInUse(err error) bool { return sqlState(err) == codeObjectInUse }

// retryable reports whether streaming may resume after err by reconnecting.
// Network failures and server restarts are retryable; errors that a new
// connection would only repeat (a missing slot or publication, lost WAL,
// authentication, permissions) are not: they need a person, and retrying
// them forever would hide the outage.
func retryable(err error) bool {
	switch sqlState(err) {
	case "":
		return true // network errors, EOF, timeouts
	case codeUndefinedObject, codeInvalidPassword, codeInvalidAuthSpec, codeInsufficientPriv,
		codeInvalidCatalogName, codeObjectNotInState, codeFeatureNotSupport, codeUndefinedFile:
		return false
	}
	return true
}

// isTimeout reports whether err is the read deadline the stream loop sets
// itself to wake up for status updates.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
