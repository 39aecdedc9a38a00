package replication

import (
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/pgname"
)

var outboxTable = pgname.Name{Schema: "public", Relation: "outbox"}

var required = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}

func described(namespace, name string, cols ...string) *decoder.Relation {
	rel := &decoder.Relation{ID: 16400, Namespace: namespace, Name: name}
	for _, c := range cols {
		rel.Columns = append(rel.Columns, decoder.Column{Name: c})
	}
	return rel
}

// TestClassify walks the table of what a relation the publication sent can
// be. Only a relation that provably is not the outbox is another table; each
// case that cannot be told is unmapped, with the fix in its reason.
func TestClassify(t *testing.T) {
	outboxCols := append(append([]string(nil), required...), "headers", "created_at")
	exists := func(schema, name string) relationFacts {
		return relationFacts{exists: true, name: pgname.Name{Schema: schema, Relation: name}}
	}
	for _, tc := range []struct {
		name string
		rel  *decoder.Relation
		f    relationFacts
		role decoder.Role
		why  string
	}{
		{"the outbox", described("public", "outbox", outboxCols...),
			relationFacts{exists: true, name: outboxTable, outbox: true}, decoder.RoleOutbox, "the outbox table"},
		{"the outbox, renamed since", described("public", "outbox", outboxCols...),
			relationFacts{exists: true, name: pgname.Name{Schema: "archive", Relation: "Events"}, outbox: true}, decoder.RoleOutbox, `now archive."Events"`},
		{"a partition", described("public", "outbox_2026_12", outboxCols...),
			relationFacts{exists: true, name: pgname.Name{Schema: "public", Relation: "outbox_2026_12"}, outbox: true}, decoder.RoleOutbox, "partitions"},
		{"named --table when written, renamed and detached since", described("public", "outbox", outboxCols...),
			exists("public", "outbox_old"), decoder.RoleOutbox, "named public.outbox when its rows were written"},
		{"named --table when written, dropped since", described("public", "outbox", outboxCols...),
			relationFacts{}, decoder.RoleOutbox, "named public.outbox"},
		{"a partition dropped since", described("public", "outbox_2025_01", outboxCols...),
			relationFacts{}, decoder.RoleUnmapped, "publish_via_partition_root = true"},
		{"a dropped table that never looked like the outbox", described("public", "orders", "id", "total"),
			relationFacts{}, decoder.RoleUnmapped, "no longer exists"},
		{"a partition detached since", described("public", "outbox_2025_01", outboxCols...),
			exists("public", "outbox_2025_01"), decoder.RoleUnmapped, "attach it again and restart"},
		{"another outbox in the publication", described("billing", "outbox", outboxCols...),
			exists("billing", "outbox"), decoder.RoleUnmapped, "a publication of its own"},
		{"a table the outbox is a partition of", described("public", "all_events", outboxCols...),
			relationFacts{exists: true, name: pgname.Name{Schema: "public", Relation: "all_events"}, ancestor: true}, decoder.RoleUnmapped, "publication of its own"},
		{"another table", described("public", "orders", "id", "total"),
			exists("public", "orders"), decoder.RoleOther, "another table"},
		{"another table with some of the outbox's columns", described("public", "audit", "id", "payload", "event_type"),
			exists("public", "audit"), decoder.RoleOther, "another table"},
	} {
		role, why := classify(tc.rel, tc.f, outboxTable, required, "cdc_outbox")
		if role != tc.role || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %v %q; want %v and a reason with %q", tc.name, role, why, tc.role, tc.why)
		}
	}
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
