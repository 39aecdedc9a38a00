package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// Setup names what streaming reads from and what Prepare may create.
type Setup struct {
	// Outboxes are the outbox tables' names or patterns: each name must be
	// a table, a pattern may match none yet.
	Outboxes          []pgname.Pattern
	Publication       string
	Slot              string
	CreatePublication bool
	CreateSlot        bool
	// RecreateSlot allows creating a slot that existed before and is gone,
	// knowing that the changes since it was dropped are not streamed.
	RecreateSlot bool
	// Failover makes the slot a failover slot on PostgreSQL 17 and newer:
	// created with failover = true, or switched to it when it exists
	// without (see failoverSlot). Older servers have no such slots.
	Failover bool

	// Shard is the shard of the stream that Publication and Slot (its own
	// names, shard.Shard.Name) belong to; the zero value: not split.
	// StreamSlot and StreamPublication are the whole stream's names, which
	// the shards' are made of; AggregateIDs, each outbox's aggregate id
	// column, which its row filter hashes.
	Shard                         shard.Shard
	StreamSlot, StreamPublication string
	AggregateIDs                  []string
}

// failoverMajor is the first PostgreSQL major with failover slots.
const failoverMajor = 17

// Prepared is what Prepare found and did.
type Prepared struct {
	// Start is the slot's confirmed position: where streaming starts.
	Start pglogrepl.LSN
	// Slot says what became of the slot.
	Slot SlotAction
	// DroppedLost: the slot had lost its WAL and was dropped, as
	// Setup.RecreateSlot allows, before it was created again: the changes
	// after LostConfirmed, its last confirmed position, and before the new
	// slot are not streamed.
	DroppedLost   bool
	LostConfirmed pglogrepl.LSN
}

// SlotAction is what Prepare did with the slot.
type SlotAction int

const (
	// SlotFound: the slot existed; streaming resumes from it.
	SlotFound SlotAction = iota
	// SlotCreated: the slot did not exist and was created; it streams what
	// commits from its creation on.
	SlotCreated
	// SlotRecreated: the slot existed before and was gone (the publication
	// remembers it), and was created again as Setup.RecreateSlot allows:
	// the changes in between are not streamed.
	SlotRecreated
)

// Prepare checks, on a normal connection to url, everything streaming needs,
// creates the publication and slot when missing and allowed, and returns
// where streaming starts and what it did to the slot. Each failed check is
// one error line, an *Error for a condition a person must change.
func Prepare(ctx context.Context, url string, s Setup, log *slog.Logger) (Prepared, error) {
	conn, err := connect(ctx, url)
	if err != nil {
		return Prepared{}, err // a *ConnectError, which says "cannot connect to PostgreSQL"
	}
	defer conn.Close(context.Background())

	if unmet, err := checkServer(ctx, conn); err != nil || unmet != nil {
		return Prepared{}, errors.Join(unmet, err)
	}
	if err := checkShards(ctx, conn, s); err != nil {
		return Prepared{}, err
	}

	// Before the tables are found: a table created meanwhile then joins
	// the publication by itself, or is created after the publication,
	// which is made of the tables found.
	if err := prepareMembership(ctx, conn, s, log); err != nil {
		return Prepared{}, err
	}
	found, err := FindOutboxes(ctx, conn, s.Outboxes)
	if err != nil {
		return Prepared{}, err
	}
	if found, err = checkShardColumns(ctx, conn, s, found, log); err != nil {
		return Prepared{}, err
	}
	if err := preparePublication(ctx, conn, s, found, log); err != nil {
		return Prepared{}, err
	}
	if err := checkFilters(ctx, conn, s, found); err != nil {
		return Prepared{}, err
	}
	if s.Shard.Split() && s.CreatePublication {
		// Every shard's publication before any shard's slot: a slot copied
		// from another shard's (copyShardSlot) streams from that one's
		// position, and pgoutput reads a publication as of the WAL it
		// decodes, where one created later does not exist yet.
		for _, sh := range shard.All(s.Shard.Count) {
			other := s
			other.Shard, other.Publication = sh, sh.Name(s.StreamPublication)
			if sh != s.Shard {
				if err := preparePublication(ctx, conn, other, found, log); err != nil {
					return Prepared{}, fmt.Errorf("shard %s: %w", sh, err)
				}
			}
		}
	}
	return prepareSlot(ctx, conn, url, s, log)
}

