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
	"github.com/cdc-outbox/cdc-outbox/internal/pgname"
)

// ErrCatalog means the catalog could not be read while streaming. Streaming
// resumes on a new connection, from the confirmed position: the server sends
// the open transaction again, and the relation is looked up again.
var ErrCatalog = errors.New("could not read the catalog")

// ErrNoTable means the outbox table does not exist.
var ErrNoTable = errors.New("the outbox table does not exist")

// ErrNotTable means --table names a relation that is not a table.
var ErrNotTable = errors.New("--table does not name a table")

// Relation is a table by identity, with its name as the catalog has it now.
type Relation struct {
	OID  uint32
	Name pgname.Name
}

func (r Relation) String() string { return fmt.Sprintf("%s (OID %d)", r.Name, r.OID) }

// Table is the outbox table as found by name.
type Table struct {
	Relation
	Partitioned bool // relkind p: its rows live in its partitions
	Unlogged    bool // relpersistence u: its rows are not in the WAL
}

// FindTable looks up the table --table names, on a normal connection. A
// name that is not a table (a view, a sequence) is an error that says so;
// a missing one is ErrNoTable.
func FindTable(ctx context.Context, conn *pgx.Conn, name pgname.Name) (Table, error) {
	return findTable(ctx, conn, name.String(), `n.nspname = $1 AND c.relname = $2`, name.Schema, name.Relation)
}

// tableByOID is FindTable by identity.
func tableByOID(ctx context.Context, conn *pgx.Conn, oid uint32) (Table, error) {
	return findTable(ctx, conn, fmt.Sprintf("OID %d", oid), `c.oid = $1::oid`, oid)
}

func findTable(ctx context.Context, conn *pgx.Conn, what, where string, args ...any) (Table, error) {
	var t Table
	var kind, persistence string
	err := conn.QueryRow(ctx, `SELECT c.oid, n.nspname::text, c.relname::text, c.relkind::text, c.relpersistence::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE `+where, args...).
		Scan(&t.OID, &t.Name.Schema, &t.Name.Relation, &kind, &persistence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return t, fmt.Errorf("%w: %s", ErrNoTable, what)
	case err != nil:
		return t, fmt.Errorf("look up table %s: %w", what, err)
	}
	switch kind {
	case "r":
	case "p":
		t.Partitioned = true
	default:
		return t, fmt.Errorf("%w: %s is a %s; point --table at the outbox table", ErrNotTable, t.Name, relkindName(kind))
	}
	t.Unlogged = persistence == "u"
	return t, nil
}

func relkindName(kind string) string {
	switch kind {
	case "v":
		return "view"
	case "m":
		return "materialized view"
	case "f":
		return "foreign table"
	case "S":
		return "sequence"
	case "i", "I":
		return "index"
	case "c":
		return "composite type"
	}
	return "relation of kind " + kind
}

// CatalogConfig says which table is the outbox.
type CatalogConfig struct {
	URL         string      // a normal connection's; the same database as the stream's
	Table       pgname.Name // --table
	Publication string      // for the advice in messages
	// Required are the columns every outbox row has (the mapping's
	// required columns): a table that has them all may be an outbox, so
	// its inserts are never skipped as another table's.
	Required []string
	// Timeout bounds one lookup; the replication loop waits for it, so it
	// must stay well below wal_sender_timeout.
	Timeout time.Duration
}

// Catalog tells the pipeline what the relations the stream describes are,
// from the catalog as it is now. It finds the outbox at start, by name, and
// then follows it by identity: renamed or moved, it is the same relation.
// Not safe for concurrent use: the replication loop owns it.
type Catalog struct {
	cfg    CatalogConfig
	outbox Relation
	conn   *pgx.Conn
}

// OpenCatalog connects and finds the outbox table.
func OpenCatalog(ctx context.Context, cfg CatalogConfig) (*Catalog, error) {
	c := &Catalog{cfg: cfg}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	t, err := FindTable(ctx, c.conn, cfg.Table)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.outbox = t.Relation
	return c, nil
}

