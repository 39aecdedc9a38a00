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

	"github.com/cdc-outbox/cdc-outbox/internal/pgname"
)

// Setup names what streaming reads from and what Prepare may create.
type Setup struct {
	Table             pgname.Name
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
}

// failoverMajor is the first PostgreSQL major with failover slots.
const failoverMajor = 17

// Prepare checks, on a normal connection to url, everything streaming needs,
// creates the publication and slot when missing and allowed, and returns the
// slot's confirmed position: where streaming starts. Each failed check is one
// error line that says how to fix it.
func Prepare(ctx context.Context, url string, s Setup, log *slog.Logger) (pglogrepl.LSN, error) {
	conn, err := ConnectPrimary(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("connect to PostgreSQL: %w", ExplainConnect(err))
	}
	defer conn.Close(context.Background())

	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return 0, fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return 0, fmt.Errorf("wal_level is %q, logical decoding needs logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", walLevel)
	}

	var user string
	var canReplicate bool
	err = conn.QueryRow(ctx, `SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user`).
		Scan(&user, &canReplicate)
	if err != nil {
		return 0, fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		return 0, fmt.Errorf("role %q lacks the REPLICATION attribute: run ALTER ROLE %s WITH REPLICATION", user, pgx.Identifier{user}.Sanitize())
	}

	t, err := FindTable(ctx, conn, s.Table)
	if errors.Is(err, ErrNoTable) {
		return 0, fmt.Errorf("table %s does not exist: create it (sql/publication.sql has the default) or point --table at yours "+
			"(quote a name that has capitals, dots or spaces: --table '\"Billing\".\"Outbox Events\"')", s.Table)
	}
	if err != nil {
		return 0, err
	}
	if t.Unlogged {
		return 0, fmt.Errorf("table %s is UNLOGGED: its rows are not written to the WAL, so they cannot be streamed; run ALTER TABLE %s SET LOGGED",
			t.Name, t.Name.Quoted())
	}

	if err := preparePublication(ctx, conn, s, t, log); err != nil {
		return 0, err
	}
	return prepareSlot(ctx, conn, url, s, log)
}

// createPublication is the statement that creates the publication
// cdc-outbox streams. Insert-only: updates and deletes of the outbox are
// never published, so the insert-then-delete pattern costs nothing
// downstream. For a partitioned outbox, via the partition root: the rows of
// every partition arrive under the outbox's own relation id, whatever
// becomes of the partition they were written to (detached, dropped) before
// they are streamed. (The option means nothing for a table that is not
// partitioned, and PostgreSQL before 13 does not know it.)
func createPublication(publication string, t Table) string {
	options := "publish = 'insert'"
	if t.Partitioned {
		options += ", publish_via_partition_root = true"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s)", pgname.Quote(publication), t.Name.Quoted(), options)
}

