package replication

import (
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

var required = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}

func described(namespace, name string, cols ...string) *decoder.Relation {
	rel := &decoder.Relation{ID: 16400, Namespace: namespace, Name: name}
	for _, c := range cols {
		rel.Columns = append(rel.Columns, decoder.Column{Name: c})
	}
	return rel
}

// TestClassify walks the table of what a relation the publication sent can
// be. Only a relation that provably is not an outbox is another table; each
// case that cannot be told is unmapped, with the fix in its reason.
func TestClassify(t *testing.T) {
	outboxCols := append(append([]string(nil), required...), "headers", "created_at")
	node := func(oid uint32, schema, name, kind string) relNode {
		return relNode{oid: oid, name: pgname.Name{Schema: schema, Relation: name}, kind: kind}
	}
	self := func(schema, name string) relNode { return node(16400, schema, name, "r") }
	exists := func(schema, name string, up ...relNode) relationFacts {
		return relationFacts{exists: true, name: pgname.Name{Schema: schema, Relation: name}, up: append([]relNode{self(schema, name)}, up...)}
	}
	one := []CatalogOutbox{{Pattern: pattern(t, "outbox"), Required: required}}
	known := map[uint32]decoder.Outbox{16400: {Entry: 0, OID: 16400, Schema: "public", Name: "outbox"}}
	elsewhere := map[uint32]decoder.Outbox{16399: {Entry: 0, OID: 16399, Schema: "public", Name: "outbox"}}
	parentKnown := map[uint32]decoder.Outbox{16300: {Entry: 0, OID: 16300, Schema: "public", Name: "outbox"}}
	for _, tc := range []struct {
		name     string
		outboxes []CatalogOutbox
		known    map[uint32]decoder.Outbox
		rel      *decoder.Relation
		f        relationFacts
		role     decoder.Role
		entry    int
		table    uint32
		why      string
	}{
		{"the outbox", one, known, described("public", "outbox", outboxCols...),
			exists("public", "outbox"), decoder.RoleOutbox, 0, 16400, "the outbox table"},
		{"the outbox, renamed since", one, known, described("public", "outbox", outboxCols...),
			exists("archive", "Events"), decoder.RoleOutbox, 0, 16400, `now archive."Events"`},
		{"a partition", one, parentKnown, described("public", "outbox_2026_12", outboxCols...),
			exists("public", "outbox_2026_12", node(16300, "public", "outbox", "p")), decoder.RoleOutbox, 0, 16300, "partition"},
		{"a partition of a table matching a pattern, not known yet", []CatalogOutbox{{Pattern: pattern(t, "tenant_*.outbox"), Required: required}}, nil,
			described("tenant_7", "outbox_p1", outboxCols...),
			exists("tenant_7", "outbox_p1", node(16300, "tenant_7", "outbox", "p")), decoder.RoleOutbox, 0, 16300, "partition"},
		{"a new table matching the second pattern", []CatalogOutbox{{Pattern: pattern(t, "svc.outbox")}, {Pattern: pattern(t, "tenant_*.outbox")}}, nil,
			described("tenant_9", "outbox", outboxCols...),
			exists("tenant_9", "outbox"), decoder.RoleOutbox, 1, 16400, "the outbox table"},
		{"a table matching no pattern, but a view of the name", one, nil, described("public", "outbox", outboxCols...),
			relationFacts{exists: true, name: pgname.Name{Schema: "public", Relation: "x"}, up: []relNode{node(16400, "public", "x", "r"), node(1, "public", "outbox", "v")}},
			decoder.RoleOutbox, 0, 16400, "named public.outbox when its rows were written"},
		{"named --table when written, renamed and detached since", one, nil, described("public", "outbox", outboxCols...),
			exists("public", "outbox_old"), decoder.RoleOutbox, 0, 16400, "named public.outbox when its rows were written"},
		{"named --table when written, dropped since", one, nil, described("public", "outbox", outboxCols...),
			relationFacts{}, decoder.RoleOutbox, 0, 16400, "named public.outbox"},
		{"a partition dropped since", one, elsewhere, described("public", "outbox_2025_01", outboxCols...),
			relationFacts{}, decoder.RoleUnmapped, -1, 0, "publish_via_partition_root = true"},
		{"a dropped table that never looked like the outbox", one, elsewhere, described("public", "orders", "id", "total"),
			relationFacts{}, decoder.RoleUnmapped, -1, 0, "no longer exists"},
		{"a partition detached since", one, elsewhere, described("public", "outbox_2025_01", outboxCols...),
			exists("public", "outbox_2025_01"), decoder.RoleUnmapped, -1, 0, "attach it again and restart"},
		{"another outbox in the publication", one, elsewhere, described("billing", "outbox", outboxCols...),
			exists("billing", "outbox"), decoder.RoleUnmapped, -1, 0, "a publication of its own"},
		{"a table the outbox is a partition of", one, map[uint32]decoder.Outbox{16500: {OID: 16500}}, described("public", "all_events", outboxCols...),
			relationFacts{exists: true, name: pgname.Name{Schema: "public", Relation: "all_events"}, up: []relNode{node(16400, "public", "all_events", "p")},
				down: []relNode{node(16500, "public", "outbox", "r")}}, decoder.RoleUnmapped, -1, 0, "publication of its own"},
		{"another table", one, elsewhere, described("public", "orders", "id", "total"),
			exists("public", "orders"), decoder.RoleOther, -1, 0, "another table"},
		{"another table with some of the outbox's columns", one, elsewhere, described("public", "audit", "id", "payload", "event_type"),
			exists("public", "audit"), decoder.RoleOther, -1, 0, "another table"},
	} {
		role, entry, table, why := classify(tc.rel, tc.f, tc.outboxes, tc.known, "cdc_outbox")
		if role != tc.role || entry != tc.entry || table.OID != tc.table || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %v entry %d table %d %q; want %v, entry %d, table %d and a reason with %q", tc.name, role, entry, table.OID, why, tc.role, tc.entry, tc.table, tc.why)
		}
	}
}