// Outbox is the outbox table as found at start.
func (c *Catalog) Outbox() Relation { return c.outbox }

func (c *Catalog) connect(ctx context.Context) error {
	conn, err := ConnectPrimary(ctx, c.cfg.URL)
	if err != nil {
		return fmt.Errorf("%w: connect: %w", ErrCatalog, ExplainConnect(err))
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

// relationFacts is what the catalog says now about one relation.
type relationFacts struct {
	exists bool
	name   pgname.Name // now, when it exists
	// outbox: the outbox table, the table now named --table, or a
	// partition (or inheritance child) of either, at any depth.
	outbox bool
	// ancestor: a partitioned table the outbox (or the table now named
	// --table) is a partition of, at any depth. (An inheritance parent's
	// rows are its own, never the outbox's.)
	ancestor bool
}

// Classify says what rel is: the outbox (a partition of it, the table itself
// renamed or moved), provably another table, or neither; why is a phrase
// for the log (outbox or other) or for the bad-event error (unmapped). It is
// called from the replication loop for a Relation message of a relation not
// yet known as the outbox. Errors wrap ErrCatalog.
//
// The catalog says what is true now, and the row was written earlier: a
// partition attached since is fine (its Relation message comes after the
// attach was committed, so the catalog has it), but one detached or dropped
// since is not the outbox's any more. So only a relation that provably is
// not the outbox is another table; see classify.
func (c *Catalog) Classify(rel *decoder.Relation) (role decoder.Role, why string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	if c.conn == nil || c.conn.IsClosed() {
		if err := c.connect(ctx); err != nil {
			return 0, "", err
		}
	}
	var f relationFacts
	err = c.conn.QueryRow(ctx, `WITH RECURSIVE
		roots AS (
			SELECT oid FROM pg_class WHERE oid = $1::oid
			UNION
			SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $2 AND c.relname = $3 AND c.relkind IN ('r', 'p')
		),
		down AS (
			SELECT oid FROM roots
			UNION
			SELECT i.inhrelid FROM pg_inherits i JOIN down d ON i.inhparent = d.oid
		),
		up AS (
			SELECT i.inhparent AS oid FROM pg_inherits i JOIN roots r ON i.inhrelid = r.oid
			JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relispartition
			UNION
			SELECT i.inhparent FROM pg_inherits i JOIN up u ON i.inhrelid = u.oid
			JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relispartition
		)
		SELECT c.oid IS NOT NULL, coalesce(n.nspname::text, ''), coalesce(c.relname::text, ''),
			EXISTS (SELECT 1 FROM down WHERE oid = $4::oid), EXISTS (SELECT 1 FROM up WHERE oid = $4::oid)
		FROM (SELECT $4::oid AS id) x LEFT JOIN pg_class c ON c.oid = x.id LEFT JOIN pg_namespace n ON n.oid = c.relnamespace`,
		c.outbox.OID, c.cfg.Table.Schema, c.cfg.Table.Relation, rel.ID).
		Scan(&f.exists, &f.name.Schema, &f.name.Relation, &f.outbox, &f.ancestor)
	if err != nil {
		// The connection may be the problem; the next lookup opens another.
		c.Close()
		return 0, "", fmt.Errorf("%w: look up relation %s.%s (OID %d): %w", ErrCatalog, rel.Namespace, rel.Name, rel.ID, err)
	}
	role, why = classify(rel, f, c.cfg.Table, c.cfg.Required, c.cfg.Publication)
	return role, why, nil
}

// classify decides from the catalog's facts and the Relation message (the
// relation's name and columns when the row was written). In order:
//
//   - the outbox, the table now named --table, or a partition or
//     inheritance child of either: the outbox;
//   - named --table when the row was written (the Relation message's name):
//     the outbox, whatever it is called now, because the services wrote it
//     by that name;
//   - a table the outbox is a partition of: unmapped, because a
//     publication that publishes it via its root sends the rows of all its
//     partitions under its id, the outbox's among them;
//   - gone from the catalog: unmapped, because it may have been a partition
//     of the outbox that was dropped since;
//   - having every required column: unmapped, because it may have been a
//     partition of the outbox that was detached since, or be another
//     outbox sharing the publication;
//   - anything else: another table, skipped.
func classify(rel *decoder.Relation, f relationFacts, table pgname.Name, required []string, publication string) (decoder.Role, string) {
	pub := pgname.Quote(publication)
	switch {
	case f.outbox && f.name == table:
		return decoder.RoleOutbox, "the outbox table"
	case f.outbox:
		return decoder.RoleOutbox, "the outbox table or one of its partitions (now " + f.name.String() + ")"
	case rel.Namespace == table.Schema && rel.Name == table.Relation:
		return decoder.RoleOutbox, "named " + table.String() + " when its rows were written"
	case f.ancestor:
		return decoder.RoleUnmapped, fmt.Sprintf("it is a partitioned table that the outbox %s is a partition of, and the publication sends its rows "+
			"(publish_via_partition_root), so the outbox's rows cannot be told from its other partitions': "+
			"stream the outbox through a publication of its own (CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)) "+
			"and point --publication at it", table, table.Quoted())
	case !f.exists:
		return decoder.RoleUnmapped, fmt.Sprintf("it no longer exists, so whether it was a partition of the outbox cannot be told: with "+
			"publish_via_partition_root off, a partition's rows arrive under the partition, and this one was dropped before its rows were streamed. "+
			"Run ALTER PUBLICATION %s SET (publish_via_partition_root = true) so partitions' rows arrive as the outbox's; "+
			"to get past this row, run once with --on-bad-event=dead-letter", pub)
	case hasColumns(rel, required):
		return decoder.RoleUnmapped, fmt.Sprintf("it has the outbox's columns but is not the outbox %s nor one of its partitions (now %s): "+
			"either a partition detached before its rows were streamed (attach it again and restart; detach partitions only once their rows are streamed, "+
			"or run ALTER PUBLICATION %s SET (publish_via_partition_root = true)), "+
			"or another outbox table in the same publication (give each outbox a publication of its own)", table, f.name, pub)
	}
	return decoder.RoleOther, "another table of the publication, not the outbox " + table.String()
}

// hasColumns reports whether rel has every column named in names.
func hasColumns(rel *decoder.Relation, names []string) bool {
	for _, n := range names {
		if !slices.ContainsFunc(rel.Columns, func(c decoder.Column) bool { return c.Name == n }) {
			return false
		}
	}
	return true
}

// Coverage is how much of the outbox a publication publishes, as the
// catalog says now.
type Coverage struct {
	Publication string
	Outbox      Table
	ViaRoot     bool // the publication's publish_via_partition_root
	// Missing are relations of the outbox that hold rows (the table, its
	// partitions, its inheritance children) whose inserts the publication
	// does not send.
	Missing []Relation
	// Unlogged are relations of the outbox that are UNLOGGED: their rows
	// are not in the WAL.
	Unlogged []Relation
	// Captured is a table the outbox is a partition of that the publication
	// publishes via its root: the outbox's rows would arrive under its id.
	Captured *Relation
}

// Complete reports whether every insert into the outbox is published and can
// be told apart.
func (c Coverage) Complete() bool {
	return len(c.Missing) == 0 && len(c.Unlogged) == 0 && c.Captured == nil
}

// Problem is what is wrong and the statement that fixes it, in one line; ""
// when the coverage is complete.
func (c Coverage) Problem() string {
	pub := pgname.Quote(c.Publication)
	var p []string
	if c.Captured != nil {
		p = append(p, fmt.Sprintf("publication %q publishes %s, a partitioned table the outbox %s is a partition of, with publish_via_partition_root: "+
			"the outbox's inserts arrive as %s's and cannot be told from its other partitions'. Stream the outbox through a publication of its own "+
			"(CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)) and point --publication at it",
			c.Publication, c.Captured.Name, c.Outbox.Name, c.Captured.Name, c.Outbox.Name.Quoted()))
	}
	for _, r := range c.Unlogged {
		p = append(p, fmt.Sprintf("table %s is UNLOGGED: its rows are not written to the WAL, so they cannot be streamed; run ALTER TABLE %s SET LOGGED",
			r.Name, r.Name.Quoted()))
	}
	switch {
	case len(c.Missing) == 0:
	case len(c.Missing) == 1 && c.Missing[0].OID == c.Outbox.OID:
		p = append(p, fmt.Sprintf("publication %q does not contain table %s: run ALTER PUBLICATION %s ADD TABLE %s",
			c.Publication, c.Outbox.Name, pub, c.Outbox.Name.Quoted()))
	case c.Outbox.Partitioned:
		// Adding the partitioned table publishes every partition, those
		// created later too.
		p = append(p, fmt.Sprintf("publication %q does not publish %s of the outbox %s: run ALTER PUBLICATION %s ADD TABLE %s",
			c.Publication, describe(c.Missing, "partition"), c.Outbox.Name, pub, c.Outbox.Name.Quoted()))
	default:
		var names []string
		for _, r := range c.Missing {
			names = append(names, r.Name.Quoted())
		}
		p = append(p, fmt.Sprintf("publication %q does not publish %s of the outbox %s: run ALTER PUBLICATION %s ADD TABLE %s",
			c.Publication, describe(c.Missing, "table"), c.Outbox.Name, pub, strings.Join(names, ", ")))
	}
	return strings.Join(p, "; ")
}

// describe names up to five relations: "partition a.b", "partitions a.b,
// a.c and 3 more".
func describe(rels []Relation, noun string) string {
	var names []string
	for i, r := range rels {
		if i == 5 {
			names = append(names, fmt.Sprintf("%d more", len(rels)-5))
			break
		}
		names = append(names, r.Name.String())
	}
	if len(rels) > 1 {
		noun += "s"
	}
	return noun + " " + strings.Join(names, ", ")
}

// CheckPublication says what the publication misses of the outbox, in one
// line with the fix, or "" when it misses nothing. The outbox is the table
// found at start, by identity (renamed or moved, it is still in the
// publication), and also the table that holds --table's name now, if that
// is another one: the services write by name, so a table dropped and
// created again, which leaves the publication, is the outbox now.
func CheckPublication(ctx context.Context, conn *pgx.Conn, publication string, outbox Relation, name pgname.Name) (string, error) {
	var problems []string
	var found bool
	check := func(t Table, err error) error {
		switch {
		case errors.Is(err, ErrNoTable), errors.Is(err, ErrNotTable):
			return nil
		case err != nil:
			return err
		}
		found = true
		cov, err := Cover(ctx, conn, publication, t)
		if err != nil {
			return err
		}
		if !cov.Complete() {
			problems = append(problems, cov.Problem())
		}
		return nil
	}
	byOID, err := tableByOID(ctx, conn, outbox.OID)
	if err := check(byOID, err); err != nil {
		return "", err
	}
	if byName, err := FindTable(ctx, conn, name); err != nil || byName.OID != outbox.OID {
		if err := check(byName, err); err != nil {
			return "", err
		}
	}
	if !found {
		return fmt.Sprintf("the outbox table %s (OID %d when cdc-outbox started) does not exist any more, and no table is named %s: "+
			"create it, add it to publication %q, and restart cdc-outbox", outbox.Name, outbox.OID, name, publication), nil
	}
	return strings.Join(problems, "; "), nil
}

// treeNode is one relation of the outbox's inheritance tree.
type treeNode struct {
	Relation
	parent    uint32 // 0 for the outbox itself
	partition bool   // of parent (relispartition), rather than an inheritance child
	kind      string // relkind
	unlogged  bool
	published bool // listed in pg_publication_tables
}

// Cover reads whether publication publishes every insert into the outbox
// table t: the table, or for a partitioned table or one with inheritance
// children, every relation below it that holds rows. It compares relations,
// not names, and reads pg_publication_tables, so FOR TABLE, FOR TABLES IN
// SCHEMA and FOR ALL TABLES publications are all judged by what they
// publish.
func Cover(ctx context.Context, conn *pgx.Conn, publication string, t Table) (Coverage, error) {
	c := Coverage{Publication: publication, Outbox: t}
	// Through JSON: pubviaroot is new in PostgreSQL 13, and before it no
	// partition is published via its root.
	err := conn.QueryRow(ctx, `SELECT coalesce((to_jsonb(p) ->> 'pubviaroot')::bool, false) FROM pg_publication p WHERE pubname = $1`, publication).
		Scan(&c.ViaRoot)
	if err != nil {
		return c, fmt.Errorf("read publication %s: %w", publication, err)
	}
	// pg_publication_tables lists what a publication publishes by name:
	// the root of a partitioned table with publish_via_partition_root, its
	// leaf partitions without.
	const published = `SELECT c.oid FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $2`
	rows, _ := conn.Query(ctx, `WITH RECURSIVE tree(oid, parent) AS (
			SELECT $1::oid, 0::oid
			UNION ALL
			SELECT i.inhrelid, i.inhparent FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid
		)
		SELECT t.oid, t.parent, c.relispartition, n.nspname::text, c.relname::text, c.relkind::text, c.relpersistence = 'u', t.oid IN (`+published+`)
		FROM tree t JOIN pg_class c ON c.oid = t.oid JOIN pg_namespace n ON n.oid = c.relnamespace`, t.OID, publication)
	nodes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (treeNode, error) {
		var n treeNode
		err := row.Scan(&n.OID, &n.parent, &n.partition, &n.Name.Schema, &n.Name.Relation, &n.kind, &n.unlogged, &n.published)
		return n, err
	})
	if err != nil {
		return c, fmt.Errorf("read the partitions of %s and what publication %s publishes: %w", t.Name, publication, err)
	}
	var captured Relation
	err = conn.QueryRow(ctx, `WITH RECURSIVE up(oid, depth) AS (
			SELECT i.inhparent, 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhrelid = $1::oid AND c.relispartition
			UNION ALL
			SELECT i.inhparent, u.depth + 1 FROM pg_inherits i JOIN up u ON i.inhrelid = u.oid
			JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relispartition
		)
		SELECT c.oid, n.nspname::text, c.relname::text FROM up u JOIN pg_class c ON c.oid = u.oid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE u.oid IN (`+published+`) ORDER BY u.depth DESC LIMIT 1`, t.OID, publication).
		Scan(&captured.OID, &captured.Name.Schema, &captured.Name.Relation)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return c, fmt.Errorf("read the tables %s is a partition of: %w", t.Name, err)
	default:
		if c.ViaRoot {
			c.Captured = &captured
		}
	}
	c.Missing, c.Unlogged = uncovered(nodes)
	return c, nil
}

