package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// The catalog queries, on a real server, for the shapes the end-to-end
// tests do not stream: an outbox that is itself a partition of a table
// published via its root, inheritance children, an unlogged partition, and
// lookups of relations renamed or dropped since.

func catalogFor(t *testing.T, url, table, publication string) *Catalog {
	t.Helper()
	pattern, err := pgname.ParsePattern(table)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := OpenCatalog(ctx, CatalogConfig{URL: url, Outboxes: []CatalogOutbox{{Pattern: pattern, Required: required}}, Publication: publication, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func cover(t *testing.T, url, table, publication string) Coverage {
	t.Helper()
	conn := testenv.Connect(t, url)
	name, _ := pgname.Parse(table)
	tab, err := FindTable(testenv.Context(t), conn, name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Cover(testenv.Context(t), conn, publication, tab)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func relationOf(t *testing.T, url, table string) *decoder.Relation {
	t.Helper()
	rel := &decoder.Relation{}
	err := testenv.Connect(t, url).QueryRow(testenv.Context(t), `SELECT c.oid, n.nspname::text, c.relname::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::regclass`, table).Scan(&rel.ID, &rel.Namespace, &rel.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range required {
		rel.Columns = append(rel.Columns, decoder.Column{Name: c})
	}
	return rel
}

const outboxColumns = `id bigserial, aggregate_type text, aggregate_id text, event_type text, payload jsonb`

func TestCatalogOutboxInsidePartitionedTable(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	testenv.Exec(t, url, `CREATE TABLE events (kind text NOT NULL, `+outboxColumns+`) PARTITION BY LIST (kind);
		CREATE TABLE outbox PARTITION OF events FOR VALUES IN ('outbox');
		CREATE TABLE other_events PARTITION OF events FOR VALUES IN ('other');
		CREATE PUBLICATION via_root FOR TABLE events WITH (publish = 'insert', publish_via_partition_root = true);
		CREATE PUBLICATION leaves FOR TABLE events WITH (publish = 'insert')`)

	c := cover(t, url, "outbox", "via_root")
	if c.Captured == nil || c.Captured.Name.Relation != "events" || !strings.Contains(c.Problem(), "publication of its own") {
		t.Errorf("via root: %+v: %s", c, c.Problem())
	}
	if c := cover(t, url, "outbox", "leaves"); !c.Complete() {
		t.Errorf("leaves: the outbox is published under its own id, but: %s", c.Problem())
	}

	cat := catalogFor(t, url, "outbox", "via_root")
	if role, _, why, err := cat.Classify(relationOf(t, url, "events")); err != nil || role != decoder.RoleUnmapped || !strings.Contains(why, "is a partition of") {
		t.Errorf("the parent: %v %q %v", role, why, err)
	}
	if role, _, _, err := cat.Classify(relationOf(t, url, "outbox")); err != nil || role != decoder.RoleOutbox {
		t.Errorf("the outbox: %v %v", role, err)
	}
	// A sibling partition has the outbox's columns: it cannot be told
	// from a detached partition of the outbox.
	if role, _, _, err := cat.Classify(relationOf(t, url, "other_events")); err != nil || role != decoder.RoleUnmapped {
		t.Errorf("a sibling: %v %v", role, err)
	}
}

func TestCatalogInheritanceAndUnlogged(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	testenv.Exec(t, url, `CREATE TABLE ob (`+outboxColumns+`);
		CREATE TABLE ob_child () INHERITS (ob);
		CREATE PUBLICATION p FOR TABLE ob WITH (publish = 'insert');
		CREATE TABLE ob_later () INHERITS (ob_child);
		CREATE TABLE parted (`+outboxColumns+`) PARTITION BY HASH (id);
		CREATE TABLE parted_0 PARTITION OF parted FOR VALUES WITH (MODULUS 2, REMAINDER 0);
		CREATE UNLOGGED TABLE parted_1 PARTITION OF parted FOR VALUES WITH (MODULUS 2, REMAINDER 1);
		CREATE PUBLICATION q FOR TABLE parted WITH (publish = 'insert', publish_via_partition_root = true)`)

	c := cover(t, url, "ob", "p")
	if len(c.Missing) != 1 || c.Missing[0].Name.Relation != "ob_later" || !strings.Contains(c.Problem(), `ADD TABLE "public"."ob_later"`) {
		t.Errorf("an inheritance child made after the publication: %+v: %s", c, c.Problem())
	}
	cat := catalogFor(t, url, "ob", "p")
	if role, _, _, err := cat.Classify(relationOf(t, url, "ob_later")); err != nil || role != decoder.RoleOutbox {
		t.Errorf("a grandchild: %v %v", role, err)
	}

	// An inheritance parent's rows are its own: not taken for the outbox's
	// as a partitioned parent's would be, but unmapped all the same, having
	// the outbox's columns.
	child := catalogFor(t, url, "ob_child", "p")
	if role, _, why, err := child.Classify(relationOf(t, url, "ob")); err != nil || role != decoder.RoleUnmapped || strings.Contains(why, "is a partition of") {
		t.Errorf("the parent of an inheriting outbox: %v %q %v", role, why, err)
	}

	c = cover(t, url, "parted", "q")
	if len(c.Unlogged) != 1 || c.Unlogged[0].Name.Relation != "parted_1" || len(c.Missing) != 0 || !strings.Contains(c.Problem(), "SET LOGGED") {
		t.Errorf("an unlogged partition: %+v: %s", c, c.Problem())
	}
}

func TestCatalogFollowsTheTable(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	testenv.Exec(t, url, `CREATE TABLE outbox (`+outboxColumns+`) PARTITION BY HASH (id);
		CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
		CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1);
		CREATE TABLE orders (id bigserial, total numeric);
		CREATE PUBLICATION p FOR ALL TABLES WITH (publish = 'insert')`)
	cat := catalogFor(t, url, "outbox", "p")
	root, part, orders := relationOf(t, url, "outbox"), relationOf(t, url, "outbox_1"), relationOf(t, url, "orders")
	orders.Columns = []decoder.Column{{Name: "id"}, {Name: "total"}}

	testenv.Exec(t, url, `CREATE SCHEMA archive; ALTER TABLE outbox SET SCHEMA archive; ALTER TABLE archive.outbox RENAME TO "Old Outbox"`)
	for _, rel := range []*decoder.Relation{root, part} {
		if role, _, why, err := cat.Classify(rel); err != nil || role != decoder.RoleOutbox {
			t.Errorf("%s after the move: %v %q %v", rel.Name, role, why, err)
		}
	}
	if role, _, _, err := cat.Classify(orders); err != nil || role != decoder.RoleOther {
		t.Errorf("another table: %v %v", role, err)
	}
	// A new table under the old name is the outbox too: services write by
	// name.
	testenv.Exec(t, url, `CREATE TABLE public.outbox (`+outboxColumns+`)`)
	if role, _, why, err := cat.Classify(relationOf(t, url, "public.outbox")); err != nil || role != decoder.RoleOutbox {
		t.Errorf("a new table under the old name: %v %q %v", role, why, err)
	}
	// Detached and dropped: the catalog cannot say any more.
	testenv.Exec(t, url, `ALTER TABLE archive."Old Outbox" DETACH PARTITION outbox_1`)
	if role, _, why, err := cat.Classify(part); err != nil || role != decoder.RoleUnmapped || !strings.Contains(why, "detached") {
		t.Errorf("detached: %v %q %v", role, why, err)
	}
	testenv.Exec(t, url, `DROP TABLE outbox_1`)
	if role, _, why, err := cat.Classify(part); err != nil || role != decoder.RoleUnmapped || !strings.Contains(why, "no longer exists") {
		t.Errorf("dropped: %v %q %v", role, why, err)
	}
}
