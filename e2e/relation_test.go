package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// The outbox is a relation, not a name: these tests change what the outbox
// table is (partitioned, partitions created, attached, detached and dropped,
// renamed, moved, quoted names, shared publications) while writers commit,
// and count every event.

// partitionedOutbox replaces the default outbox table with one partitioned
// by LIST on a bucket column. The bucket's default is the current bucket of
// outbox_clock, so the writers, who never name it, move to a new partition
// when the test calls setBucket: time-based partitioning with the test
// holding the clock. Partition outbox_1 holds bucket 1. The publication is
// dropped; the test makes its own, or lets cdc-outbox create it.
func (e *env) partitionedOutbox() {
	e.t.Helper()
	testenv.Exec(e.t, e.url, `DROP PUBLICATION cdc_outbox; DROP TABLE outbox;
		CREATE TABLE outbox_clock (bucket int NOT NULL);
		INSERT INTO outbox_clock VALUES (1);
		CREATE FUNCTION outbox_bucket() RETURNS int LANGUAGE sql STABLE AS 'SELECT bucket FROM outbox_clock';
		CREATE TABLE outbox (
			id             bigserial,
			bucket         int         NOT NULL DEFAULT outbox_bucket(),
			aggregate_type text        NOT NULL,
			aggregate_id   text        NOT NULL,
			event_type     text        NOT NULL,
			payload        jsonb       NOT NULL,
			headers        jsonb,
			created_at     timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (id, bucket)
		) PARTITION BY LIST (bucket);
		CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES IN (1)`)
}