// checkServer checks what streaming needs of the server and of the role,
// which no flag can change: wal_level = logical, and a role with
// REPLICATION. unmet is the first condition not met; err, a failure to read
// them. Prepare and Inspect both ask it, so that status reports the cause
// that run would stop on.
func checkServer(ctx context.Context, conn *pgx.Conn) (unmet, err error) {
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return nil, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("wal_level is %q, logical decoding needs logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", walLevel), nil
	}

	var user string
	var canReplicate bool
	err = conn.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).
		Scan(&user, &canReplicate)
	if err != nil {
		return nil, fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		return fmt.Errorf("role %q lacks the REPLICATION attribute: run ALTER ROLE %s WITH REPLICATION", user, pgx.Identifier{user}.Sanitize()), nil
	}
	return nil, nil
}

// unloggedError is the outbox table t, UNLOGGED, which cannot be streamed.
func unloggedError(t Table) error {
	return fmt.Errorf("table %s is UNLOGGED: its rows are not written to the WAL, so they cannot be streamed; run ALTER TABLE %s SET LOGGED",
		t.Name, t.Name.Quoted())
}

// createPublication is the statement that creates the publication
// cdc-outbox streams. Insert-only: updates and deletes of the outbox are
// never published, so the insert-then-delete pattern costs nothing
// downstream. For a partitioned outbox, via the partition root: the rows of
// every partition arrive under the outbox's own relation id, whatever
// becomes of the partition they were written to (detached, dropped) before
// they are streamed. (The option means nothing for a table that is not
// partitioned, and PostgreSQL before 13 does not know it.)
//
// Several outboxes share one publication, which lists them all; with none
// yet (a pattern that matches no table), it lists none, and tables join it
// as they are created (sql/outbox-membership.sql).
//
// A shard's publication has each table's row filter (filters, in the order
// of ts; nil for a stream that is not split).
func createPublication(publication string, ts []Table, filters []string) string {
	options := "publish = 'insert'"
	var names []string
	partitioned := false
	for i, t := range ts {
		if filters != nil {
			names = append(names, t.Name.Quoted()+" WHERE ("+filters[i]+")")
			partitioned = partitioned || t.Partitioned
			continue
		}
		names = append(names, t.Name.Quoted())
		partitioned = partitioned || t.Partitioned
	}
	if partitioned {
		options += ", publish_via_partition_root = true"
	}
	if len(names) == 0 {
		return fmt.Sprintf("CREATE PUBLICATION %s WITH (%s)", pgname.Quote(publication), options)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)", pgname.Quote(publication), strings.Join(names, ", "), options)
}

// describeNames joins up to ten names; more are counted.
func describeNames(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}

