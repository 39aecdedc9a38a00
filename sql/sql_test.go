package sql_test

import (
	"os"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestPublicationSQLIsRerunnable applies sql/publication.sql twice to a real
// server: people run it from deploy scripts, so a second run must succeed
// and leave one publication on exactly the outbox table, insert-only.
func TestPublicationSQLIsRerunnable(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.Database(t)
	testenv.Exec(t, url, string(script))
	testenv.Exec(t, url, string(script))

	conn := testenv.Connect(t, url)
	var tables int
	var ins, upd, del bool
	err = conn.QueryRow(testenv.Context(t), `
		SELECT (SELECT count(*) FROM pg_publication_tables WHERE pubname = 'cdc_outbox' AND tablename = 'outbox'),
		       pubinsert, pubupdate, pubdelete
		FROM pg_publication WHERE pubname = 'cdc_outbox'`).Scan(&tables, &ins, &upd, &del)
	if err != nil {
		t.Fatal(err)
	}
	if tables != 1 || !ins || upd || del {
		t.Fatalf("publication: tables=%d insert=%v update=%v delete=%v; want the outbox table, insert only", tables, ins, upd, del)
	}
}
