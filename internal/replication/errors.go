package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// The conditions of streaming that are not met, as the Err of an *Error.
// Callers branch on them with errors.Is.
var (
	// ErrSlotInUse means another process streams from the slot: this
	// instance is a hot standby and waits.
	ErrSlotInUse = errors.New("replication slot is in use by another process")

	// ErrWALLost means PostgreSQL removed WAL the slot still needed
	// (wal_status lost, the slot invalidated): the slot can never stream the
	// changes in it. Streaming stops for good; only a person can decide to
	// recreate the slot, since that skips those changes.
	ErrWALLost = errors.New("the replication slot lost WAL it still needed (wal_status lost)")

	// ErrServerSilent means the replication connection was given up because
	// the server sent nothing, not even an answer to a requested reply, for
	// the receive timeout: the network or the server hangs. Streaming
	// resumes on a new connection.
	ErrServerSilent = errors.New("PostgreSQL stopped answering on the replication connection")

	// ErrSlotForgotten means the slot is missing although cdc-outbox
	// created it before (the publication's comment remembers it): creating
	// it again would skip every change since it was dropped.
	ErrSlotForgotten = errors.New("replication slot existed and is gone")

	// ErrSlotGone means the replication slot does not exist where
	// cdc-outbox streams: dropped while it ran, or not carried over to a
	// standby that was promoted (Error.AfterFailover). A new slot would skip
	// what was committed in between, so only a person may decide to create
	// one.
	ErrSlotGone = errors.New("the replication slot is gone")

	// ErrSlotPlugin means the slot uses another output plugin than
	// pgoutput: it cannot be the streamer's.
	ErrSlotPlugin = errors.New("replication slot uses another output plugin")

	// ErrSlotDatabase means the slot belongs to another database than the
	// one connected to.
	ErrSlotDatabase = errors.New("replication slot belongs to another database")

	// ErrNoPublication means the publication does not exist (and may not
	// be created).
	ErrNoPublication = errors.New("the publication does not exist")

	// ErrPublicationGone means the publication did not exist at a point of
	// the WAL being decoded: it was dropped while the slot still had
	// changes to stream, which the server cannot stream past.
	ErrPublicationGone = errors.New("the publication does not exist at this point of the WAL")

	// ErrNotPublished means the publication does not publish every insert
	// into the outbox (Coverage).
	ErrNotPublished = errors.New("the publication does not publish the whole outbox")

	// ErrShardsVersion means the stream is split into shards on a server
	// older than PostgreSQL 15, which has no row filters.
	ErrShardsVersion = errors.New("shards need row filters, PostgreSQL 15 or newer")

	// ErrShardsHash means the server's hashtext gives other values than
	// the streamer's (a big-endian server): the shards' messages would not
	// follow their aggregates' rows.
	ErrShardsHash = errors.New("the server's hashtext differs from the streamer's")

	// ErrShardCount means the server holds the slots or publications of
	// the stream split in another number of shards (or not split) than
	// asked: each holds a position of its own, and starting anew beside
	// them would stream their aggregates twice or not at all.
	ErrShardCount = errors.New("the stream is split in another number of shards")

	// ErrShardFilter means a shard's publication does not filter a table
	// by the shard's hash of the aggregate id.
	ErrShardFilter = errors.New("the shard's publication does not filter by the shard's hash")

	// ErrShardColumn means the aggregate id column of a sharded outbox is
	// missing or is not text or varchar, which hashtext takes.
	ErrShardColumn = errors.New("the aggregate id column cannot be hashed for shards")
)

// Error is a condition of streaming that is not met, with the facts that
// name it. Err is one of the Err* sentinels; the other fields are set where
// they matter to it. Its text is the facts alone: what to do about them is
// the caller's to say.
type Error struct {
	Err         error
	Slot        string
	Publication string
	Table       pgname.Name
	// Confirmed is the last position confirmed through the slot: changes
	// after it are the ones at stake.
	Confirmed pglogrepl.LSN
	// Reason is why PostgreSQL invalidated the slot (SlotInfo.Reason), for
	// ErrWALLost.
	Reason string
	// Statement is the SQL that would create what is missing (ErrNoPublication).
	Statement string
	// Coverage is what the publication publishes of the outbox, for
	// ErrNotPublished.
	Coverage *Coverage
	// AfterFailover: the condition arose on a primary that was promoted
	// since the stream began (ErrSlotGone).
	AfterFailover bool
	// Cause is the server's error, when there was one.
	Cause error

	msg string
}

func (e *Error) Error() string {
	if e.Err != ErrWALLost || e.Cause == nil {
		return e.msg // which quotes the server where it matters
	}
	var pgErr *pgconn.PgError
	if errors.As(e.Cause, &pgErr) && pgErr.Detail != "" {
		// The detail says why the slot was invalidated; the error alone
		// does not.
		return fmt.Sprintf("%s (PostgreSQL said: %v; %s)", e.msg, e.Cause, pgErr.Detail)
	}
	return fmt.Sprintf("%s (PostgreSQL said: %v)", e.msg, e.Cause)
}

// Unwrap returns the sentinel and the server's error.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

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

	// The server's TLS certificate did not verify: not issued for the host
	// connected to, not signed by a trusted CA, refused (expired, not yet
	// valid, not for a server), or otherwise. Retried as a network error
	// would be; Prepare, which connects first, reports it at start.
	CauseTLSHostname
	CauseTLSUnknownCA
	CauseTLSCertificate
	CauseTLSVerify
)