// setBucket sends the writers' next rows to partition n, once every
// transaction that was open when it was called has ended. A transaction
// that already holds its lock on the outbox keeps the partitions it knew
// (PostgreSQL reads the new ones when a transaction first locks the
// table), so a row for a partition made during that transaction finds
// none: "no partition of relation "outbox" found for row". A retention job
// makes partitions ahead of their time for the same reason.
func (e *env) setBucket(n int) {
	e.t.Helper()
	ctx := testenv.Context(e.t)
	var since time.Time
	if err := e.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since); err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, time.Minute, "the transactions open before the new partition to end", func() bool {
		var open int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend'
				AND pid <> pg_backend_pid() AND xact_start < $1`, since).Scan(&open)
		if err != nil {
			e.t.Fatal(err)
		}
		return open == 0
	})
	testenv.Exec(e.t, e.url, `UPDATE outbox_clock SET bucket = $1`, n)
}

// pubViaRoot reads the publication's publish_via_partition_root.
func (e *env) pubViaRoot(publication string) bool {
	e.t.Helper()
	var via bool
	if err := e.pool.QueryRow(testenv.Context(e.t), `SELECT pubviaroot FROM pg_publication WHERE pubname = $1`, publication).Scan(&via); err != nil {
		e.t.Fatal(err)
	}
	return via
}

// oid is a relation's OID, as the error messages name it.
func (e *env) oid(relation string) string {
	e.t.Helper()
	var oid string
	if err := e.pool.QueryRow(testenv.Context(e.t), `SELECT $1::regclass::oid::text`, relation).Scan(&oid); err != nil {
		e.t.Fatal(err)
	}
	return oid
}

// unescaped is the streamer's JSON log with its quotes unescaped, so tests
// can look for messages that quote names.
func (s *streamer) unescaped() string { return strings.ReplaceAll(s.logText(), `\"`, `"`) }

// logged reports whether one line of the streamer's log has every part.
func (s *streamer) logged(parts ...string) bool {
	for _, line := range strings.Split(s.logText(), "\n") {
		found := true
		for _, p := range parts {
			found = found && strings.Contains(line, p)
		}
		if found {
			return true
		}
	}
	return false
}

// TestPartitionedOutbox streams a partitioned outbox while writers commit
// and its partitions change under them, the way a partition-maintenance job
// changes them: a partition created, a table attached (sub-partitioned by
// hash, its columns in another order, one dropped), the oldest partition
// detached and dropped once its rows are streamed. With the publication
// cdc-outbox creates (publish_via_partition_root), rows arrive under the
// outbox's relation; with one made by hand without it, under each
// partition's, each looked up as it first appears, and the publication is
// switched to via-root mid-stream as the log advises.
func TestPartitionedOutbox(t *testing.T) {
	t.Parallel()
	for _, byHand := range []bool{false, true} {
		name := "publication created by cdc-outbox"
		if byHand {
			name = "publication made by hand without publish_via_partition_root"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.partitionedOutbox()
			if byHand {
				testenv.Exec(t, e.url, `CREATE PUBLICATION cdc_outbox FOR TABLE outbox WITH (publish = 'insert')`)
			}
			s := e.start()
			e.waitStreaming()
			if via := e.pubViaRoot("cdc_outbox"); via == byHand {
				t.Fatalf("publish_via_partition_root is %v", via)
			}
			ctx := testenv.Context(t)
			wl := newWorkload(e)
			stop := wl.steady(ctx, 5*time.Millisecond)
			defer stop()
			wl.progress(t, 200)

			testenv.Exec(t, e.url, `CREATE TABLE outbox_2 PARTITION OF outbox FOR VALUES IN (2)`)
			e.setBucket(2)
			wl.progress(t, 200)

			testenv.Exec(t, e.url, `CREATE TABLE outbox_3 (
					payload jsonb NOT NULL, junk text, created_at timestamptz NOT NULL DEFAULT now(), id bigint NOT NULL,
					event_type text NOT NULL, aggregate_id text NOT NULL, aggregate_type text NOT NULL, headers jsonb, bucket int NOT NULL
				) PARTITION BY HASH (id);
				ALTER TABLE outbox_3 DROP COLUMN junk;
				CREATE TABLE outbox_3a PARTITION OF outbox_3 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
				CREATE TABLE outbox_3b PARTITION OF outbox_3 FOR VALUES WITH (MODULUS 2, REMAINDER 1);
				ALTER TABLE outbox ATTACH PARTITION outbox_3 FOR VALUES IN (3)`)
			e.setBucket(3)
			wl.progress(t, 200)

			// Retention: detach and drop the oldest partition once its rows
			// are streamed (confirmed).
			e.waitConfirmed(e.currentLSN(), time.Minute, time.Now())
			testenv.Exec(t, e.url, `ALTER TABLE outbox DETACH PARTITION outbox_1; DROP TABLE outbox_1`)
			wl.progress(t, 200)
			if byHand {
				testenv.Exec(t, e.url, `ALTER PUBLICATION cdc_outbox SET (publish_via_partition_root = true)`)
				wl.progress(t, 200)
			}
			stop()

			wl.check([]string{"payment"}, "across partitions created, attached, detached and dropped")
			log := s.unescaped()
			if byHand {
				for _, want := range []string{"publish_via_partition_root is off", `ALTER PUBLICATION "cdc_outbox" SET (publish_via_partition_root = true)`} {
					if !strings.Contains(log, want) {
						t.Errorf("the log lacks the warning %q", want)
					}
				}
			}
			// Every partition that got rows was looked up and found to be
			// the outbox's. (pgoutput describes the partition a row was
			// written to even when it sends the row under the root.)
			for _, p := range []string{"public.outbox_1", "public.outbox_2", "public.outbox_3a", "public.outbox_3b"} {
				if !s.logged(`"msg":"streaming the inserts of a relation of the outbox"`, `"relation":"`+p+`"`) {
					t.Errorf("the log does not show partition %s looked up", p)
				}
			}
			s.stop()
		})
	}
}

// TestPartitionDroppedBeforeStreamed drops a partition whose rows are not
// streamed yet, while cdc-outbox is stopped (retention run by a job that
// does not wait). With publish_via_partition_root its rows arrived under the
// outbox's relation: all delivered. Without it they arrive under a relation
// that no longer exists and cannot be told from another table's: under
// fail, cdc-outbox stops naming the relation, the event, the LSN and the
// fix, confirming nothing past it; restarted under dead-letter, the rows go
// to the dead-letter topic and the rest arrive.
func TestPartitionDroppedBeforeStreamed(t *testing.T) {
	t.Parallel()
	for _, viaRoot := range []bool{true, false} {
		t.Run(fmt.Sprintf("publish_via_partition_root=%v", viaRoot), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.partitionedOutbox()
			testenv.Exec(t, e.url, `CREATE TABLE outbox_2 PARTITION OF outbox FOR VALUES IN (2)`)
			testenv.Exec(t, e.url, fmt.Sprintf(`CREATE PUBLICATION cdc_outbox FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = %v)`, viaRoot))
			s := e.start()
			e.waitStreaming()
			s.stop()

			ctx := testenv.Context(t)
			before := newWorkload(e)
			if err := before.write(ctx, 0, 5, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			// The first transaction of the dropped partition's rows is
			// committed by this position: the slot must stay below it
			// until they reached Kafka or the dead-letter topic.
			firstCommitted := e.currentLSN()
			if err := before.write(ctx, 0, 45, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			e.setBucket(2)
			after := newWorkload(e)
			if err := after.write(ctx, 1, 50, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			var oid, first string
			if err := e.pool.QueryRow(ctx, `SELECT 'outbox_1'::regclass::oid::text, min(id)::text FROM outbox_1`).Scan(&oid, &first); err != nil {
				t.Fatal(err)
			}
			testenv.Exec(t, e.url, `ALTER TABLE outbox DETACH PARTITION outbox_1; DROP TABLE outbox_1`)

			if viaRoot {
				s = e.start()
				before.check([]string{"payment"}, "rows of the dropped partition")
				after.check([]string{"payment"}, "rows of the partition kept")
				s.stop()
				return
			}
			s = e.start()
			if err := s.exited(time.Minute); err == nil {
				t.Fatal("the streamer exited 0 on the rows of a dropped partition")
			}
			log := s.unescaped()
			for _, want := range []string{"bad event " + first + " at LSN ", "relation public.outbox_1 (OID " + oid + ")",
				"no longer exists", `ALTER PUBLICATION "cdc_outbox" SET (publish_via_partition_root = true)`, "--on-bad-event=dead-letter"} {
				if !strings.Contains(log, want) {
					t.Fatalf("the error lacks %q:\n%s", want, log)
				}
			}
			if confirmed, _ := e.slotLSNs(); confirmed >= firstCommitted {
				t.Fatalf("the slot confirmed %d, past the dropped partition's first transaction (committed by %d)", confirmed, firstCommitted)
			}

			dlq := e.prefix + ".dead-letter"
			s = e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)
			after.check([]string{"payment"}, "rows after the dropped partition's")
			got := map[string]bool{}
			cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			for len(got) < 50 && pctx.Err() == nil {
				cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
					if header(r, "source_table") != "public.outbox_1" {
						t.Errorf("dead-letter record from %q", header(r, "source_table"))
					}
					got[header(r, "id")] = true
				})
			}
			for _, ev := range before.events {
				if !got[ev.id] {
					t.Fatalf("event %s of the dropped partition is not in the dead-letter topic (%d are)", ev.id, len(got))
				}
			}
			t.Logf("dead-letter topic: the %d rows of the dropped partition", len(got))
			s.stop()
		})
	}
}

// TestPublicationMissesPartition: a publication made by hand that lists
// one partition of the outbox but not the other is refused at start, with
// the statement that fixes it; after it, everything streams.
func TestPublicationMissesPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.partitionedOutbox()
	testenv.Exec(t, e.url, `CREATE TABLE outbox_2 PARTITION OF outbox FOR VALUES IN (2);
		CREATE PUBLICATION cdc_outbox FOR TABLE outbox_1 WITH (publish = 'insert')`)
	s := e.start()
	if err := s.exited(time.Minute); err == nil {
		t.Fatal("the streamer started with a publication that misses a partition")
	}
	want := `publication "cdc_outbox" does not publish partition public.outbox_2 of the outbox public.outbox: run ALTER PUBLICATION "cdc_outbox" ADD TABLE "public"."outbox"`
	if !strings.Contains(s.unescaped(), want) {
		t.Fatalf("the error lacks %q:\n%s", want, s.logText())
	}
	testenv.Exec(t, e.url, `ALTER PUBLICATION "cdc_outbox" ADD TABLE "public"."outbox"`)
	s = e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	if err := wl.write(ctx, 0, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	e.setBucket(2)
	if err := wl.write(ctx, 1, 50, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "after adding the partitioned table")
	s.stop()
}

// TestOutboxRenamedMidStream renames the outbox table, or moves it to
// another schema, and back again, while writers commit. The writers keep
// their statement: a view under the old name forwards their inserts, as in
// a rename done in two deploys. cdc-outbox follows the relation, logs each
// change once at INFO, and its publication check does not take the renamed
// table for a missing one.
func TestOutboxRenamedMidStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, away, back string }{
		{"renamed", `ALTER TABLE outbox RENAME TO outbox_renamed; CREATE VIEW outbox AS SELECT * FROM outbox_renamed`,
			`DROP VIEW outbox; ALTER TABLE outbox_renamed RENAME TO outbox`},
		{"moved to another schema", `CREATE SCHEMA archive; ALTER TABLE outbox SET SCHEMA archive; CREATE VIEW public.outbox AS SELECT * FROM archive.outbox`,
			`DROP VIEW public.outbox; ALTER TABLE archive.outbox SET SCHEMA public`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			s := e.start("--slot-poll-interval", "1s")
			e.waitStreaming()
			ctx := testenv.Context(t)
			wl := newWorkload(e)
			stop := wl.steady(ctx, 5*time.Millisecond)
			defer stop()
			wl.progress(t, 200)
			// One transaction, so the writers never find the name missing.
			testenv.Exec(t, e.url, "BEGIN; "+tc.away+"; COMMIT")
			wl.progress(t, 300)
			testenv.Exec(t, e.url, "BEGIN; "+tc.back+"; COMMIT")
			wl.progress(t, 200)
			stop()
			wl.check([]string{"payment"}, "across the rename and back")

			log := s.logText()
			lines := 0
			for _, l := range strings.Split(log, "\n") {
				if strings.Contains(l, "was renamed or moved") {
					lines++
					if !strings.Contains(l, `"level":"INFO"`) {
						t.Errorf("not at INFO: %s", l)
					}
				}
			}
			if lines != 2 {
				t.Errorf("%d lines say the outbox was renamed or moved, want 2 (away and back):\n%s", lines, log)
			}
			if strings.Contains(log, "not in the publication") {
				t.Errorf("the publication check took the renamed table for a missing one:\n%s", log)
			}
			s.stop()
		})
	}
}

// TestOtherTablesInPublication streams from a publication shared on
// purpose, FOR ALL TABLES: inserts into tables that provably are not the
// outbox (they lack its columns) are skipped and counted as other_table;
// every outbox event arrives.
func TestOtherTablesInPublication(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP PUBLICATION cdc_outbox;
		CREATE TABLE orders (id bigserial PRIMARY KEY, total numeric NOT NULL);
		CREATE TABLE audit (id bigserial PRIMARY KEY, event_type text, payload jsonb);
		CREATE PUBLICATION cdc_outbox FOR ALL TABLES WITH (publish = 'insert')`)
	s := e.start()
	e.waitStreaming()
	addr := s.httpAddr()
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	stop := wl.steady(ctx, 5*time.Millisecond)
	defer stop()
	for range 20 {
		testenv.Exec(t, e.url, `INSERT INTO orders (total) VALUES (12.5); INSERT INTO audit (event_type, payload) VALUES ('x', '{}')`)
	}
	stop()
	wl.check([]string{"payment"}, "beside other tables")
	eventually(t, 30*time.Second, "40 inserts into other tables counted as skipped", func() bool {
		return scrape(t, addr)[`cdc_outbox_events_skipped_total{reason="other_table"}`] >= 40
	})
	for _, table := range []string{"public.orders", "public.audit"} {
		if !s.logged("its inserts are skipped (other_table)", `"relation":"`+table+`"`) {
			t.Errorf("the log does not say that %s is skipped:\n%s", table, s.logText())
		}
	}
	s.stop()
}