func preparePublication(ctx context.Context, conn *pgx.Conn, s Setup, found []OutboxTable, log *slog.Logger) error {
	var ts []Table
	var logged []OutboxTable
	var filters []string
	for _, t := range found {
		switch {
		case t.Unlogged && s.Outboxes[t.Entry].IsGlob():
			// One tenant's table is no reason to stop the others; the
			// monitor says it again until it is fixed.
			log.Warn("a table matching an outbox pattern is UNLOGGED: its rows are not written to the WAL, so they cannot be streamed",
				"problem", unloggedError(t.Table).Error(), "table", t.Name.String(), "pattern", s.Outboxes[t.Entry].String())
			continue
		case t.Unlogged:
			return unloggedError(t.Table)
		}
		ts = append(ts, t.Table)
		logged = append(logged, t)
		if s.Shard.Split() {
			filters = append(filters, s.Shard.Filter(pgname.Quote(s.AggregateIDs[t.Entry])))
		}
	}
	found = logged
	pub := pgname.Quote(s.Publication)
	create := createPublication(s.Publication, ts, filters)
	var first pgname.Name // named in errors about the publication
	if len(ts) > 0 {
		first = ts[0].Name
	}
	p, err := readPublication(ctx, conn, s.Publication, false)
	switch {
	case err != nil:
		return err
	case !p.Exists && s.CreatePublication:
		if _, err := conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("create publication %s: %w", s.Publication, err)
		}
		if len(ts) == 1 {
			log.Info("created publication", "publication", s.Publication, "table", ts[0].Name.String(), "partitioned", ts[0].Partitioned)
			return nil
		}
		var names []string
		for _, t := range ts {
			names = append(names, t.Name.String())
		}
		log.Info("created publication", "publication", s.Publication, "tables", len(ts), "table_names", describeNames(names))
		return nil
	case !p.Exists:
		return &Error{Err: ErrNoPublication, Publication: s.Publication, Table: first, Statement: create,
			msg: fmt.Sprintf("publication %q does not exist", s.Publication)}
	}
	if !p.Inserts {
		return fmt.Errorf("publication %q does not publish inserts: run ALTER PUBLICATION %s SET (publish = 'insert')", s.Publication, pub)
	}
	for _, t := range found {
		err := checkCoverage(ctx, conn, s, t.Table, log)
		var e *Error
		if errors.As(err, &e) && e.Coverage != nil && s.Outboxes[t.Entry].IsGlob() {
			// One table of a pattern is no reason to stop the others: the
			// monitor says it again until it is fixed.
			log.Warn("a table matching an outbox pattern is not in the publication, or not wholly: inserts into what is missing are not streamed. "+
				"Fix it as the problem says, then re-publish the rows inserted meanwhile (cdc-outbox republish)",
				"problem", e.Error(), "table", t.Name.String(), "pattern", s.Outboxes[t.Entry].String(), "publication", s.Publication)
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkCoverage checks that the publication publishes every insert into the
// outbox t.
func checkCoverage(ctx context.Context, conn *pgx.Conn, s Setup, t Table, log *slog.Logger) error {
	pub := pgname.Quote(s.Publication)
	cov, err := Cover(ctx, conn, s.Publication, t)
	if err != nil {
		return err
	}
	if !cov.Complete() {
		return &Error{Err: ErrNotPublished, Publication: s.Publication, Table: t.Name, Coverage: &cov, msg: cov.Problem()}
	}
	if t.Partitioned && !cov.ViaRoot {
		// Still streamed: each partition is looked up and mapped to the
		// outbox. What cannot be mapped is a partition's row that was
		// detached or dropped before it was streamed; that row then stops
		// the stream (or goes to the dead-letter topic), never vanishes.
		log.Warn("the publication sends the rows of the partitioned outbox under each partition's relation (publish_via_partition_root is off): "+
			"cdc-outbox maps them to the outbox, but a partition detached or dropped before its rows are streamed leaves them unmappable "+
			"(a bad event). Run ALTER PUBLICATION "+pub+" SET (publish_via_partition_root = true)",
			"publication", s.Publication, "table", t.Name.String())
	}
	return nil
}

func prepareSlot(ctx context.Context, conn *pgx.Conn, url string, s Setup, log *slog.Logger) (Prepared, error) {
	major := serverMajor(conn.PgConn().ParameterStatus("server_version"))
	if s.Failover && major < failoverMajor {
		log.Info("failover slots need PostgreSQL 17 or newer: on this server the slot lives on the primary only, and a failover to a standby loses it "+
			"(cdc-outbox then stops and says how to recover; see High availability in docs/operating.md)", "server_major", major)
	}
	var plugin, database string
	var confirmed pglogrepl.LSN
	var current string
	var state SlotInfo // the columns that tell an invalidated slot
	var inactiveSince *time.Time
	var failover bool
	err := conn.QueryRow(ctx, `SELECT coalesce(plugin, ''), coalesce(database, ''), coalesce(confirmed_flush_lsn, '0/0')::text,
		current_database(), coalesce(wal_status, ''), `+slotColumns+`, coalesce((to_jsonb(s)->>'failover')::bool, false)
		FROM pg_replication_slots s WHERE slot_name = $1`, s.Slot).
		Scan(&plugin, &database, &confirmed, &current, &state.WALStatus, &state.InvalidationReason, &state.Conflicting, &inactiveSince, &failover)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && s.CreateSlot:
		return createSlot(ctx, conn, url, s, major, log)
	case errors.Is(err, pgx.ErrNoRows):
		return Prepared{}, &Error{Err: ErrSlotMissing, Slot: s.Slot, msg: fmt.Sprintf("replication slot %q does not exist", s.Slot)}
	case err != nil:
		return Prepared{}, fmt.Errorf("look up replication slot %s: %w", s.Slot, err)
	}
	if plugin != "pgoutput" {
		return Prepared{}, &Error{Err: ErrSlotPlugin, Slot: s.Slot, msg: fmt.Sprintf("replication slot %q uses plugin %q, not pgoutput", s.Slot, plugin)}
	}
	if database != current {
		return Prepared{}, &Error{Err: ErrSlotDatabase, Slot: s.Slot, msg: fmt.Sprintf("replication slot %q belongs to database %q, not %q", s.Slot, database, current)}
	}
	if state.Invalidated() {
		if !s.RecreateSlot {
			return Prepared{}, walLostError(s.Slot, confirmed, state.Reason(), nil)
		}
		// Asked for by name: the events after confirmed are given up on.
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Slot); err != nil {
			return Prepared{}, fmt.Errorf("drop replication slot %s, which lost its WAL (as asked): %w", s.Slot, err)
		}
		p, err := createSlot(ctx, conn, url, s, major, log)
		if err != nil {
			return p, fmt.Errorf("dropped replication slot %s, which lost its WAL (confirmed up to %s), as asked; then: %w", s.Slot, confirmed, err)
		}
		p.DroppedLost, p.LostConfirmed = true, confirmed
		return p, nil
	}
	if s.Failover && major >= failoverMajor && !failover {
		failoverSlot(ctx, url, s.Slot, log)
	}
	return Prepared{Start: confirmed, Slot: SlotFound}, nil
}

