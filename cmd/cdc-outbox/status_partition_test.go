package main

import (
	"context"
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestStatusPartitionedOutbox: for a partitioned outbox with quoted names,
// one partition in another schema, status judges the publication by the
// relations it publishes: a publication of one partition misses the other,
// and says so with the statement that fixes it; adding the partitioned
// table, or publishing the schemas (PostgreSQL 15+), covers it.
func TestStatusPartitionedOutbox(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	slot := testenv.Name("slot")
	testenv.Exec(t, url, `CREATE SCHEMA "Billing";
		CREATE TABLE "Billing"."Outbox Events" (id bigserial, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
			event_type text NOT NULL, payload jsonb NOT NULL) PARTITION BY HASH (id);
		CREATE TABLE "Billing".p1 PARTITION OF "Billing"."Outbox Events" FOR VALUES WITH (MODULUS 2, REMAINDER 0);
		CREATE TABLE public."P2" PARTITION OF "Billing"."Outbox Events" FOR VALUES WITH (MODULUS 2, REMAINDER 1);
		CREATE PUBLICATION cdc_outbox FOR TABLE "Billing".p1 WITH (publish = 'insert')`)
	testenv.Exec(t, url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	args := []string{"--postgres-url", url, "--slot", slot, "--table", ` "Billing" . "Outbox Events" `}

	code, out, errOut := status(t, args...)
	want := `does not publish partition public."P2" of the outbox "Billing"."Outbox Events": run ALTER PUBLICATION "cdc_outbox" ADD TABLE "Billing"."Outbox Events"`
	if code != 0 || !strings.Contains(squash(out), `table: "Billing"."Outbox Events" exists: yes in publication: no`) || !strings.Contains(out, want) {
		t.Fatalf("exit %d, want 0, %q and the warning %q\nstdout:\n%s\nstderr:\n%s", code, "in publication: no", want, out, errOut)
	}

	testenv.Exec(t, url, `ALTER PUBLICATION cdc_outbox ADD TABLE "Billing"."Outbox Events"`)
	code, out, _ = status(t, args...)
	if code != 0 || !strings.Contains(squash(out), `tables: "Billing".p1, public."P2" table`) || !strings.Contains(squash(out), "in publication: yes") ||
		strings.Contains(out, "ADD TABLE") {
		t.Fatalf("after ADD TABLE: exit %d\n%s", code, out)
	}

	var version int
	if err := testenv.Connect(t, url).QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Logf("PostgreSQL %d has no FOR TABLES IN SCHEMA publications: that part is not run", version)
		return
	}
	// Publishing the schema of the partitioned table publishes its
	// partitions, wherever they live; publishing the other schema alone
	// publishes only the partition there.
	for _, tc := range []struct {
		schema string
		whole  bool
	}{{`"Billing"`, true}, {"public", false}} {
		testenv.Exec(t, url, `DROP PUBLICATION cdc_outbox; CREATE PUBLICATION cdc_outbox FOR TABLES IN SCHEMA `+tc.schema+` WITH (publish = 'insert')`)
		code, out, _ := status(t, args...)
		if code != 0 || strings.Contains(squash(out), "in publication: yes") != tc.whole {
			t.Errorf("FOR TABLES IN SCHEMA %s: exit %d, want in publication %v\n%s", tc.schema, code, tc.whole, out)
		}
		if !tc.whole && !strings.Contains(out, `does not publish partition "Billing".p1`) {
			t.Errorf("FOR TABLES IN SCHEMA %s: the warning does not name the partition missed\n%s", tc.schema, out)
		}
	}
}