// TestUnmappedRelationInPublication: the publication also sends a table that
// has the outbox's columns but is not the outbox (here a copy of it), which
// cdc-outbox cannot tell from a partition detached before its rows were
// streamed. Its insert is never skipped: under fail, cdc-outbox stops naming
// the relation (schema, name, OID), the event, the LSN and the fix, and
// confirms nothing past it; under dead-letter the row goes to the
// dead-letter topic and the events after it arrive.
func TestUnmappedRelationInPublication(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			testenv.Exec(t, e.url, `CREATE TABLE outbox_copy (LIKE outbox INCLUDING ALL);
				ALTER PUBLICATION cdc_outbox ADD TABLE outbox_copy`)
			oid := e.oid("outbox_copy")
			dlq := e.prefix + ".dead-letter"
			s := e.start("--on-bad-event", policy, "--dead-letter-topic", dlq)
			e.waitStreaming()
			ctx := testenv.Context(t)
			wl := newWorkload(e)
			if err := wl.write(ctx, 0, 20, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			wl.check([]string{"payment"}, "before the unmapped row")
			var id string
			if err := e.pool.QueryRow(ctx, `INSERT INTO outbox_copy (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('payment', 'copy-1', 'Copied', '{}') RETURNING id::text`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			// The row's commit ends at or before this position; the slot
			// must stay below it. (It may pass the row's first record:
			// a transaction whose commit is past the confirmed position is
			// sent again whole.)
			committed := e.currentLSN()
			if err := wl.write(ctx, 1, 20, 5, "payment", false); err != nil {
				t.Fatal(err)
			}

			if policy == "fail" {
				if err := s.exited(time.Minute); err == nil {
					t.Fatal("the streamer exited 0 on an unmapped row")
				}
				log := s.unescaped()
				for _, want := range []string{"bad event " + id + " at LSN ", "relation public.outbox_copy (OID " + oid + ")",
					"cannot be mapped to the outbox table", "a publication of its own"} {
					if !strings.Contains(log, want) {
						t.Fatalf("the error lacks %q:\n%s", want, log)
					}
				}
				if confirmed, _ := e.slotLSNs(); confirmed >= committed {
					t.Fatalf("the slot confirmed %d, past the unmapped row (committed by %d)", confirmed, committed)
				}
				return
			}
			wl.check([]string{"payment"}, "after the unmapped row")
			cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			fetches := cl.PollRecords(pctx, 1)
			if err := fetches.Err(); err != nil {
				t.Fatalf("read the dead-letter topic: %v", err)
			}
			r := fetches.Records()[0]
			if header(r, "id") != id || header(r, "source_table") != "public.outbox_copy" || !strings.Contains(header(r, "error"), "OID "+oid) {
				t.Fatalf("dead-letter record: headers %v", r.Headers)
			}
			s.stop()
		})
	}
}

