package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
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

// ErrServerSilent means the replication connection was given up because the
// server sent nothing, not even an answer to a requested reply, for the
// receive timeout: the network or the server hangs. Streaming resumes on a
// new connection.
var ErrServerSilent = errors.New("PostgreSQL stopped answering on the replication connection")

// Cause is what an error from PostgreSQL means to the streamer. CauseOf
// decides it by the error's SQLSTATE; the server's message text, which
// lc_messages translates, is read only where PostgreSQL gives several
// causes one code.
type Cause int

// The causes CauseOf tells apart.
const (
	// CauseNetwork: no SQLSTATE at all: a network error, EOF, a timeout.
	// Reconnecting heals it.
	CauseNetwork Cause = iota
	// CauseServer: a server error none of the others; the server restarting
	// (57P01 admin_shutdown), a recovery conflict. Reconnecting may heal it.
	CauseServer
	// CauseSlotInUse (55006 object_in_use): another process streams from
	// the slot. A hot standby waits for it.
	CauseSlotInUse
	// CauseSlotMissing (42704 undefined_object, about a replication slot).
	CauseSlotMissing
	// CausePublicationMissing (42704 undefined_object, about a publication).
	CausePublicationMissing
	// CauseUndefinedObject (42704) about anything else.
	CauseUndefinedObject
	// CauseWALLost: the slot can never stream the changes it holds: it was
	// invalidated (55000 object_not_in_prerequisite_state, saying it can no
	// longer get changes or was invalidated), or a WAL segment it needs was
	// removed (58P01 undefined_file).
	CauseWALLost
	// CausePrerequisite (55000) otherwise: a slot of another database,
	// wal_level too low.
	CausePrerequisite
	// CauseFileMissing (58P01) otherwise.
	CauseFileMissing
	// CausePassword (28P01 invalid_password): the password was refused.
	CausePassword
	// CausePgHBA (28000 invalid_authorization_specification, from
	// pg_hba.conf): no rule lets the role connect this way.
	CausePgHBA
	// CauseAuthorization (28000) otherwise: the role does not exist, or may
	// not log in.
	CauseAuthorization
	// CausePrivilege (42501 insufficient_privilege).
	CausePrivilege
	// CauseNoDatabase (3D000 invalid_catalog_name): the database does not
	// exist.
	CauseNoDatabase
	// CauseUnsupported (0A000 feature_not_supported).
	CauseUnsupported
)

// CauseOf says what err, an error of a connection to PostgreSQL (wrapped
// or not), means. It is the one place that reads SQLSTATEs.
func CauseOf(err error) Cause {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return CauseNetwork
	}
	switch pgErr.Code {
	case pgerrcode.ObjectInUse:
		return CauseSlotInUse
	case pgerrcode.UndefinedObject:
		// One code for a missing slot and a missing publication; the
		// English text tells them apart (START_REPLICATION names the slot:
		// `replication slot "x" does not exist`; pgoutput the publication:
		// `publication "x" does not exist`).
		switch {
		case strings.Contains(pgErr.Message, "replication slot"):
			return CauseSlotMissing
		case strings.Contains(pgErr.Message, "publication"):
			return CausePublicationMissing
		}
		return CauseUndefinedObject
	case pgerrcode.ObjectNotInPrerequisiteState:
		// One code for many unmet prerequisites. An invalidated slot says
		// "cannot read from logical replication slot" (START_REPLICATION)
		// or "can no longer get changes from replication slot" (the SQL
		// functions), with the detail "This slot has been invalidated
		// because ...". Callers that can read the slot's row ask it
		// instead (Stream.explain), in any language.
		if strings.Contains(pgErr.Message, "can no longer get changes") || strings.Contains(pgErr.Detail, "invalidated") {
			return CauseWALLost
		}
		return CausePrerequisite
	case pgerrcode.UndefinedFile:
		// "requested WAL segment ... has already been removed"
		if strings.Contains(pgErr.Message, "has already been removed") {
			return CauseWALLost
		}
		return CauseFileMissing
	case pgerrcode.InvalidPassword:
		return CausePassword
	case pgerrcode.InvalidAuthorizationSpecification:
		// One code for a pg_hba.conf rejection and for a role that does
		// not exist or may not log in; only the first names the file.
		if strings.Contains(pgErr.Message, "pg_hba.conf") {
			return CausePgHBA
		}
		return CauseAuthorization
	case pgerrcode.InsufficientPrivilege:
		return CausePrivilege
	case pgerrcode.InvalidCatalogName:
		return CauseNoDatabase
	case pgerrcode.FeatureNotSupported:
		return CauseUnsupported
	}
	return CauseServer
}

// Retryable reports whether streaming may resume after an error of this
// cause by reconnecting. Network failures and server restarts are
// retryable, and so is a slot in use (a hot standby waits); errors that a
// new connection would only repeat (a missing slot or publication, lost
// WAL, authentication, permissions) are not: they need a person, and
// retrying them forever would hide the outage.
func (c Cause) Retryable() bool {
	switch c {
	case CauseNetwork, CauseServer, CauseSlotInUse:
		return true
	}
	return false
}

// publicationSkipped reports whether a notice is PostgreSQL 18's warning
// that pgoutput skipped publication (55000, `skipped loading publication
// "x"`): told by its SQLSTATE and the publication's quoted name, which
// translations of the message keep.
func publicationSkipped(n *pgconn.PgError, publication string) bool {
	return n.Code == pgerrcode.ObjectNotInPrerequisiteState && strings.Contains(n.Message, `"`+publication+`"`)
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
		"To recover: re-publish the outbox rows committed after that position from the table, then start once with --recreate-slot, "+
		"which drops this slot and creates a new one that streams only what commits from then on; "+
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

// ConnectError is a failure to connect to PostgreSQL.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// connect opens a normal (not a replication) connection to url.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, &ConnectError{Err: ExplainConnect(err)}
	}
	return conn, nil
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
	switch CauseOf(pgErr) {
	case CausePassword:
		return fmt.Errorf("%w: check the password (in --postgres-url, PGPASSWORD or ~/.pgpass) and that the role has one set "+
			"(ALTER ROLE ... PASSWORD, or sql/role.sql)", err)
	case CausePgHBA:
		return fmt.Errorf("%w: the server's pg_hba.conf does not let this role connect this way: for cdc-outbox, allow the role on the outbox's "+
			"database (a logical replication connection matches the database name), over TLS with scram-sha-256 (hostssl), "+
			"and connect with sslmode=verify-full", err)
	}
	return err
}

// isTimeout reports whether err is the read deadline the stream loop sets
// itself to wake up for status updates.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
