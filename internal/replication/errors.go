package replication

import (
	"errors"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotInUse means another process streams from the slot: this instance
// is a hot standby and waits.
var ErrSlotInUse = errors.New("replication slot is in use by another process")

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
