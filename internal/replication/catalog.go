package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// ErrCatalog means the catalog could not be read while streaming. Streaming
// resumes on a new connection, from the confirmed position: the server sends
// the open transaction again, and the relation is looked up again.
var ErrCatalog = errors.New("could not read the catalog")

// ErrNoTable means the outbox table does not exist.
var ErrNoTable = errors.New("the outbox table does not exist")

// ErrNotTable means the outbox table's name is a relation that is not a
// table (a view, a sequence).
var ErrNotTable = errors.New("the outbox is not a table")

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

// FindTable looks up the outbox table by its configured name, on a normal
// connection. A name that is not a table (a view, a sequence) is an *Error
// wrapping ErrNotTable; a missing one is ErrNoTable.
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
		return t, &Error{Err: ErrNotTable, Table: t.Name, msg: fmt.Sprintf("%s is a %s, not a table", t.Name, relkindName(kind))}
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
			"the outbox's inserts arrive as %s's and cannot be told from its other partitions'. Stream the outbox through a publication of its own instead "+
			"(CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true))",
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
// publication), and also the table that holds the configured name now, if
// that is another one: the services write by name, so a table dropped and
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