// TestQuotedTableName streams outbox tables whose names PostgreSQL keeps
// only in quotes: capitals and a space, and a dot and a quote inside the
// parts (one of them partitioned, a partition in another schema), given to
// --table the way they are written in SQL, with a publication name that
// needs quotes too.
func TestQuotedTableName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, table, setup string }{
		{"capitals and a space", `"Billing"."Outbox Events"`, `CREATE SCHEMA "Billing";
			CREATE TABLE "Billing"."Outbox Events" (LIKE public.outbox INCLUDING ALL)`},
		{"dots and a quote, partitioned", `"odd.schema"."Out""box.v2"`, `CREATE SCHEMA "odd.schema";
			CREATE TABLE "odd.schema"."Out""box.v2" (LIKE public.outbox INCLUDING DEFAULTS) PARTITION BY HASH (id);
			CREATE TABLE "odd.schema"."p.0" PARTITION OF "odd.schema"."Out""box.v2" FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE TABLE public."P1" PARTITION OF "odd.schema"."Out""box.v2" FOR VALUES WITH (MODULUS 2, REMAINDER 1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			testenv.Exec(t, e.url, tc.setup)
			s := e.start("--table", tc.table, "--publication", "Billing Events")
			e.waitStreaming()
			wl := newWorkload(e)
			wl.insert = strings.Replace(insertEvent, "outbox", tc.table, 1)
			ctx := testenv.Context(t)
			for w := range 2 {
				if err := wl.write(ctx, w, 100, 5, "payment", false); err != nil {
					t.Fatal(err)
				}
			}
			wl.check([]string{"payment"}, "from "+tc.table)
			s.stop()
		})
	}
}
