package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// rowFilterMajor is the first PostgreSQL major with row filters, which
// shards are made of.
const rowFilterMajor = 15

// checkShards refuses a stream split in shards on a server without row
// filters, and a stream split in another number of shards (or not split)
// than the slots of its names on the server: each of those holds a
// position of its own, and a stream beside them would stream their
// aggregates twice, or leave their WAL held forever. (Publications hold no
// position: the stream's own, one not split, may stay beside its shards'.)
func checkShards(ctx context.Context, conn *pgx.Conn, s Setup) error {
	if s.Shard.Split() {
		version := conn.PgConn().ParameterStatus("server_version")
		if serverMajor(version) < rowFilterMajor {
			return &Error{Err: ErrShardsVersion, Slot: s.Slot, Publication: s.Publication,
				msg: fmt.Sprintf("the stream is split in %d shards, which needs row filters (PostgreSQL 15 or newer); the server is PostgreSQL %s", s.Shard.Count, version)}
		}
	}
	if s.Shard.Split() {
		if err := checkHash(ctx, conn); err != nil {
			return err
		}
	}
	slot := s.StreamSlot
	if slot == "" {
		slot = s.Slot
	}
	var slots []string
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}') FROM pg_replication_slots
		WHERE slot_name = $1 OR left(slot_name, length($1) + 7) = $1 || '_shard_'`, slot).Scan(&slots)
	if err != nil {
		return fmt.Errorf("read the replication slots of stream %s: %w", slot, err)
	}
	want := max(s.Shard.Count, 1)
	if other := otherCounts(slot, slots, want); len(other) > 0 {
		asked := "not split"
		if want > 1 {
			asked = fmt.Sprintf("split in %d shards", want)
		}
		return &Error{Err: ErrShardCount, Slot: s.Slot,
			msg: fmt.Sprintf("the stream is asked to be %s, and the server holds replication slots of it split otherwise: %s", asked, describeNames(other))}
	}
	return nil
}

// hashProbes are texts whose hashtext the server computes at start, to
// compare with shard.Hash: lengths that end lookup3's blocks in each way,
// and a multibyte one.
var hashProbes = []string{"", "a", "order-42", "cdc-outbox shards", "0123456789ab", "0123456789abcdef0123", "aggregate é 😀 漢字"}

// checkHash refuses shards on a server whose hashtext is not shard.Hash:
// the row filters would put an aggregate's rows in one shard and its
// messages, kept by shard.Hash, in another.
func checkHash(ctx context.Context, conn *pgx.Conn) error {
	var server []int32
	if err := conn.QueryRow(ctx, `SELECT array_agg(hashtext(p) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS u(p, i)`, hashProbes).Scan(&server); err != nil {
		return fmt.Errorf("read the server's hashtext: %w", err)
	}
	for i, p := range hashProbes {
		if i >= len(server) || server[i] != int32(shard.Hash(p)) {
			return &Error{Err: ErrShardsHash,
				msg: fmt.Sprintf("the server's hashtext(%q) is not the streamer's %d (a big-endian server?): shards need the server to hash as the streamer does", p, int32(shard.Hash(p)))}
		}
	}
	return nil
}

// otherCounts are the names among names, made from base (base itself for a
// stream not split, shard.Shard.Name for a shard), that belong to a stream
// split in another number of shards than want.
func otherCounts(base string, names []string, want int) []string {
	var other []string
	for _, name := range names {
		count := 1
		if name != base {
			sh, ok := shard.Parse(base, name)
			if !ok {
				continue // another stream's name that begins like this one's
			}
			count = sh.Count
		}
		if count != want {
			other = append(other, name)
		}
	}
	return other
}

// checkShardColumns checks that every outbox table of a shard has its
// aggregate id column, of type text or varchar: hashtext takes text, and a
// row filter allows no cast (uuid::text is refused), so another type
// cannot be split. A named table that does not fit stops the start; one a
// pattern matches is left out, with a warning (one tenant's table is no
// reason to stop the others'). It returns the tables that fit.
func checkShardColumns(ctx context.Context, conn *pgx.Conn, s Setup, found []OutboxTable, log *slog.Logger) ([]OutboxTable, error) {
	if !s.Shard.Split() {
		return found, nil
	}
	var fit []OutboxTable
	for _, t := range found {
		column := s.AggregateIDs[t.Entry]
		var typ string
		var text, deterministic bool
		err := conn.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod), atttypid IN ('text'::regtype, 'varchar'::regtype),
			coalesce((SELECT collisdeterministic FROM pg_collation WHERE oid = attcollation), true)
			FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped`, t.OID, column).Scan(&typ, &text, &deterministic)
		var unfit error
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			unfit = &Error{Err: ErrShardColumn, Table: t.Name, Publication: s.Publication,
				msg: fmt.Sprintf("outbox table %s has no column %q, the aggregate id its shards are split by", t.Name, column)}
		case err != nil:
			return nil, fmt.Errorf("read the aggregate id column %s of %s: %w", column, t.Name, err)
		case !text:
			unfit = &Error{Err: ErrShardColumn, Table: t.Name, Publication: s.Publication,
				msg: fmt.Sprintf("the aggregate id column %q of %s is %s: shards split by hashtext(%s) in a row filter, which takes text or varchar and no cast", column, t.Name, typ, pgname.Quote(column))}
		case !deterministic:
			// hashtext of a nondeterministic collation hashes ICU's sort
			// key, not the bytes the streamer hashes.
			unfit = &Error{Err: ErrShardColumn, Table: t.Name, Publication: s.Publication,
				msg: fmt.Sprintf("the aggregate id column %q of %s has a nondeterministic collation, whose hashtext the streamer cannot compute", column, t.Name)}
		}
		switch {
		case unfit == nil:
			fit = append(fit, t)
		case s.Outboxes[t.Entry].IsGlob():
			log.Warn("a table matching an outbox pattern cannot be split in shards, and is not streamed", "problem", unfit.Error(),
				"table", t.Name.String(), "pattern", s.Outboxes[t.Entry].String(), "publication", s.Publication)
		default:
			return nil, unfit
		}
	}
	return fit, nil
}

