package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// CatalogOutbox is one configured outbox: a table, or a pattern of names
// that any number of tables may match, now or later.
type CatalogOutbox struct {
	Pattern pgname.Pattern
	// Required are the columns every row of it has (its mapping's
	// required columns): a table that has them all may be an outbox, so
	// its inserts are never skipped as another table's.
	Required []string
}

// CatalogConfig says which tables are the outboxes.
type CatalogConfig struct {
	URL string // a normal connection's; the same database as the stream's
	// Outboxes in the configured order: a table matched by two is the
	// first's.
	Outboxes    []CatalogOutbox
	Publication string // for the advice in messages
	// Timeout bounds one lookup; the replication loop waits for it, so it
	// must stay well below wal_sender_timeout.
	Timeout time.Duration
}

// Catalog tells the pipeline what the relations the stream describes are,
// from the catalog as it is now. It finds the outboxes at start, by name or
// pattern, and then follows each by identity: renamed or moved, it is the
// same relation. A table that matches a pattern later (a new tenant's
// outbox) is an outbox from its first row on. Not safe for concurrent use:
// the replication loop owns it.
type Catalog struct {
	cfg  CatalogConfig
	conn *pgx.Conn
	// prefix is "<system identifier>/<database OID>/": a table's identity
	// is it and the table's OID.
	prefix string
	found  []decoder.Outbox          // at start, in the order found
	known  map[uint32]decoder.Outbox // by the outbox table's OID: found at start or since
}

