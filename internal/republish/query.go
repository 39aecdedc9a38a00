package republish

import (
	"fmt"
	"strings"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/pgname"
)

// query is the page query of a run: every column of the table (the
// mapping's, and all of them for a dead-letter record, as the stream's
// carries the whole row), ordered by the key, the key of the previous
// page's last row as the first parameters.
type query struct {
	table pgname.Name
	sql   string // the page query with a cursor ($1.. the key), first is without
	first string
	all   []string // the table's columns: the result's columns
	// wanted[i] is the result column of the mapper's i-th column, -1 when
	// the table lacks it; types[i] its type OID.
	wanted []int
	types  []uint32
	keyAt  []int // result columns of the key: [id] or [created_at, id]
	byTime bool
	bounds [][]byte // the parameters after the cursor's
}

// plan builds the page query for the table's columns.
func (r *Republisher) plan(table pgname.Name, cols []column) (*query, error) {
	q := &query{table: table, byTime: r.cfg.Select.byTime()}
	at := map[string]int{}
	for i, c := range cols {
		q.all = append(q.all, c.name)
		at[c.name] = i
	}
	for _, name := range r.mapper.Columns() {
		i, ok := at[name]
		if !ok {
			q.wanted, q.types = append(q.wanted, -1), append(q.types, 0)
			continue
		}
		q.wanted, q.types = append(q.wanted, i), append(q.types, cols[i].typeOID)
	}
	m, sel := r.cfg.Mapping, r.cfg.Select
	idAt, ok := at[m.IDColumn]
	if !ok {
		return nil, fmt.Errorf("the outbox table %s has no column %q (--column-id)", table, m.IDColumn)
	}
	if (sel.AfterID != "" || sel.UntilID != "") && !integerTypes[cols[idAt].typeOID] {
		return nil, fmt.Errorf("%w: --after-id and --until-id need ids that grow in the order rows are written (an integer column filled "+
			"by a sequence or identity), and %s.%s has type OID %d (a uuid or text id has no such order): select by --since and --until (created_at) instead",
			ErrNotOrdered, table, m.IDColumn, cols[idAt].typeOID)
	}
	id := pgname.Quote(m.IDColumn)
	key := []string{id}
	q.keyAt = []int{idAt}
	// Conditions on the bounds, with %[1]d for the number of parameters
	// before the bounds' (the cursor's, or none on the first page).
	var cond []string
	param := func(v string) string {
		q.bounds = append(q.bounds, []byte(v))
		return fmt.Sprintf("$%%[1]d+%d", len(q.bounds))
	}
	if q.byTime {
		caAt, ok := at[m.CreatedAtColumn]
		if !ok {
			return nil, fmt.Errorf("%w: --since and --until select by %q (--column-created-at), which %s lacks: select by --after-id and --until-id instead",
				ErrNoCreatedAt, m.CreatedAtColumn, table)
		}
		ca := pgname.Quote(m.CreatedAtColumn)
		key = []string{ca, id}
		q.keyAt = []int{caAt, idAt}
		if !sel.Since.IsZero() {
			cond = append(cond, ca+" >= "+param(sel.Since.Format(time.RFC3339Nano)))
		}
		if !sel.Until.IsZero() {
			cond = append(cond, ca+" < "+param(sel.Until.Format(time.RFC3339Nano)))
		}
	}
	if sel.AfterID != "" {
		cond = append(cond, id+" > "+param(sel.AfterID))
	}
	if sel.UntilID != "" {
		cond = append(cond, id+" <= "+param(sel.UntilID))
	}
	// The cursor: rows after the previous page's last, in key order. A row
	// comparison, so that an index on the key serves it (the primary key
	// for ids; for created_at, an index on (created_at, id)).
	cursor := make([]string, len(key))
	for i := range key {
		cursor[i] = fmt.Sprintf("$%d", i+1)
	}
	build := func(cond []string, before int) string {
		s := "SELECT " + quoteList(q.all) + " FROM " + table.Quoted()
		if len(cond) > 0 {
			s += " WHERE " + strings.Join(cond, " AND ")
		}
		s += " ORDER BY " + strings.Join(key, ", ") + fmt.Sprintf(" LIMIT %d", r.cfg.BatchSize)
		return placeholders(s, before)
	}
	q.sql = build(append([]string{"(" + strings.Join(key, ", ") + ") > (" + strings.Join(cursor, ", ") + ")"}, cond...), len(key))
	q.first = build(cond, 0)
	return q, nil
}

// placeholders numbers the bounds' parameters "$%[1]d+i" after the
// before parameters that come first.
func placeholders(s string, before int) string {
	for i := 1; strings.Contains(s, fmt.Sprintf("$%%[1]d+%d", i)); i++ {
		s = strings.ReplaceAll(s, fmt.Sprintf("$%%[1]d+%d", i), fmt.Sprintf("$%d", before+i))
	}
	return s
}

// params are a page's parameters after the cursor (nil: the first page).
func (q *query) params(cursor []string) [][]byte {
	if cursor == nil {
		return q.bounds
	}
	p := make([][]byte, 0, len(cursor)+len(q.bounds))
	for _, v := range cursor {
		p = append(p, []byte(v))
	}
	return append(p, q.bounds...)
}

// page is the query for a page after cursor.
func (q *query) page(cursor []string) string {
	if cursor == nil {
		return q.first
	}
	return q.sql
}

// resume is Summary.Resume after the row whose key is last.
func (q *query) resume(last []string) string {
	if q.byTime {
		return "--since '" + last[0] + "'"
	}
	return "--after-id " + last[0]
}