// uncovered returns the relations of the tree that hold rows but whose
// inserts are not published, and those that are unlogged. A relation is
// published when it is listed, or when it is a partition and the
// partitioned table above it is published (pg_publication_tables lists
// that table instead of its partitions under publish_via_partition_root).
// An inheritance child is published only when listed itself: a publication
// takes in the children a table has when it is added, not those made later.
func uncovered(nodes []treeNode) (missing, unlogged []Relation) {
	parent := map[uint32]uint32{} // of partitions only: a partition has one
	listed := map[uint32]bool{}
	for _, n := range nodes {
		if n.partition {
			parent[n.OID] = n.parent
		}
		listed[n.OID] = listed[n.OID] || n.published
	}
	covered := func(oid uint32) bool {
		for range len(nodes) + 1 { // pg_inherits has no cycles; bounded anyway
			if listed[oid] {
				return true
			}
			p, ok := parent[oid]
			if !ok {
				return false
			}
			oid = p
		}
		return false
	}
	seen := map[uint32]bool{}
	for _, n := range nodes {
		// Only tables hold rows: a partitioned table's are in its
		// partitions, a foreign table's are not in this database's WAL.
		if seen[n.OID] || n.kind != "r" {
			continue
		}
		seen[n.OID] = true
		switch {
		case n.unlogged:
			unlogged = append(unlogged, n.Relation)
		case !covered(n.OID):
			missing = append(missing, n.Relation)
		}
	}
	return missing, unlogged
}