// failoverSlot switches an existing slot to a failover slot
// (ALTER_REPLICATION_SLOT, PostgreSQL 17+, on a replication connection):
// one made before Setup.Failover was asked for, by hand, or by an older
// cdc-outbox. Setup.Failover asks for a slot that survives a failover, and
// the switch costs nothing and loses nothing. It fails while another process streams
// from the slot (a hot standby instance starting beside the active one);
// that is no reason not to start, so it is a warning, and the next start
// tries again.
func failoverSlot(ctx context.Context, url, slot string, log *slog.Logger) {
	err := func() error {
		cfg, err := ParseConfig(url)
		if err != nil {
			return err
		}
		cfg.RuntimeParams["replication"] = "database"
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			return NewConnectError(url, err)
		}
		defer conn.Close(context.Background())
		// Slot names are [a-z0-9_] (checked with the configuration): no
		// quoting.
		_, err = conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+slot+" ( FAILOVER true )").ReadAll()
		return err
	}()
	if err != nil {
		log.Warn("could not make the slot a failover slot (ALTER_REPLICATION_SLOT ... (FAILOVER true)): a failover to a standby would lose it. "+
			"It is retried at the next start; or run it yourself on a replication connection: "+
			"psql \"dbname=<db> replication=database\" -c 'ALTER_REPLICATION_SLOT "+slot+" (FAILOVER true)'", "slot", slot, "error", err)
		return
	}
	log.Info("made the slot a failover slot: PostgreSQL synchronizes it to standbys with sync_replication_slots = on", "slot", slot)
}

// slotMarker is how cdc-outbox remembers, in the publication's comment,
// which slots it created. A slot that is missing but remembered was dropped
// (or lost) after streaming: creating it again would silently skip every
// change since, so that takes Setup.RecreateSlot.
const slotMarker = "cdc-outbox created replication slots:"

func createSlot(ctx context.Context, conn *pgx.Conn, url string, s Setup, major int, log *slog.Logger) (Prepared, error) {
	var comment string
	err := conn.QueryRow(ctx, `SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication WHERE pubname = $1`,
		s.Publication).Scan(&comment)
	if err != nil {
		return Prepared{}, fmt.Errorf("read the comment of publication %s: %w", s.Publication, err)
	}
	remembered := strings.Contains(comment, " "+s.Slot+" (")
	if remembered && !s.RecreateSlot {
		return Prepared{}, &Error{Err: ErrSlotForgotten, Slot: s.Slot, Publication: s.Publication,
			msg: fmt.Sprintf("replication slot %q existed (cdc-outbox created it; the publication's comment says %q) and is gone: "+
				"creating it again would skip every change committed since it was dropped", s.Slot, comment)}
	}
	failover := s.Failover && major >= failoverMajor
	lsn, from, err := copyShardSlot(ctx, conn, s)
	if err != nil {
		return Prepared{}, err
	}
	if from != "" {
		log.Info("created the shard's replication slot as a copy of another shard's, at its position, so that every shard streams from the same point on",
			"slot", s.Slot, "copy_of", from, "lsn", lsn)
		if failover {
			failoverSlot(ctx, url, s.Slot, log)
		}
	} else {
		lsn, err = createSlotWatched(ctx, conn, s.Slot, failover, log)
	}
	if err != nil && ctx.Err() != nil {
		return Prepared{}, fmt.Errorf("create replication slot %s: gave up waiting for the transactions that were running in the cluster to end "+
			"(the log names them: end them, then start again): %w", s.Slot, err)
	}
	if err != nil {
		return Prepared{}, fmt.Errorf("create replication slot %s: %w", s.Slot, err)
	}
	start, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return Prepared{}, err
	}
	if remembered {
		return Prepared{Start: start, Slot: SlotRecreated}, nil
	}
	if from == "" {
		log.Info("created replication slot: it streams transactions committed from now on", "slot", s.Slot, "lsn", start, "failover", failover)
	}
	if !strings.HasPrefix(comment, slotMarker) {
		comment = slotMarker
	}
	comment += fmt.Sprintf(" %s (%s)", s.Slot, start)
	_, err = conn.Exec(ctx, fmt.Sprintf("COMMENT ON PUBLICATION %s IS %s", pgx.Identifier{s.Publication}.Sanitize(), quoteLiteral(comment)))
	if err != nil {
		// Only the owner may comment. Without the marker a dropped slot
		// cannot be told from a first start, so say so now.
		log.Warn("could not remember the slot in the publication's comment; if the slot is ever dropped, the next start creates a new one without asking",
			"publication", s.Publication, "error", err)
	}
	return Prepared{Start: start, Slot: SlotCreated}, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
