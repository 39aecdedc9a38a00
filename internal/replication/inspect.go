package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// Names say which slot, publication and outbox table the streamer uses.
type Names struct {
	Slot        string
	Publication string
	Table       pgname.Name
}

// Inspection is what the server says about the streamer's slot, its
// publication and the outbox table, read on a normal connection without
// changing anything: the facts `cdc-outbox status` judges.
type Inspection struct {
	Names
	// Database is the database the connection is to.
	Database string
	// Major is the server's PostgreSQL major version; InRecovery, whether
	// it is a standby; PhysicalSlots, whether it has physical replication
	// slots (standbys replicate from it through them).
	Major         int
	InRecovery    bool
	PhysicalSlots bool

	// Unmet is the first condition of streaming that the server, the role
	// or the table does not meet (wal_level, REPLICATION, an UNLOGGED
	// table), as Prepare reports it; nil when they are met. Streaming
	// cannot begin until it is fixed, whatever the slot says.
	Unmet error

	SlotExists bool
	Slot       SlotInfo // zero unless SlotExists

	Publication Publication

	TableExists bool
	Table       Table // zero unless TableExists
	// RowsEstimate is pg_class.reltuples of the table, of a partitioned
	// one summed over its partitions, of one with inheritance children
	// with theirs (as SELECT counts them); -1 when unknown (never
	// analyzed, or no such table).
	RowsEstimate int64
	// Coverage is what the publication publishes of the table, read when
	// both exist.
	Coverage *Coverage
}

// Publication is what pg_publication says about a publication.
type Publication struct {
	Exists  bool
	Inserts bool          // it publishes inserts (pubinsert)
	Tables  []pgname.Name // what it publishes by name (pg_publication_tables), each once, sorted
}

// Inspect connects to url, a primary or a standby (whose copy of a
// failover slot is worth reading too), and reads the inspection. An error
// that is a *ConnectError means the server could not be reached; any other,
// that what it says could not be read.
func Inspect(ctx context.Context, url string, names Names) (Inspection, error) {
	in := Inspection{Names: names, RowsEstimate: -1}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return in, NewConnectError(url, err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	if in.Unmet, err = checkServer(ctx, conn); err != nil {
		return in, err
	}
	in.Slot, err = ReadSlot(ctx, conn, names.Slot)
	switch {
	case errors.Is(err, ErrSlotMissing):
		in.Slot = SlotInfo{}
	case err != nil:
		return in, err
	default:
		in.SlotExists = true
	}
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000, pg_is_in_recovery(),
		EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_type = 'physical')`).Scan(&in.Major, &in.InRecovery, &in.PhysicalSlots); err != nil {
		return in, err
	}
	if in.Publication, err = readPublication(ctx, conn, names.Publication, true); err != nil {
		return in, err
	}
	if err := conn.QueryRow(ctx, `SELECT current_database()::text`).Scan(&in.Database); err != nil {
		return in, err
	}
	t, err := FindTable(ctx, conn, names.Table)
	switch {
	case errors.Is(err, ErrNoTable), errors.Is(err, ErrNotTable):
		return in, nil
	case err != nil:
		return in, err
	}
	in.TableExists, in.Table = true, t
	if t.Unlogged && in.Unmet == nil {
		in.Unmet = unloggedError(t)
	}
	if in.RowsEstimate, err = rowsEstimate(ctx, conn, t); err != nil {
		return in, err
	}
	if in.Publication.Exists {
		cov, err := Cover(ctx, conn, names.Publication, t)
		if err != nil {
			return in, err
		}
		in.Coverage = &cov
	}
	return in, nil
}

// readPublication reads whether publication exists and publishes inserts,
// and, with tables, what it publishes by name.
func readPublication(ctx context.Context, conn *pgx.Conn, publication string, tables bool) (Publication, error) {
	var p Publication
	err := conn.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, publication).Scan(&p.Inserts)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return p, nil
	case err != nil:
		return p, fmt.Errorf("look up publication %s: %w", publication, err)
	}
	p.Exists = true
	if !tables {
		return p, nil
	}
	// DISTINCT: PostgreSQL 14 lists a partition twice when it is published
	// both on its own and through its partitioned table.
	rows, _ := conn.Query(ctx, `SELECT DISTINCT schemaname::text, tablename::text FROM pg_publication_tables
		WHERE pubname = $1 ORDER BY 1, 2`, publication)
	p.Tables, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgname.Name, error) {
		var n pgname.Name
		err := row.Scan(&n.Schema, &n.Relation)
		return n, err
	})
	if err != nil {
		return p, fmt.Errorf("read tables of publication %s: %w", publication, err)
	}
	return p, nil
}

// rowsEstimate is Inspection.RowsEstimate of t.
func rowsEstimate(ctx context.Context, conn *pgx.Conn, t Table) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `WITH RECURSIVE tree(oid) AS (
			SELECT $1::oid UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid
		)
		SELECT coalesce(sum(reltuples) FILTER (WHERE reltuples >= 0), -1)::bigint FROM pg_class
		WHERE oid IN (SELECT oid FROM tree) AND relkind = 'r'`, t.OID).Scan(&n)
	if err != nil {
		return -1, fmt.Errorf("estimate the rows of %s: %w", t.Name, err)
	}
	return n, nil
}

// TableIdentity is the identity of table as PostgreSQL keeps it,
// "<system identifier>/<database OID>/<table OID>": unique to the table
// across clusters and databases, and kept across restarts, failover to a
// physical standby, and renaming the table, its schema or its database. A
// table that does not exist is an error wrapping ErrNoTable; a failure to
// connect is a *ConnectError.
func TableIdentity(ctx context.Context, url string, table pgname.Name) (string, error) {
	conn, err := connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var id *string
	err = conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text
		|| '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
		|| '/' || to_regclass($1)::oid::text`, table.Quoted()).Scan(&id)
	switch {
	case err != nil:
		return "", err
	case id == nil:
		return "", fmt.Errorf("%w: %s", ErrNoTable, table)
	}
	return *id, nil
}