// OpenCatalog connects and finds the outbox tables: each configured table
// must exist (an *Error wrapping ErrNoTable names it); a pattern may match
// none yet.
func OpenCatalog(ctx context.Context, cfg CatalogConfig) (*Catalog, error) {
	c := &Catalog{cfg: cfg, known: make(map[uint32]decoder.Outbox)}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	err := c.conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text || '/' ||
		(SELECT oid FROM pg_database WHERE datname = current_database())::text || '/'`).Scan(&c.prefix)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read the system identifier and the database's OID: %w", err)
	}
	tables, err := FindOutboxes(ctx, c.conn, patterns(cfg.Outboxes))
	if err != nil {
		c.Close()
		return nil, err
	}
	for _, t := range tables {
		o := c.outbox(t.Entry, t.Relation)
		c.found = append(c.found, o)
		c.known[o.OID] = o
	}
	return c, nil
}

func patterns(outboxes []CatalogOutbox) []pgname.Pattern {
	ps := make([]pgname.Pattern, len(outboxes))
	for i, o := range outboxes {
		ps[i] = o.Pattern
	}
	return ps
}

func (c *Catalog) outbox(entry int, r Relation) decoder.Outbox {
	return decoder.Outbox{Entry: entry, OID: r.OID, Schema: r.Name.Schema, Name: r.Name.Relation, Identity: fmt.Sprintf("%s%d", c.prefix, r.OID)}
}

// Outboxes are the outbox tables found at start, in the configured order
// and by name within a pattern.
func (c *Catalog) Outboxes() []decoder.Outbox { return slices.Clone(c.found) }

func (c *Catalog) connect(ctx context.Context) error {
	conn, err := connect(ctx, c.cfg.URL)
	if err != nil {
		return fmt.Errorf("%w: connect: %w", ErrCatalog, err)
	}
	c.conn = conn
	return nil
}

// Close closes the catalog's connection.
func (c *Catalog) Close() {
	if c.conn != nil {
		c.conn.Close(context.Background())
		c.conn = nil
	}
}

// OutboxTable is a table that is one of the configured outboxes.
type OutboxTable struct {
	Table
	Entry int // which configured outbox, by position
}

// FindOutboxes finds the tables the patterns name now, each once, for the
// first pattern that matches it: a pattern without wildcards names a table
// that must exist (an *Error wrapping ErrNoTable or ErrNotTable names it);
// a pattern with wildcards matches the tables (not views, not partitions,
// whose rows are their table's) of matching names.
func FindOutboxes(ctx context.Context, conn *pgx.Conn, ps []pgname.Pattern) ([]OutboxTable, error) {
	var out []OutboxTable
	seen := map[uint32]bool{}
	var all []Table // every table, read once for the first pattern with wildcards
	for i, p := range ps {
		if !p.IsGlob() {
			t, err := FindTable(ctx, conn, p.Name())
			if errors.Is(err, ErrNoTable) {
				return nil, &Error{Err: ErrNoTable, Table: p.Name(), msg: fmt.Sprintf("table %s does not exist", p.Name())}
			}
			if err != nil {
				return nil, err
			}
			if !seen[t.OID] {
				seen[t.OID] = true
				out = append(out, OutboxTable{Table: t, Entry: i})
			}
			continue
		}
		if all == nil {
			var err error
			if all, err = tables(ctx, conn); err != nil {
				return nil, err
			}
		}
		for _, t := range all {
			if p.Match(t.Name) && !seen[t.OID] {
				seen[t.OID] = true
				out = append(out, OutboxTable{Table: t, Entry: i})
			}
		}
	}
	return out, nil
}

// tables lists the tables of the database that may be outboxes, by name:
// tables and partitioned tables that are not partitions, outside the
// system's schemas, and not temporary: a temporary table (any session's,
// in its pg_temp_N schema) is never written to the WAL nor publishable.
func tables(ctx context.Context, conn *pgx.Conn) ([]Table, error) {
	rows, _ := conn.Query(ctx, `SELECT c.oid, n.nspname::text, c.relname::text, c.relkind = 'p', c.relpersistence = 'u'
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence <> 't'
		AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
		ORDER BY 2, 3`)
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Table, error) {
		var t Table
		err := row.Scan(&t.OID, &t.Name.Schema, &t.Name.Relation, &t.Partitioned, &t.Unlogged)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the tables that may be outboxes: %w", err)
	}
	return ts, nil
}

// FindTemporary finds the temporary tables, of any session, whose names
// match a pattern with wildcards ("*.outbox" matches pg_temp_3.outbox).
// They are never outboxes: their rows are never written to the WAL, and
// PostgreSQL refuses to publish them. They are listed to be reported, in
// case one was meant as an outbox.
func FindTemporary(ctx context.Context, conn *pgx.Conn, ps []pgname.Pattern) ([]OutboxTable, error) {
	rows, _ := conn.Query(ctx, `SELECT c.oid, n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence = 't' ORDER BY 2, 3`)
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Table, error) {
		var t Table
		err := row.Scan(&t.OID, &t.Name.Schema, &t.Name.Relation)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the temporary tables: %w", err)
	}
	var out []OutboxTable
	for _, t := range ts {
		if i := slices.IndexFunc(ps, func(p pgname.Pattern) bool { return p.IsGlob() && p.Match(t.Name) }); i >= 0 {
			out = append(out, OutboxTable{Table: t, Entry: i})
		}
	}
	return out, nil
}

// relNode is one relation near the one looked up: itself, a table it is a
// partition or inheritance child of, or a partition of it.
type relNode struct {
	oid  uint32
	name pgname.Name
	kind string // relkind
}

// relationFacts is what the catalog says now about one relation.
type relationFacts struct {
	exists bool
	name   pgname.Name // now, when it exists
	// up is the relation (when it exists) and the tables it is a partition
	// or inheritance child of, at any depth, nearest first.
	up []relNode
	// down are its partitions, at any depth (not inheritance children: an
	// inheritance parent's rows are its own, never its children's).
	down []relNode
}

// Classify says what rel is: an outbox (a partition of one, a table renamed
// or moved, a table that matches a pattern now), provably another table,
// or neither; for an outbox, which; why is a phrase for the log (outbox or
// other) or for the bad-event error (unmapped). It is called from the
// replication loop for a Relation message of a relation not yet known as an
// outbox's. Errors wrap ErrCatalog.
//
// The catalog says what is true now, and the row was written earlier: a
// partition attached since is fine (its Relation message comes after the
// attach was committed, so the catalog has it), but one detached or dropped
// since is not the outbox's any more. So only a relation that provably is
// not an outbox is another table; see classify.
func (c *Catalog) Classify(rel *decoder.Relation) (role decoder.Role, outbox decoder.Outbox, why string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	if c.conn == nil || c.conn.IsClosed() {
		if err := c.connect(ctx); err != nil {
			return 0, outbox, "", err
		}
	}
	f, err := readFacts(ctx, c.conn, rel.ID)
	if err != nil {
		// The connection may be the problem; the next lookup opens another.
		c.Close()
		return 0, outbox, "", fmt.Errorf("%w: look up relation %s.%s (OID %d): %w", ErrCatalog, rel.Namespace, rel.Name, rel.ID, err)
	}
	role, entry, table, why := classify(rel, f, c.cfg.Outboxes, c.known, c.cfg.Publication)
	if role == decoder.RoleOutbox {
		if o, ok := c.known[table.OID]; ok {
			return role, o, why, nil
		}
		outbox = c.outbox(entry, table)
		c.known[outbox.OID] = outbox
	}
	return role, outbox, why, nil
}

func readFacts(ctx context.Context, conn *pgx.Conn, oid uint32) (relationFacts, error) {
	var f relationFacts
	// Depth is bounded: pg_inherits has no cycles, but a bound costs
	// nothing.
	rows, _ := conn.Query(ctx, `WITH RECURSIVE
		up(oid, depth) AS (
			SELECT $1::oid, 0
			UNION ALL
			SELECT i.inhparent, u.depth + 1 FROM pg_inherits i JOIN up u ON i.inhrelid = u.oid WHERE u.depth < 64
		),
		down(oid, depth) AS (
			SELECT $1::oid, 0
			UNION ALL
			SELECT i.inhrelid, d.depth + 1 FROM pg_inherits i JOIN down d ON i.inhparent = d.oid
			JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relispartition AND d.depth < 64
		)
		SELECT true, u.depth, c.oid, n.nspname::text, c.relname::text, c.relkind::text
		FROM up u JOIN pg_class c ON c.oid = u.oid JOIN pg_namespace n ON n.oid = c.relnamespace
		UNION ALL
		SELECT false, d.depth, c.oid, n.nspname::text, c.relname::text, c.relkind::text
		FROM down d JOIN pg_class c ON c.oid = d.oid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE d.depth > 0
		ORDER BY 1 DESC, 2`, oid)
	var up bool
	var depth int
	var n relNode
	_, err := pgx.ForEachRow(rows, []any{&up, &depth, &n.oid, &n.name.Schema, &n.name.Relation, &n.kind}, func() error {
		switch {
		case up && depth == 0:
			f.exists, f.name = true, n.name
			f.up = append(f.up, n)
		case up:
			f.up = append(f.up, n)
		default:
			f.down = append(f.down, n)
		}
		return nil
	})
	return f, err
}

// classify decides from the catalog's facts and the Relation message (the
// relation's name and columns when the row was written) which outbox rel
// belongs to, if any, and returns that outbox's configured entry and table.
// In order:
//
//   - a known outbox table (found at start or since), or a partition or
//     inheritance child of one: that outbox (the topmost, for a table
//     nested in another);
//   - a table of a configured name or matching a pattern now, or a
//     partition or inheritance child of one: that table, a new outbox;
//   - of a configured name or matching a pattern when the row was written
//     (the Relation message's name): an outbox, whatever it is called now,
//     because the services wrote it by that name;
//   - a table an outbox is a partition of: unmapped, because a publication
//     that publishes it via its root sends the rows of all its partitions
//     under its id, the outbox's among them;
//   - gone from the catalog: unmapped, because it may have been a
//     partition of an outbox that was dropped since;
//   - having every required column of an outbox: unmapped, because it may
//     have been a partition of an outbox that was detached since, or be
//     another outbox sharing the publication;
//   - anything else: another table, skipped.
func classify(rel *decoder.Relation, f relationFacts, outboxes []CatalogOutbox, known map[uint32]decoder.Outbox, publication string) (role decoder.Role, entry int, table Relation, why string) {
	pub := pgname.Quote(publication)
	match := func(n pgname.Name) int {
		return slices.IndexFunc(outboxes, func(o CatalogOutbox) bool { return o.Pattern.Match(n) })
	}
	// what names the outbox that table t is, and rel's place in it.
	what := func(t relNode, was pgname.Name) string {
		switch {
		case t.oid == rel.ID && t.name == was:
			return "the outbox table"
		case t.oid == rel.ID:
			return "the outbox table " + was.String() + ", renamed or moved (now " + t.name.String() + ")"
		}
		return "a partition or inheritance child of the outbox table " + t.name.String() + " (now " + f.name.String() + ")"
	}
	for i := len(f.up) - 1; i >= 0; i-- {
		if o, ok := known[f.up[i].oid]; ok {
			n := f.up[i]
			return decoder.RoleOutbox, o.Entry, Relation{OID: n.oid, Name: n.name}, what(n, pgname.Name{Schema: o.Schema, Relation: o.Name})
		}
	}
	for i := len(f.up) - 1; i >= 0; i-- {
		n := f.up[i]
		if e := match(n.name); e >= 0 && (n.kind == "r" || n.kind == "p") {
			return decoder.RoleOutbox, e, Relation{OID: n.oid, Name: n.name}, what(n, n.name)
		}
	}
	written := pgname.Name{Schema: rel.Namespace, Relation: rel.Name}
	if e := match(written); e >= 0 {
		return decoder.RoleOutbox, e, Relation{OID: rel.ID, Name: written}, "named " + written.String() + " when its rows were written"
	}
	for _, n := range f.down {
		_, isKnown := known[n.oid]
		if e := match(n.name); isKnown || e >= 0 {
			return decoder.RoleUnmapped, -1, Relation{}, fmt.Sprintf("it is a partitioned table that the outbox %s is a partition of, and the publication sends its rows "+
				"(publish_via_partition_root), so the outbox's rows cannot be told from its other partitions': "+
				"stream the outbox through a publication of its own instead (CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true))",
				n.name, n.name.Quoted())
		}
	}
	if !f.exists {
		return decoder.RoleUnmapped, -1, Relation{}, fmt.Sprintf("it no longer exists, so whether it was a partition of an outbox cannot be told: with "+
			"publish_via_partition_root off, a partition's rows arrive under the partition, and this one was dropped before its rows were streamed. "+
			"Run ALTER PUBLICATION %s SET (publish_via_partition_root = true) so partitions' rows arrive as the outbox's", pub)
	}
	for _, o := range outboxes {
		if hasColumns(rel, o.Required) {
			return decoder.RoleUnmapped, -1, Relation{}, fmt.Sprintf("it has the outbox's columns but is not an outbox (%s) nor one of their partitions (now %s): "+
				"either a partition detached before its rows were streamed (attach it again and restart; detach partitions only once their rows are streamed, "+
				"or run ALTER PUBLICATION %s SET (publish_via_partition_root = true)), "+
				"or another outbox table in the same publication (name it among the outboxes, or give each outbox a publication of its own)", describePatterns(outboxes), f.name, pub)
		}
	}
	return decoder.RoleOther, -1, Relation{}, "another table of the publication, not an outbox (" + describePatterns(outboxes) + ")"
}

// describePatterns names the configured outboxes: "public.outbox",
// "svc_a.outbox, tenant_*.outbox".
func describePatterns(outboxes []CatalogOutbox) string {
	var names []string
	for _, o := range outboxes {
		names = append(names, o.Pattern.String())
	}
	return strings.Join(names, ", ")
}

// MissingColumns are those of names that table oid lacks now (dropped
// columns aside), in the order given.
func (c *Catalog) MissingColumns(ctx context.Context, oid uint32, names []string) ([]string, error) {
	if c.conn == nil || c.conn.IsClosed() {
		if err := c.connect(ctx); err != nil {
			return nil, err
		}
	}
	rows, _ := c.conn.Query(ctx, `SELECT n FROM unnest($2::text[]) WITH ORDINALITY AS u(n, i)
		WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attname = u.n AND a.attnum > 0 AND NOT a.attisdropped)
		ORDER BY i`, oid, names)
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the columns of table OID %d: %w", oid, err)
	}
	return missing, nil
}