// CauseOf says what err, an error of a connection to PostgreSQL (wrapped
// or not), means. It is the one place that reads SQLSTATEs.
func CauseOf(err error) Cause {
	var (
		host      x509.HostnameError
		authority x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		pgErr     *pgconn.PgError
	)
	switch {
	case errors.As(err, &host):
		return CauseTLSHostname
	case errors.As(err, &authority):
		return CauseTLSUnknownCA
	case errors.As(err, &invalid):
		return CauseTLSCertificate
	case errors.As(err, &verify):
		return CauseTLSVerify
	case !errors.As(err, &pgErr):
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
	case CauseNetwork, CauseServer, CauseSlotInUse, CauseTLSHostname, CauseTLSUnknownCA, CauseTLSCertificate, CauseTLSVerify:
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

// standbySlotsWait reports whether a walsender's notice says it waits for
// a standby slot that synchronized_standby_slots names (missing, logical,
// invalidated or without a standby): PostgreSQL repeats it every few
// seconds while it holds the stream back. Told by its SQLSTATE (22023 for
// a missing or logical slot, 55000 for an invalidated or inactive one) and
// the parameter's name, which translations quote unchanged.
func standbySlotsWait(n *pgconn.PgError) bool {
	return (n.Code == pgerrcode.InvalidParameterValue || n.Code == pgerrcode.ObjectNotInPrerequisiteState) &&
		strings.Contains(n.Message, "synchronized_standby_slots")
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
// SlotInfo.Reason gives it) and what it costs; cause is the server's error,
// if there was one.
func walLostError(slot string, confirmed pglogrepl.LSN, reason string, cause error) error {
	what, _ := Invalidation(reason)
	switch reason {
	case "":
	case reasonConflict:
		what += " (conflicting)"
	default:
		what += " (invalidation_reason " + reason + ")"
	}
	return &Error{Err: ErrWALLost, Slot: slot, Confirmed: confirmed, Reason: reason, Cause: cause,
		msg: fmt.Sprintf("replication slot %q: %v. %s. Outbox events committed after %s (the last confirmed position) "+
			"have not reached Kafka and never will through this slot: they are skipped, not delayed, so cdc-outbox stops instead of going on without them",
			slot, ErrWALLost, what, confirmed)}
}

// ConnectError is a failure to connect to PostgreSQL. CauseOf says why:
// a certificate that did not verify, a refused password, a pg_hba.conf
// rule, or the network. Its text is one line: the addresses tried, the
// user and database, and each distinct cause once; never the password.
type ConnectError struct {
	Err error
	// Defaults is true when the connection string was empty: every
	// setting came from the PG* environment variables or libpq's
	// defaults (a Unix socket, the operating system's user name).
	Defaults bool
}

// NewConnectError is err, a failure to connect to url, as a *ConnectError.
func NewConnectError(url string, err error) *ConnectError {
	return &ConnectError{Err: err, Defaults: strings.TrimSpace(url) == ""}
}

func (e *ConnectError) Error() string {
	var ce *pgconn.ConnectError
	if !errors.As(e.Err, &ce) || ce.Config == nil {
		return "cannot connect to PostgreSQL: " + oneLine(e.Err.Error())
	}
	who := ""
	if ce.Config.User != "" {
		who = " as user " + ce.Config.User
	}
	if ce.Config.Database != "" {
		who += " to database " + ce.Config.Database
	}
	return fmt.Sprintf("cannot connect to PostgreSQL at %s%s: %s", strings.Join(addresses(ce.Config), ", "), who, strings.Join(dialCauses(ce), "; "))
}

func (e *ConnectError) Unwrap() error { return e.Err }

// addresses are the servers a connection tries, each once: host:port, or
// a Unix socket's path.
func addresses(cfg *pgconn.Config) []string {
	var out []string
	seen := map[string]bool{}
	add := func(host string, port uint16) {
		a := net.JoinHostPort(host, strconv.Itoa(int(port)))
		if strings.HasPrefix(host, "/") {
			a = fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	add(cfg.Host, cfg.Port)
	for _, f := range cfg.Fallbacks {
		add(f.Host, f.Port)
	}
	return out
}

// dialCauses are the distinct causes of a failed connection, in the order
// tried: pgconn tries each address, and each twice with sslmode=prefer
// (TLS, then without), and joins every failure, with the address, into a
// multi-line text.
func dialCauses(ce *pgconn.ConnectError) []string {
	var each []error
	switch inner := ce.Unwrap().(type) {
	case interface{ Unwrap() []error }:
		each = inner.Unwrap()
	default:
		each = []error{inner}
	}
	var out []string
	seen := map[string]bool{}
	for _, err := range each {
		if c := dialCause(err); !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// dialCause is the heart of one attempt's failure: what the name service,
// the operating system or the server said, without the address (which
// addresses lists).
func dialCause(err error) string {
	var (
		dns   *net.DNSError
		pgErr *pgconn.PgError
		errno syscall.Errno
		nerr  net.Error
	)
	switch {
	case errors.As(err, &dns):
		if dns.IsNotFound {
			return fmt.Sprintf("host %s not found", dns.Name)
		}
		return fmt.Sprintf("lookup %s: %s", dns.Name, dns.Err)
	case errors.As(err, &pgErr):
		return oneLine(pgErr.Error())
	case errors.As(err, &errno):
		return errno.Error()
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		return "timed out"
	}
	// pgconn's per-address error is "address (host): cause".
	if inner := errors.Unwrap(err); inner != nil && strings.HasSuffix(err.Error(), ": "+inner.Error()) {
		return oneLine(inner.Error())
	}
	return oneLine(err.Error())
}

// oneLine joins a text's lines and runs of blanks into one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// connect opens a normal (not a replication) connection to url's primary
// (ConnectPrimary).
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	conn, err := ConnectPrimary(ctx, url)
	if err != nil {
		return nil, NewConnectError(url, err)
	}
	return conn, nil
}

// isTimeout reports whether err is the read deadline the stream loop sets
// itself to wake up for status updates.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