func pattern(t *testing.T, s string) pgname.Pattern {
	t.Helper()
	p, err := pgname.ParsePattern(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUncovered(t *testing.T) {
	rel := func(oid uint32, name string) Relation {
		return Relation{OID: oid, Name: pgname.Name{Schema: "public", Relation: name}}
	}
	// node is a partition of parent (or the root, for parent 0).
	node := func(oid, parent uint32, kind string, published bool) treeNode {
		return treeNode{Relation: rel(oid, "r"+string(rune('0'+oid%10))), parent: parent, partition: parent != 0, kind: kind, published: published}
	}
	// child is an inheritance child of parent.
	child := func(oid, parent uint32, published bool) treeNode {
		n := node(oid, parent, "r", published)
		n.partition = false
		return n
	}
	oids := func(rs []Relation) (out []uint32) {
		for _, r := range rs {
			out = append(out, r.OID)
		}
		return out
	}
	for _, tc := range []struct {
		name            string
		nodes           []treeNode
		missing, unlogg []uint32
	}{
		{"a plain table, published", []treeNode{node(1, 0, "r", true)}, nil, nil},
		{"a plain table, not published", []treeNode{node(1, 0, "r", false)}, []uint32{1}, nil},
		{"partitioned, via root", []treeNode{node(1, 0, "p", true), node(2, 1, "r", false), node(3, 1, "r", false)}, nil, nil},
		{"partitioned, leaves listed", []treeNode{node(1, 0, "p", false), node(2, 1, "r", true), node(3, 1, "r", true)}, nil, nil},
		{"partitioned, a leaf left out", []treeNode{node(1, 0, "p", false), node(2, 1, "r", true), node(3, 1, "r", false)}, []uint32{3}, nil},
		{"sub-partitioned, the middle listed", []treeNode{node(1, 0, "p", false), node(2, 1, "p", true), node(4, 2, "r", false), node(3, 1, "r", false)}, []uint32{3}, nil},
		{"partitioned with no partitions", []treeNode{node(1, 0, "p", false)}, nil, nil},
		{"a foreign partition", []treeNode{node(1, 0, "p", true), node(2, 1, "f", false)}, nil, nil},
		{"an unlogged partition", []treeNode{node(1, 0, "p", true), {Relation: rel(2, "u"), parent: 1, partition: true, kind: "r", unlogged: true}}, nil, []uint32{2}},
		{"inheritance, a child made later", []treeNode{node(1, 0, "r", true), child(2, 1, true), child(3, 1, false)}, []uint32{3}, nil},
		{"inheritance, a grandchild made later", []treeNode{node(1, 0, "r", true), child(2, 1, true), child(3, 2, false)}, []uint32{3}, nil},
		{"multiple inheritance, listed once per parent", []treeNode{node(1, 0, "r", true), child(2, 1, true), child(2, 1, true)}, nil, nil},
	} {
		missing, unlogged := uncovered(tc.nodes)
		if got := oids(missing); !equal(got, tc.missing) {
			t.Errorf("%s: missing %v, want %v", tc.name, got, tc.missing)
		}
		if got := oids(unlogged); !equal(got, tc.unlogg) {
			t.Errorf("%s: unlogged %v, want %v", tc.name, got, tc.unlogg)
		}
	}
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCoverageProblem: each way of not covering the outbox says the
// statement that fixes it, naming relations properly quoted.
func TestCoverageProblem(t *testing.T) {
	billing := Table{Relation: Relation{OID: 1, Name: pgname.Name{Schema: "Billing", Relation: "Outbox Events"}}}
	part := func(oid uint32, name string) Relation {
		return Relation{OID: oid, Name: pgname.Name{Schema: "Billing", Relation: name}}
	}
	partitioned := billing
	partitioned.Partitioned = true
	for _, tc := range []struct {
		name string
		c    Coverage
		want []string
	}{
		{"complete", Coverage{Outbox: billing}, nil},
		{"the table", Coverage{Outbox: billing, Missing: []Relation{billing.Relation}},
			[]string{`publication "my pub" does not contain table "Billing"."Outbox Events": run ALTER PUBLICATION "my pub" ADD TABLE "Billing"."Outbox Events"`}},
		{"partitions", Coverage{Outbox: partitioned, Missing: []Relation{part(2, "p1"), part(3, "p2")}},
			[]string{`does not publish partitions "Billing".p1, "Billing".p2 of the outbox`, `ADD TABLE "Billing"."Outbox Events"`}},
		{"inheritance children", Coverage{Outbox: billing, Missing: []Relation{part(2, "c1"), part(3, "c2")}},
			[]string{`does not publish tables "Billing".c1, "Billing".c2`, `ADD TABLE "Billing"."c1", "Billing"."c2"`}},
		{"unlogged", Coverage{Outbox: billing, Unlogged: []Relation{part(4, "p4")}},
			[]string{`table "Billing".p4 is UNLOGGED`, `ALTER TABLE "Billing"."p4" SET LOGGED`}},
		{"captured", Coverage{Outbox: billing, Captured: &Relation{OID: 9, Name: pgname.Name{Schema: "public", Relation: "events"}}},
			[]string{"publishes public.events, a partitioned table the outbox", `FOR TABLE "Billing"."Outbox Events" WITH (publish = 'insert', publish_via_partition_root = true)`}},
	} {
		tc.c.Publication = "my pub"
		got := tc.c.Problem()
		if tc.c.Complete() != (tc.want == nil) || (got == "") != (tc.want == nil) {
			t.Errorf("%s: complete %v, problem %q", tc.name, tc.c.Complete(), got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
	}
}

// TestCreatePublication: one publication lists every outbox table, via the
// partition root when one is partitioned, and none yet for a pattern that
// matches nothing.
func TestCreatePublication(t *testing.T) {
	table := func(schema, name string, partitioned bool) Table {
		return Table{Relation: Relation{Name: pgname.Name{Schema: schema, Relation: name}}, Partitioned: partitioned}
	}
	for _, tc := range []struct {
		tables []Table
		want   string
	}{
		{[]Table{table("public", "outbox", false)}, `CREATE PUBLICATION "p" FOR TABLE "public"."outbox" WITH (publish = 'insert')`},
		{[]Table{table("a", "outbox", false), table("B", "outbox", true)},
			`CREATE PUBLICATION "p" FOR TABLE "a"."outbox", "B"."outbox" WITH (publish = 'insert', publish_via_partition_root = true)`},
		{nil, `CREATE PUBLICATION "p" WITH (publish = 'insert')`},
	} {
		if got := createPublication("p", tc.tables, nil); got != tc.want {
			t.Errorf("createPublication: %s\nwant %s", got, tc.want)
		}
	}
	// A shard's: each table with its row filter, before the options.
	got := createPublication("p_shard_1_of_4", []Table{table("public", "outbox", true)}, []string{shard.Shard{Index: 1, Count: 4}.Filter(`"aggregate_id"`)})
	want := `CREATE PUBLICATION "p_shard_1_of_4" FOR TABLE "public"."outbox" WHERE ((hashtext("aggregate_id") & 2147483647) % 4 = 1) WITH (publish = 'insert', publish_via_partition_root = true)`
	if got != want {
		t.Errorf("createPublication of a shard: %s\nwant %s", got, want)
	}
}