// StreamIdentity is the identity of the stream of slot as PostgreSQL
// keeps it, "<system identifier>/<database OID>/<slot>": what the
// exactly-once producer's names (transactional id, checkpoint key) derive
// from. The slot, not a table, is the stream: one slot carries every table
// its publication holds, and one Kafka transaction and checkpoint hold its
// whole position. The system identifier tells clusters apart (so two
// services that keep the default slot name on one Kafka cluster do not
// collide) and the database OID databases; all three survive restarts, a
// hot-standby takeover (same server, same slot) and failover to a physical
// standby (same system identifier and OIDs, the slot synchronized under
// its name). A failure to connect is a *ConnectError.
func StreamIdentity(ctx context.Context, url, slot string) (string, error) {
	conn, err := connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var system, database string
	err = conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text,
		(SELECT oid FROM pg_database WHERE datname = current_database())::text`).Scan(&system, &database)
	if err != nil {
		return "", err
	}
	return system + "/" + database + "/" + slot, nil
}

// OutboxInspection is what the server says about one outbox table of a
// stream of several: the table, what the publication publishes of it, and
// its rows estimate (-1 when unknown).
type OutboxInspection struct {
	Table        Table
	Coverage     Coverage // zero when the publication does not exist
	RowsEstimate int64
}

// OutboxesInspection is what the server says about the outbox tables of a
// stream of several.
type OutboxesInspection struct {
	Tables []OutboxInspection
	// Temporary are the temporary tables of any session that match a
	// pattern: never streamed (FindTemporary).
	Temporary []OutboxTable
	// Membership is the membership trigger's state for the patterns with
	// wildcards; nil when there are none.
	Membership *Membership
	// Command installs the trigger and registers what Membership misses,
	// when it is not Complete.
	Command string
}

// InspectOutboxes finds the tables the patterns name now (a named table
// that does not exist is left out) and reads each one's coverage by
// publication, when it exists, and its rows estimate; the temporary tables
// the patterns match; and whether tables that come to match join the
// publication by themselves. A failure to connect is a *ConnectError.
func InspectOutboxes(ctx context.Context, url, publication string, ps []pgname.Pattern) (OutboxesInspection, error) {
	var in OutboxesInspection
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return in, NewConnectError(url, err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	var found []OutboxTable
	for _, p := range ps {
		// One at a time: a named table that is missing is no reason not
		// to list the others.
		ts, err := FindOutboxes(ctx, conn, []pgname.Pattern{p})
		switch {
		case errors.Is(err, ErrNoTable), errors.Is(err, ErrNotTable):
			continue
		case err != nil:
			return in, err
		}
		for _, t := range ts {
			if !slices.ContainsFunc(found, func(f OutboxTable) bool { return f.OID == t.OID }) {
				found = append(found, t)
			}
		}
	}
	pub, err := readPublication(ctx, conn, publication, false)
	if err != nil {
		return in, err
	}
	in.Tables = make([]OutboxInspection, 0, len(found))
	for _, t := range found {
		oi := OutboxInspection{Table: t.Table}
		if oi.RowsEstimate, err = rowsEstimate(ctx, conn, t.Table); err != nil {
			return in, err
		}
		if pub.Exists {
			if oi.Coverage, err = Cover(ctx, conn, publication, t.Table); err != nil {
				return in, err
			}
		}
		in.Tables = append(in.Tables, oi)
	}
	if in.Temporary, err = FindTemporary(ctx, conn, ps); err != nil {
		return in, err
	}
	if ws, _ := watches(ps, nil); len(ws) > 0 {
		m, err := readMembership(ctx, conn, publication, ws)
		if err != nil {
			return in, err
		}
		in.Membership = &m
		if !m.Complete() {
			var database string
			if err := conn.QueryRow(ctx, `SELECT current_database()::text`).Scan(&database); err != nil {
				return in, err
			}
			in.Command = MembershipCommand(database, publication, m.Unregistered)
		}
	}
	return in, nil
}
