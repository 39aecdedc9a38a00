package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// Max is the most shards a stream may have. Each shard is a walsender that
// decodes the whole WAL: past a handful the server pays more than the
// split gains (docs/sharding.md).
const Max = 16

// Shard is shard Index of Count; the zero value, and Count 1, is a stream
// that is not split.
type Shard struct {
	Index, Count int
}

// Split reports whether s is one of several shards.
func (s Shard) Split() bool { return s.Count > 1 }

func (s Shard) String() string { return fmt.Sprintf("%d of %d", s.Index, s.Count) }

// All are the shards of a stream split in count.
func All(count int) []Shard {
	out := make([]Shard, count)
	for i := range out {
		out[i] = Shard{Index: i, Count: count}
	}
	return out
}

// Of is the shard of count that an aggregate id belongs to: the value of
// Filter's expression, (hashtext(id) & 2147483647) % count.
func Of(aggregateID string, count int) int {
	return int(Hash(aggregateID)&0x7fffffff) % count
}

// Keeps reports whether the shard streams the aggregate's events; a stream
// that is not split keeps every one.
func (s Shard) Keeps(aggregateID string) bool {
	return !s.Split() || Of(aggregateID, s.Count) == s.Index
}

// Name is the publication or slot of the shard named after base, the
// stream's: "<base>_shard_<index>_of_<count>"; base itself for a stream
// that is not split. The count is in the name, so that a start with
// another count finds the others' names and refuses (Parse).
func (s Shard) Name(base string) string {
	if !s.Split() {
		return base
	}
	return fmt.Sprintf("%s_shard_%d_of_%d", base, s.Index, s.Count)
}

// Parse reads a shard's name made by Name from base; ok is false for any
// other name.
func Parse(base, name string) (s Shard, ok bool) {
	rest, found := strings.CutPrefix(name, base+"_shard_")
	if !found {
		return Shard{}, false
	}
	i, k, found := strings.Cut(rest, "_of_")
	if !found {
		return Shard{}, false
	}
	index, err1 := strconv.Atoi(i)
	count, err2 := strconv.Atoi(k)
	if err1 != nil || err2 != nil || count < 2 || index < 0 || index >= count || (Shard{index, count}).Name(base) != name {
		return Shard{}, false
	}
	return Shard{Index: index, Count: count}, true
}

// Filter is the row filter of the shard's publication for a table whose
// aggregate id is column (quoted as SQL needs). hashtext is an immutable
// built-in function, which row filters (PostgreSQL 15+) allow; the mask
// keeps the remainder non-negative, as Of computes it.
func (s Shard) Filter(column string) string {
	return fmt.Sprintf("(hashtext(%s) & 2147483647) %% %d = %d", column, s.Count, s.Index)
}

// SameFilter reports whether rowfilter, as pg_publication_tables shows it
// (PostgreSQL deparses it with its own parentheses and quotes only the
// names that need it), is the shard's filter on column (unquoted).
func (s Shard) SameFilter(rowfilter, column string) bool {
	return normalize(rowfilter) == normalize(s.Filter(column))
}

func normalize(expr string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\n', '(', ')', '"':
			return -1
		}
		return r
	}, expr)
}
