package shard

import (
	"strconv"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		s    Shard
		want string
	}{
		{Shard{}, "cdc_outbox"},
		{Shard{0, 1}, "cdc_outbox"},
		{Shard{0, 4}, "cdc_outbox_shard_0_of_4"},
		{Shard{3, 4}, "cdc_outbox_shard_3_of_4"},
		{Shard{10, 16}, "cdc_outbox_shard_10_of_16"},
	} {
		if got := tc.s.Name("cdc_outbox"); got != tc.want {
			t.Errorf("%v.Name = %q, want %q", tc.s, got, tc.want)
		}
		if !tc.s.Split() {
			continue
		}
		if got, ok := Parse("cdc_outbox", tc.want); !ok || got != tc.s {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.want, got, ok, tc.s)
		}
	}
}

func TestParseRefusesOtherNames(t *testing.T) {
	for _, name := range []string{
		"cdc_outbox", "cdc_outbox_shard_", "cdc_outbox_shard_1", "cdc_outbox_shard_1_of_", "cdc_outbox_shard_4_of_4",
		"cdc_outbox_shard_1_of_1", "cdc_outbox_shard_01_of_4", "cdc_outbox_shard_-1_of_4", "other_shard_0_of_2",
		"cdc_outbox_x_shard_0_of_2", "cdc_outbox_shard_0_of_2_x",
	} {
		if s, ok := Parse("cdc_outbox", name); ok {
			t.Errorf("Parse(%q) = %v, want no shard", name, s)
		}
	}
}

func TestFilter(t *testing.T) {
	s := Shard{1, 4}
	if got, want := s.Filter("aggregate_id"), "(hashtext(aggregate_id) & 2147483647) % 4 = 1"; got != want {
		t.Errorf("Filter = %q, want %q", got, want)
	}
	// As PostgreSQL 15 shows it in pg_publication_tables.rowfilter.
	deparsed := "(((hashtext(aggregate_id) & 2147483647) % 4) = 1)"
	if !s.SameFilter(deparsed, "aggregate_id") {
		t.Errorf("SameFilter(%q) = false", deparsed)
	}
	if !s.SameFilter(`(((hashtext("Aggregate Id") & 2147483647) % 4) = 1)`, "Aggregate Id") {
		t.Error("SameFilter of a quoted column = false")
	}
	for _, other := range []string{
		"(((hashtext(aggregate_id) & 2147483647) % 4) = 2)",
		"(((hashtext(aggregate_id) & 2147483647) % 2) = 1)",
		"(((hashtext(aggregate_type) & 2147483647) % 4) = 1)",
		"",
	} {
		if s.SameFilter(other, "aggregate_id") {
			t.Errorf("SameFilter(%q) = true", other)
		}
	}
}

// TestOfSplitsEvenly: the shards of 100,000 aggregate ids differ from an
// even split by under 5% (3 standard deviations at K=16).
func TestOfSplitsEvenly(t *testing.T) {
	const n = 100000
	for _, k := range []int{2, 3, 4, 16} {
		counts := make([]int, k)
		for i := range n {
			counts[Of("order-"+strings.Repeat("x", i%7)+strconv.Itoa(i), k)]++
		}
		for i, c := range counts {
			if d := float64(c)/float64(n/k) - 1; d > 0.05 || d < -0.05 {
				t.Errorf("K=%d: shard %d has %d of %d ids", k, i, c, n)
			}
		}
	}
}

func TestKeeps(t *testing.T) {
	id := "order-42"
	kept := 0
	for _, s := range All(4) {
		if s.Keeps(id) {
			kept++
		}
	}
	if kept != 1 {
		t.Errorf("%d of 4 shards keep %q, want 1", kept, id)
	}
	if !(Shard{}).Keeps(id) {
		t.Error("a stream that is not split passes an aggregate over")
	}
}

// TestHashKnownValues: hashtext's values on PostgreSQL 15, x86-64
// (TestHashMatchesTheServer compares many more on the server itself).
func TestHashKnownValues(t *testing.T) {
	for s, want := range map[string]int32{
		"":                          -1477818771,
		"a":                         1075015857,
		"hello world, this is long": -1137652777,
		"héllo":                     -1340490493,
	} {
		if got := int32(Hash(s)); got != want {
			t.Errorf("Hash(%q) = %d, want %d", s, got, want)
		}
	}
}
