package sql_test

import (
	"os"
	"slices"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// TestPublicationSQLIsTheContract applies sql/publication.sql to a real
// server and reads back from the catalog what it made: the table package
// contract names (contract.DefaultTable), with a column of each name the
// contract gives, of a type the streamer publishes, NOT NULL where every
// row needs the value. The streamer's defaults, its mapping and package
// outbox all take their names from the contract; this keeps the file
// people run to make the table in step with them.
func TestPublicationSQLIsTheContract(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.Database(t)
	testenv.Exec(t, url, string(script))

	want := []struct {
		name    string
		types   []string // format_type of the column: the types the streamer reads for it
		notNull bool
	}{
		{contract.ColumnID, []string{"bigint", "uuid", "text"}, true},
		{contract.ColumnAggregateType, []string{"text"}, true},
		{contract.ColumnAggregateID, []string{"text"}, true},
		{contract.ColumnEventType, []string{"text"}, true},
		{contract.ColumnPayload, []string{"jsonb", "json", "text", "bytea"}, true},
		{contract.ColumnHeaders, []string{"jsonb", "json"}, false},
		{contract.ColumnCreatedAt, []string{"timestamp with time zone"}, true},
	}
	conn := testenv.Connect(t, url)
	ctx := testenv.Context(t)
	rows, err := conn.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
		FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`,
		contract.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	type column struct {
		typ     string
		notNull bool
	}
	got := map[string]column{}
	var order []string
	for rows.Next() {
		var name string
		var c column
		if err := rows.Scan(&name, &c.typ, &c.notNull); err != nil {
			t.Fatal(err)
		}
		got[name] = c
		order = append(order, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatalf("publication.sql made no table %s", contract.DefaultTable)
	}
	if len(got) != len(want) {
		t.Errorf("table %s has columns %v; the contract names %d", contract.DefaultTable, order, len(want))
	}
	for _, w := range want {
		c, ok := got[w.name]
		switch {
		case !ok:
			t.Errorf("table %s has no column %q (contract); it has %v", contract.DefaultTable, w.name, order)
		case !slices.Contains(w.types, c.typ):
			t.Errorf("column %q is %s; the streamer reads it as one of %v", w.name, c.typ, w.types)
		case c.notNull != w.notNull:
			t.Errorf("column %q: NOT NULL is %v, want %v", w.name, c.notNull, w.notNull)
		}
	}
}