// checkFilters checks that a shard's publication publishes each outbox
// table with the shard's row filter: one made by hand, or by another count
// of shards, would stream other aggregates than the shard's messages.
func checkFilters(ctx context.Context, conn *pgx.Conn, s Setup, found []OutboxTable) error {
	if !s.Shard.Split() {
		return nil
	}
	for _, t := range found {
		if t.Unlogged {
			continue
		}
		var filters []string
		err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(coalesce(rowfilter, '')), '{}') FROM pg_publication_tables
			WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`, s.Publication, t.Name.Schema, t.Name.Relation).Scan(&filters)
		if err != nil {
			return fmt.Errorf("read the row filter of %s in publication %s: %w", t.Name, s.Publication, err)
		}
		column := s.AggregateIDs[t.Entry]
		if slices.ContainsFunc(filters, func(f string) bool { return !s.Shard.SameFilter(f, column) }) {
			return &Error{Err: ErrShardFilter, Table: t.Name, Publication: s.Publication,
				msg: fmt.Sprintf("publication %q publishes %s with row filter %q, not shard %s's %s", s.Publication, t.Name,
					strings.Join(filters, " "), s.Shard, s.Shard.Filter(pgname.Quote(column)))}
		}
	}
	return nil
}

// copyShardSlot makes a shard's missing slot as a copy of another shard's
// slot of the stream (pg_copy_logical_replication_slot), the one whose
// confirmed position is oldest, and returns the copy's start and the
// source's name; "" when the stream has no other shard's slot to copy.
//
// Created fresh, a shard's slot streams what commits from its creation on.
// A first start creates the K slots one after the other, each waiting for
// the transactions running in the cluster, so a fresh later slot would
// miss the rows its aggregates committed meanwhile, which no other shard
// streams either (its row filter keeps them out). A copy starts at its
// source's position instead: the row filter is the publication's, named
// when streaming starts, so the copy streams its own shard's rows from
// there, and every shard's slot begins where the oldest does. A copy is
// never a failover slot (PostgreSQL does not copy that property), so
// prepareSlot switches it when asked.
func copyShardSlot(ctx context.Context, conn *pgx.Conn, s Setup) (start string, from string, err error) {
	if !s.Shard.Split() {
		return "", "", nil
	}
	var siblings []string
	for _, sh := range shard.All(s.Shard.Count) {
		if sh.Index != s.Shard.Index {
			siblings = append(siblings, sh.Name(s.StreamSlot))
		}
	}
	// An invalidated slot cannot be copied (and holds no WAL to stream):
	// wal_status lost.
	err = conn.QueryRow(ctx, `SELECT slot_name FROM pg_replication_slots
		WHERE slot_name = ANY($1) AND plugin = 'pgoutput' AND database = current_database()
		  AND confirmed_flush_lsn IS NOT NULL AND coalesce(wal_status, '') <> 'lost'
		ORDER BY confirmed_flush_lsn, slot_name LIMIT 1`, siblings).Scan(&from)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("look up the slots of the stream's other shards: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2)`, from, s.Slot); err != nil {
		return "", "", fmt.Errorf("copy replication slot %s to %s: %w", from, s.Slot, err)
	}
	if err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s.Slot).Scan(&start); err != nil {
		return "", "", fmt.Errorf("read the position of replication slot %s, copied from %s: %w", s.Slot, from, err)
	}
	return start, from, nil
}