func preparePublication(ctx context.Context, conn *pgx.Conn, s Setup, t Table, log *slog.Logger) error {
	pub := pgname.Quote(s.Publication)
	create := createPublication(s.Publication, t)
	var inserts bool
	err := conn.QueryRow(ctx, `SELECT pubinsert FROM pg_publication WHERE pubname = $1`, s.Publication).Scan(&inserts)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && s.CreatePublication:
		if _, err := conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("create publication %s: %w", s.Publication, err)
		}
		log.Info("created publication", "publication", s.Publication, "table", t.Name.String(), "partitioned", t.Partitioned)
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("publication %q does not exist: run %s, or start with --create-publication", s.Publication, create)
	case err != nil:
		return fmt.Errorf("look up publication %s: %w", s.Publication, err)
	}
	if !inserts {
		return fmt.Errorf("publication %q does not publish inserts: run ALTER PUBLICATION %s SET (publish = 'insert')", s.Publication, pub)
	}
	cov, err := Cover(ctx, conn, s.Publication, t)
	if err != nil {
		return err
	}
	if !cov.Complete() {
		return errors.New(cov.Problem())
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

func prepareSlot(ctx context.Context, conn *pgx.Conn, url string, s Setup, log *slog.Logger) (pglogrepl.LSN, error) {
	major := serverMajor(conn.PgConn().ParameterStatus("server_version"))
	if s.Failover && major < failoverMajor {
		log.Info("failover slots need PostgreSQL 17 or newer: on this server the slot lives on the primary only, and a failover to a standby loses it "+
			"(cdc-outbox then stops and says how to recover with cdc-outbox republish; see High availability in the README)", "server_major", major)
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
		return createSlot(ctx, conn, s, major, log)
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("replication slot %q does not exist: start with --create-slot, or run SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", s.Slot, s.Slot)
	case err != nil:
		return 0, fmt.Errorf("look up replication slot %s: %w", s.Slot, err)
	}
	if plugin != "pgoutput" {
		return 0, fmt.Errorf("replication slot %q uses plugin %q, not pgoutput: choose another --slot, or drop that slot if nothing else uses it", s.Slot, plugin)
	}
	if database != current {
		return 0, fmt.Errorf("replication slot %q belongs to database %q, not %q: connect to that database or choose another --slot", s.Slot, database, current)
	}
	if state.Invalidated() {
		if !s.RecreateSlot {
			return 0, walLostError(s.Slot, confirmed, state.Reason(), nil)
		}
		// Asked for by name: the events after confirmed are given up on.
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Slot); err != nil {
			return 0, fmt.Errorf("drop replication slot %s, which lost its WAL (--recreate-slot): %w", s.Slot, err)
		}
		log.Warn("dropped the replication slot that lost its WAL (--recreate-slot): outbox events committed after its last confirmed position "+
			"and before the new slot are not streamed", "slot", s.Slot, "confirmed_lsn", confirmed)
		return createSlot(ctx, conn, s, major, log)
	}
	if s.Failover && major >= failoverMajor && !failover {
		failoverSlot(ctx, url, s.Slot, log)
	}
	return confirmed, nil
}

// failoverSlot switches an existing slot to a failover slot
// (ALTER_REPLICATION_SLOT, PostgreSQL 17+, on a replication connection):
// one made before --slot-failover, by hand, or by an older cdc-outbox.
// --slot-failover asks for a slot that survives a failover, and the switch
// costs nothing and loses nothing. It fails while another process streams
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
			return ExplainConnect(err)
		}
		defer conn.Close(context.Background())
		// Slot names are [a-z0-9_] (checked with the flags): no quoting.
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
// change since, so that takes --recreate-slot.
const slotMarker = "cdc-outbox created replication slots:"

func createSlot(ctx context.Context, conn *pgx.Conn, s Setup, major int, log *slog.Logger) (pglogrepl.LSN, error) {
	var comment string
	err := conn.QueryRow(ctx, `SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication WHERE pubname = $1`,
		s.Publication).Scan(&comment)
	if err != nil {
		return 0, fmt.Errorf("read the comment of publication %s: %w", s.Publication, err)
	}
	remembered := strings.Contains(comment, " "+s.Slot+" (")
	if remembered && !s.RecreateSlot {
		return 0, fmt.Errorf("replication slot %q existed (cdc-outbox created it; the publication's comment says %q) and is gone: "+
			"creating it again would skip every change committed since it was dropped. Start once with --recreate-slot (a new slot, streaming from "+
			"its creation on), then re-publish the outbox rows committed since the old one stopped from the table with cdc-outbox republish "+
			"--after-id <the last id up to which Kafka has every event> (or --since <time>)", s.Slot, comment)
	}
	lsn, err := createSlotWatched(ctx, conn, s.Slot, s.Failover && major >= failoverMajor, log)
	if err != nil && ctx.Err() != nil {
		return 0, fmt.Errorf("create replication slot %s: gave up waiting for the transactions that were running in the cluster to end "+
			"(the log names them: end them, then start again): %w", s.Slot, err)
	}
	if err != nil {
		return 0, fmt.Errorf("create replication slot %s: %w", s.Slot, err)
	}
	start, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return 0, err
	}
	if remembered {
		log.Warn("re-created the replication slot (--recreate-slot): changes committed before it are not streamed", "slot", s.Slot, "lsn", start)
		return start, nil
	}
	log.Info("created replication slot: it streams transactions committed from now on", "slot", s.Slot, "lsn", start, "failover", s.Failover && major >= failoverMajor)
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
	return start, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
