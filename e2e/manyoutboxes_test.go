package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// Many outboxes in one stream: schemas each with an outbox table of their
// own (and their own id sequence, so ids repeat across tables), streamed by
// one cdc-outbox over one slot and one publication. Events are told apart by
// their source header (each table's identity) and id.

// tenants is a set of outbox tables and what was committed to them.
type tenants struct {
	e      *env
	mu     sync.Mutex
	events []tenantEvent
	seq    map[string]int // by aggregate
}

// tenantEvent is one committed event of a tenant's outbox.
type tenantEvent struct {
	table     string // schema.table
	id        string
	aggregate string
	seq       int
}

func newTenants(e *env) *tenants { return &tenants{e: e, seq: map[string]int{}} }

// tenantOutbox is the DDL of an outbox table name (schema-qualified, in a
// schema that exists) shaped like the default one.
func tenantOutbox(name string) string {
	return `CREATE TABLE ` + name + ` (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`
}

// create makes n schemas <prefix>00.. each with an outbox table, and
// returns the tables' names.
func (ts *tenants) create(prefix string, n int) []string {
	var tables, ddl []string
	for i := range n {
		schema := fmt.Sprintf("%s%02d", prefix, i)
		tables = append(tables, schema+".outbox")
		ddl = append(ddl, "CREATE SCHEMA "+schema, tenantOutbox(schema+".outbox"))
	}
	testenv.Exec(ts.e.t, ts.e.url, strings.Join(ddl, "; "))
	return tables
}

// write commits n events into table in transactions of txSize, over 5
// aggregates of its own.
func (ts *tenants) write(ctx context.Context, table string, n, txSize int) error {
	for done := 0; done < n; {
		tx, err := ts.e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		var batch []tenantEvent
		for i := 0; i < txSize && done+i < n; i++ {
			agg := fmt.Sprintf("%s-a%d", table, (done+i)%5)
			ts.mu.Lock()
			ts.seq[agg]++
			seq := ts.seq[agg]
			ts.mu.Unlock()
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'PaymentCreated', $2) RETURNING id`,
				agg, fmt.Sprintf(`{"seq": %d}`, seq)).Scan(&id)
			if err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("%s: %w", table, err)
			}
			batch = append(batch, tenantEvent{table: table, id: strconv.FormatInt(id, 10), aggregate: agg, seq: seq})
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("%s: %w", table, err)
		}
		done += len(batch)
		ts.mu.Lock()
		ts.events = append(ts.events, batch...)
		ts.mu.Unlock()
	}
	return nil
}

// writeAll writes n events into each table from a writer of its own and
// returns the wait for them, which fails the test on a writer's error.
func (ts *tenants) writeAll(ctx context.Context, tables []string, n, txSize int) (wait func()) {
	errs := make(chan error, len(tables))
	for _, table := range tables {
		go func() { errs <- ts.write(ctx, table, n, txSize) }()
	}
	return func() {
		ts.e.t.Helper()
		for range tables {
			if err := <-errs; err != nil {
				ts.e.t.Fatalf("writer: %v", err)
			}
		}
	}
}

// committed is how many events have been committed so far.
func (ts *tenants) committed() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.events)
}

// killUnderLoad SIGKILLs s kills times while the writers commit total
// events, each kill once a further share of them is committed and the
// stream (restarted by start) confirmed progress, and returns the last
// streamer started.
func (ts *tenants) killUnderLoad(s *streamer, kills, total int, start func() *streamer) *streamer {
	t, e := ts.e.t, ts.e
	for i := range kills {
		lsn := e.currentLSN()
		eventually(t, 2*time.Minute, "the writers to commit their next share", func() bool { return ts.committed() >= total*(i+1)/(kills+1) })
		e.waitConfirmedPast(lsn)
		t.Logf("SIGKILL %d with %d of %d events committed", i+1, ts.committed(), total)
		s.kill()
		s = start()
	}
	return s
}

// sources is each table's default source, "<system identifier>/<database
// OID>/<table OID>", by source.
func (ts *tenants) sources(tables []string) map[string]string {
	out := map[string]string{}
	for _, table := range tables {
		var s string
		err := ts.e.pool.QueryRow(testenv.Context(ts.e.t), `SELECT (SELECT system_identifier FROM pg_control_system())::text
			|| '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/' || $1::regclass::oid::text`, table).Scan(&s)
		if err != nil {
			ts.e.t.Fatal(err)
		}
		out[s] = table
	}
	return out
}

// tenantVerdict is what the verifier found, over every table.
type tenantVerdict struct {
	expected, missing, duplicates, orderViolations, unknown int
	tables                                                  int // distinct tables the records came from
	missingIDs                                              []string
	records                                                 map[string]int // records by source/id
}

func (v tenantVerdict) String() string {
	return fmt.Sprintf("expected=%d missing=%d duplicates=%d order_violations=%d unknown_source=%d tables=%d",
		v.expected, v.missing, v.duplicates, v.orderViolations, v.unknown, v.tables)
}

// verify reads topic until every committed event of the tables (by source)
// arrived or timeout, checking per-aggregate order of first deliveries.
func (ts *tenants) verify(topic string, sources map[string]string, timeout time.Duration, opts ...kgo.Opt) tenantVerdict {
	t := ts.e.t
	t.Helper()
	ts.mu.Lock()
	want := map[string]tenantEvent{} // by table/id
	for _, ev := range ts.events {
		want[ev.table+"/"+ev.id] = ev
	}
	ts.mu.Unlock()
	cl := testenv.KafkaClient(t, append([]kgo.Opt{kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AllowAutoTopicCreation(), kgo.MetadataMinAge(250 * time.Millisecond)}, opts...)...)
	v := tenantVerdict{expected: len(want), records: map[string]int{}}
	seen, lastSeq, tables := 0, map[string]int{}, map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for seen < len(want) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			table, ok := sources[header(r, "source")]
			if !ok {
				v.unknown++
				return
			}
			tables[table] = true
			key := table + "/" + header(r, "id")
			v.records[key]++
			if v.records[key] > 1 {
				v.duplicates++
				return
			}
			if _, ok := want[key]; ok {
				seen++
			}
			var body struct{ Seq int }
			_ = json.Unmarshal(r.Value, &body)
			if agg := string(r.Key); body.Seq <= lastSeq[agg] {
				v.orderViolations++
			} else {
				lastSeq[agg] = body.Seq
			}
		})
	}
	for key := range want {
		if v.records[key] == 0 {
			v.missing++
			if len(v.missingIDs) < 20 {
				v.missingIDs = append(v.missingIDs, key)
			}
		}
	}
	v.tables = len(tables)
	return v
}

// manyArgs are the flags of a stream of the outboxes pattern over a
// publication of the test's own, which cdc-outbox creates.
func (e *env) manyArgs(pattern string, extra ...string) []string {
	return append([]string{"--table", pattern, "--publication", e.slot}, extra...)
}

// waitConfirmedPast waits until the slot confirmed lsn: the restarted
// stream has made progress (a SIGKILL then interrupts real work).
func (e *env) waitConfirmedPast(lsn int64) {
	e.t.Helper()
	eventually(e.t, 2*time.Minute, "the slot to confirm progress", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= lsn
	})
}

// TestManyOutboxesOneSlot: 20 schemas, each with an outbox and a writer,
// streamed by one cdc-outbox through --table '*.outbox', SIGKILLed three
// times while they write: every event of every table arrives, in order per
// aggregate, each with its own table's source.
func TestManyOutboxesOneSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`) // only the tenants' outboxes match
	ts := newTenants(e)
	tables := ts.create("mo_", 20)
	s := e.start(e.manyArgs("*.outbox")...)
	e.waitStreaming()
	ctx := testenv.Context(t)
	wait := ts.writeAll(ctx, tables, 1000, 5)
	s = ts.killUnderLoad(s, 3, 20*1000, func() *streamer { return e.start(e.manyArgs("*.outbox")...) })
	wait()
	v := ts.verify(e.topic("payment"), ts.sources(tables), 3*time.Minute)
	t.Logf("verifier across 20 outboxes and 3 SIGKILLs: %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.unknown != 0 || v.tables != len(tables) {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	eventually(t, time.Minute, "the start line to count 20 tables", func() bool { return s.logged(`"msg":"starting"`, `"tables":20`) })

	// status lists every outbox, with the shared slot; the running
	// streamer's metrics say what it streamed of each since its start.
	metricsURL := "http://" + s.httpAddr() + "/metrics"
	var r struct {
		Verdict  string `json:"verdict"`
		Slot     string `json:"slot"`
		Active   bool   `json:"active"`
		Outboxes []struct {
			Table          string `json:"table"`
			InPublication  bool   `json:"in_publication"`
			EventsStreamed int64  `json:"events_streamed"`
		} `json:"outboxes"`
	}
	eventually(t, time.Minute, "status to list 20 outboxes in the publication", func() bool {
		out, _ := exec.Command(binary, "status", "--json", "--postgres-url", e.url, "--slot", e.slot, "--publication", e.slot,
			"--table", "*.outbox", "--metrics-url", metricsURL).Output()
		if err := json.Unmarshal(out, &r); err != nil || len(r.Outboxes) != 20 || !r.Active {
			return false
		}
		for _, o := range r.Outboxes {
			if !o.InPublication || o.EventsStreamed < 0 {
				return false
			}
		}
		return true
	})
	t.Logf("status: verdict %s, slot %s active %v, %d outboxes", r.Verdict, r.Slot, r.Active, len(r.Outboxes))
	s.stop()
}

// TestOutboxDroppedMidStream: of three outboxes in one stream, one is
// dropped while the others are written: the stream goes on, its rows
// committed before the drop arrive, and so does every row of the others.
func TestOutboxDroppedMidStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	tables := ts.create("dr_", 3)
	sources := ts.sources(tables) // before the drop: the OID goes with it
	s := e.start(e.manyArgs("dr_*.outbox", "--slot-poll-interval", "1s")...)
	e.waitStreaming()
	ctx := testenv.Context(t)
	if err := ts.write(ctx, tables[0], 50, 5); err != nil {
		t.Fatal(err)
	}
	wait := ts.writeAll(ctx, tables[1:], 100, 5)
	testenv.Exec(t, e.url, `DROP TABLE `+tables[0])
	wait()
	v := ts.verify(e.topic("payment"), sources, 2*time.Minute)
	t.Logf("verifier with one of three outboxes dropped: %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.unknown != 0 {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	eventually(t, time.Minute, "the monitor to log the dropped table", func() bool {
		return s.logged(`an outbox table was dropped`, tables[0])
	})
	s.stop()
}

// TestManyOutboxesBadRow: a row breaking the contract in one of two
// outboxes. Under fail the stream stops naming its table and event, and
// confirms nothing past it; under dead-letter the row goes to the
// dead-letter topic with its own table's source, and the events of both
// tables after it arrive.
func TestManyOutboxesBadRow(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
			ts := newTenants(e)
			tables := ts.create("bad_", 2)
			sources := ts.sources(tables)
			dlq := e.prefix + ".dead-letter"
			s := e.start(e.manyArgs("bad_*.outbox", "--on-bad-event", policy, "--dead-letter-topic", dlq)...)
			e.waitStreaming()
			ctx := testenv.Context(t)
			if err := ts.write(ctx, tables[0], 10, 5); err != nil {
				t.Fatal(err)
			}
			// The bad row: its aggregate type makes no valid topic name.
			var id string
			if err := e.pool.QueryRow(ctx, `INSERT INTO `+tables[1]+` (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('bad/topic', 'x', 'PaymentCreated', '{}') RETURNING id::text`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			after := e.currentLSN()
			if policy == "fail" {
				if err := s.exited(60 * time.Second); err == nil {
					t.Fatal("the streamer exited 0 after a bad event under fail")
				}
				log := strings.ReplaceAll(s.logText(), `\"`, `"`)
				if !strings.Contains(log, "bad event "+id+" at LSN ") || !strings.Contains(log, " in table "+tables[1]+": ") {
					t.Fatalf("the error lacks event %s, its LSN or its table %s:\n%s", id, tables[1], log)
				}
				e.waitSlotInactive()
				if confirmed, _ := e.slotLSNs(); confirmed >= after {
					t.Fatalf("the slot confirmed %d, past the bad event (WAL at %d after it)", confirmed, after)
				}
				return
			}
			wait := ts.writeAll(ctx, tables, 20, 5)
			wait()
			v := ts.verify(e.topic("payment"), sources, 2*time.Minute)
			t.Logf("verifier with a bad row in one of two outboxes (dead-letter): %s", v)
			if v.missing != 0 || v.unknown != 0 {
				t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
			}
			cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			fetches := cl.PollRecords(pctx, 1)
			if err := fetches.Err(); err != nil {
				t.Fatalf("read the dead-letter topic: %v", err)
			}
			r := fetches.Records()[0]
			if header(r, "id") != id || sources[header(r, "source")] != tables[1] || header(r, "source_table") != tables[1] {
				t.Fatalf("dead-letter record: id %q source %q (%s) source_table %q; want id %s of %s",
					header(r, "id"), header(r, "source"), sources[header(r, "source")], header(r, "source_table"), id, tables[1])
			}
			s.stop()
		})
	}
}

// TestBadEventPolicyPerOutbox: the configuration file gives a payments
// outbox the policy fail and the tenants' pattern dead-letter: a tenant's
// bad row goes to the dead-letter topic while every other event streams on;
// a payment's bad row then stops the stream, confirming nothing past it.
func TestBadEventPolicyPerOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	tables := ts.create("pol_", 2) // pol_00.outbox: payments; pol_01.outbox: a tenant's
	sources := ts.sources(tables)
	dlq := e.prefix + ".dead-letter"
	config := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	if err := os.WriteFile(config, []byte(`
outboxes:
  - table: `+tables[0]+`
    on-bad-event: fail
  - table: 'pol_*.outbox'
    on-bad-event: dead-letter
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e.start("--config", config, "--publication", e.slot, "--dead-letter-topic", dlq)
	e.waitStreaming()
	ctx := testenv.Context(t)
	if err := ts.write(ctx, tables[0], 10, 5); err != nil {
		t.Fatal(err)
	}
	badRow := func(table string) (id string) {
		t.Helper()
		// Its aggregate type makes no valid topic name.
		if err := e.pool.QueryRow(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('bad/topic', 'x', 'PaymentCreated', '{}') RETURNING id::text`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	tenantBad := badRow(tables[1])
	wait := ts.writeAll(ctx, tables, 20, 5)
	wait()
	v := ts.verify(e.topic("payment"), sources, 2*time.Minute)
	t.Logf("verifier with a tenant's bad row under its dead-letter policy: %s", v)
	if v.missing != 0 || v.unknown != 0 {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fetches := cl.PollRecords(pctx, 1)
	if err := fetches.Err(); err != nil {
		t.Fatalf("read the dead-letter topic: %v", err)
	}
	if r := fetches.Records()[0]; header(r, "id") != tenantBad || header(r, "source_table") != tables[1] {
		t.Fatalf("dead-letter record: id %q source_table %q; want id %s of %s", header(r, "id"), header(r, "source_table"), tenantBad, tables[1])
	}

	paymentBad := badRow(tables[0])
	after := e.currentLSN()
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 after a bad payment under its policy fail")
	}
	log := strings.ReplaceAll(s.logText(), `\"`, `"`)
	if !strings.Contains(log, "bad event "+paymentBad+" at LSN ") || !strings.Contains(log, " in table "+tables[0]+": ") {
		t.Fatalf("the error lacks event %s, its LSN or its table %s:\n%s", paymentBad, tables[0], log)
	}
	e.waitSlotInactive()
	if confirmed, _ := e.slotLSNs(); confirmed >= after {
		t.Fatalf("the slot confirmed %d, past the bad payment (WAL at %d after it)", confirmed, after)
	}
}

// TestExactlyOnceManyOutboxes: exactly-once delivery of five outboxes in
// one stream, one transactional producer and one checkpoint, SIGKILLed
// twice while they are written: read_committed, every event arrives once.
func TestExactlyOnceManyOutboxes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	tables := ts.create("eo_", 5)
	args := e.manyArgs("eo_*.outbox", exactlyOnce...)
	args = append(args, "--checkpoint-topic", e.prefix+".checkpoints")
	s := e.start(args...)
	e.waitStreaming()
	ctx := testenv.Context(t)
	wait := ts.writeAll(ctx, tables, 3000, 5)
	s = ts.killUnderLoad(s, 2, 5*3000, func() *streamer { return e.start(args...) })
	wait()
	sources := ts.sources(tables)
	v := ts.verify(e.topic("payment"), sources, 3*time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	// Then every committed record to the last stable offset: each event
	// once, and nothing that was not written.
	counts := committedRecordsBy(t, func(r *kgo.Record) string { return sources[header(r, "source")] + "/" + header(r, "id") }, e.topic("payment"))
	ts.mu.Lock()
	want := map[string]bool{}
	for _, ev := range ts.events {
		want[ev.table+"/"+ev.id] = true
	}
	ts.mu.Unlock()
	dups, extra := 0, 0
	for key, n := range counts {
		if !want[key] {
			extra += n
		} else if n > 1 {
			dups += n - 1
		}
	}
	t.Logf("read_committed verifier across 5 outboxes and 2 SIGKILLs: %s; committed records read to the last stable offset: %d duplicates, %d not written", v, dups, extra)
	if v.missing != 0 || v.duplicates != 0 || v.orderViolations != 0 || v.unknown != 0 || dups != 0 || extra != 0 {
		t.Fatalf("exactly-once broken: %s, %d duplicates, %d not written; missing: %v", v, dups, extra, v.missingIDs)
	}
	s.stop()
}

// TestOutboxesFromConfigFile: two outboxes of different shapes in one
// stream, from the configuration file's outboxes list: each row is mapped
// by its own table's columns and topic template, with its own source.
func TestOutboxesFromConfigFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox; CREATE SCHEMA billing; CREATE SCHEMA tenant_a;
		CREATE TABLE billing.outbox (event_id bigserial PRIMARY KEY, kind text NOT NULL, entity text NOT NULL, name text NOT NULL, body jsonb NOT NULL);
		`+tenantOutbox("tenant_a.outbox"))
	config := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	err := os.WriteFile(config, []byte(`
outboxes:
  - table: billing.outbox
    topic: "`+e.prefix+`.billing.{name}"
    column-id: event_id
    column-aggregate-type: kind
    column-aggregate-id: entity
    column-event-type: name
    column-payload: body
    source: billing
  - table: 'tenant_*.outbox'
    topic: "`+e.prefix+`.tenants.{aggregate_type}"
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	// --topic (from the harness) is the default of neither: each entry
	// sets its own.
	s := e.start("--config", config, "--publication", e.slot)
	e.waitStreaming()
	ctx := testenv.Context(t)
	const n = 50
	for i := range n {
		if _, err := e.pool.Exec(ctx, `INSERT INTO billing.outbox (kind, entity, name, body) VALUES ('invoice', $1, 'InvoicePaid', $2)`,
			fmt.Sprintf("inv-%d", i%7), fmt.Sprintf(`{"n": %d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	ts := newTenants(e)
	if err := ts.write(ctx, "tenant_a.outbox", n, 5); err != nil {
		t.Fatal(err)
	}
	tenantSource := ""
	for src := range ts.sources([]string{"tenant_a.outbox"}) {
		tenantSource = src
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(e.prefix+".billing.InvoicePaid", e.prefix+".tenants.payment"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation(), kgo.MetadataMinAge(250*time.Millisecond))
	byTopic := map[string]map[string]*kgo.Record{}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for len(byTopic[e.prefix+".billing.InvoicePaid"])+len(byTopic[e.prefix+".tenants.payment"]) < 2*n && rctx.Err() == nil {
		cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
			if byTopic[r.Topic] == nil {
				byTopic[r.Topic] = map[string]*kgo.Record{}
			}
			byTopic[r.Topic][header(r, "id")] = r
		})
	}
	billing, tenants := byTopic[e.prefix+".billing.InvoicePaid"], byTopic[e.prefix+".tenants.payment"]
	t.Logf("billing.outbox: %d of %d events, tenant_a.outbox: %d of %d", len(billing), n, len(tenants), n)
	if len(billing) != n || len(tenants) != n {
		t.Fatalf("billing.outbox: %d events, tenant_a.outbox: %d; want %d each", len(billing), len(tenants), n)
	}
	for id, r := range billing {
		if header(r, "source") != "billing" || header(r, "event_type") != "InvoicePaid" || header(r, "aggregate_type") != "invoice" ||
			!strings.HasPrefix(string(r.Key), "inv-") || !strings.HasPrefix(string(r.Value), `{"n": `) {
			t.Fatalf("billing event %s: key %q value %q headers %v", id, r.Key, r.Value, r.Headers)
		}
	}
	for id, r := range tenants {
		if header(r, "source") != tenantSource || header(r, "event_type") != "PaymentCreated" {
			t.Fatalf("tenant event %s: source %q (want %q), headers %v", id, header(r, "source"), tenantSource, r.Headers)
		}
	}
	s.stop()
}

// TestNewTenantJoinsUnderLoad: with sql/outbox-membership.sql installed and
// the pattern registered, a new tenant's schema and outbox, created while
// three others are written, joins the publication in its creating
// transaction: the rows written in that transaction and right after all
// arrive, with the new table's own source, and nothing warns of a gap.
func TestNewTenantJoinsUnderLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	applySQLFiles(t, e.url, "../sql/outbox-membership.sql", "../sql/outbox-membership.sql") // twice: safe
	ts := newTenants(e)
	tables := ts.create("nt_", 3)
	s := e.start(e.manyArgs("nt_*.outbox", "--slot-poll-interval", "1s")...)
	e.waitStreaming()
	testenv.Exec(t, e.url, `SELECT cdc_outbox.watch($1, 'nt_*', 'outbox')`, e.slot)
	ctx := testenv.Context(t)
	wait := ts.writeAll(ctx, tables, 300, 5)

	// The new tenant: schema, table and its first rows in one transaction.
	const newTable = "nt_new.outbox"
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA nt_new; `+tenantOutbox(newTable)); err != nil {
		t.Fatal(err)
	}
	var first []tenantEvent
	for i := range 10 {
		var id int64
		agg := newTable + "-a0"
		if err := tx.QueryRow(ctx, `INSERT INTO `+newTable+` (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'PaymentCreated', $2) RETURNING id`,
			agg, fmt.Sprintf(`{"seq": %d}`, i+1)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		first = append(first, tenantEvent{table: newTable, id: strconv.FormatInt(id, 10), aggregate: agg, seq: i + 1})
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ts.mu.Lock()
	ts.events = append(ts.events, first...)
	ts.seq[newTable+"-a0"] = 10
	ts.mu.Unlock()
	// And right after, beside the others' writers.
	if err := ts.write(ctx, newTable, 100, 5); err != nil {
		t.Fatal(err)
	}
	wait()
	v := ts.verify(e.topic("payment"), ts.sources(append(tables, newTable)), 3*time.Minute)
	t.Logf("verifier with a tenant created under load (10 rows in its creating transaction, 100 after): %s", v)
	if v.missing != 0 || v.orderViolations != 0 || v.unknown != 0 || v.tables != 4 {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	if !s.logged(`"msg":"streaming a new outbox table"`, `"table":"nt_new.outbox"`) {
		t.Error("the log does not show the new outbox table")
	}
	if s.logged(`not in the publication`, newTable) {
		t.Error("a gap was reported for the new table, which joined the publication in its creating transaction")
	}
	s.stop()
}

// TestNewTableGapDetected: a table that matches the pattern and is not in
// the publication (created where the membership trigger does not fire) is
// a warning naming it and cdc_outbox_outboxes_unpublished 1, until it is
// added.
func TestNewTableGapDetected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	ts.create("gap_", 1)
	// An UNLOGGED table matching the pattern at start: a warning, and the
	// others stream.
	testenv.Exec(t, e.url, `CREATE SCHEMA gap_u; `+strings.Replace(tenantOutbox("gap_u.outbox"), "CREATE TABLE", "CREATE UNLOGGED TABLE", 1))
	s := e.start(e.manyArgs("gap_*.outbox", "--slot-poll-interval", "1s")...)
	e.waitStreaming()
	addr := s.httpAddr()
	eventually(t, time.Minute, "a warning of the UNLOGGED table, counted as unpublished", func() bool {
		return s.logged(`"level":"WARN"`, `UNLOGGED`, `"table":"gap_u.outbox"`) && scrape(t, addr)["cdc_outbox_outboxes_unpublished"] == 1
	})
	// The start installed the membership trigger; a session with
	// session_replication_role = replica fires no event trigger, so its
	// table does not join.
	testenv.Exec(t, e.url, `SET session_replication_role = replica; CREATE SCHEMA gap_new; `+tenantOutbox("gap_new.outbox"))
	eventually(t, time.Minute, "a warning and the metric for the unpublished table", func() bool {
		return s.logged(`"level":"WARN"`, `not in the publication`, `"table":"gap_new.outbox"`) && scrape(t, addr)["cdc_outbox_outboxes_unpublished"] == 2
	})
	// Made LOGGED, the UNLOGGED one joins through the membership trigger.
	testenv.Exec(t, e.url, `ALTER PUBLICATION `+e.slot+` ADD TABLE gap_new.outbox; ALTER TABLE gap_u.outbox SET LOGGED`)
	eventually(t, time.Minute, "cdc_outbox_outboxes_unpublished 0 once the tables are added", func() bool {
		return scrape(t, addr)["cdc_outbox_outboxes_unpublished"] == 0
	})
	s.stop()
}

// TestMembershipTriggerFollowsRenames: the membership trigger adds a table
// renamed or moved into a registered pattern, leaves partitions to their
// table, and lets a member be altered again.
func TestMembershipTriggerFollowsRenames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	applySQLFiles(t, e.url, "../sql/outbox-membership.sql")
	testenv.Exec(t, e.url, `CREATE PUBLICATION mt_pub WITH (publish = 'insert'); SELECT cdc_outbox.watch('mt_pub', 'mt_*', 'outbox')`)
	published := func() []string {
		return e.ids(`SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'mt_pub' ORDER BY 1`)
	}
	testenv.Exec(t, e.url, `CREATE SCHEMA mt_a; CREATE SCHEMA other; CREATE TABLE mt_a.staging (id int); CREATE TABLE other.outbox (id int)`)
	if got := published(); len(got) != 0 {
		t.Fatalf("tables matching no pattern were published: %v", got)
	}
	testenv.Exec(t, e.url, `ALTER TABLE mt_a.staging RENAME TO outbox`)
	if got := published(); len(got) != 1 || got[0] != "mt_a.outbox" {
		t.Fatalf("after the rename: %v, want [mt_a.outbox]", got)
	}
	testenv.Exec(t, e.url, `CREATE SCHEMA mt_b; ALTER TABLE other.outbox SET SCHEMA mt_b`)
	testenv.Exec(t, e.url, `ALTER TABLE mt_a.outbox ADD COLUMN note text`) // a member altered again
	testenv.Exec(t, e.url, `CREATE SCHEMA mt_c; CREATE TABLE mt_c.outbox (id int) PARTITION BY RANGE (id);
		CREATE TABLE mt_c.outbox_1 PARTITION OF mt_c.outbox FOR VALUES FROM (0) TO (100)`)
	got := published()
	want := []string{"mt_a.outbox", "mt_b.outbox", "mt_c.outbox_1"} // a partition is listed for its table (publish_via_partition_root off)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("published %v, want %v", got, want)
	}
	direct := e.ids(`SELECT c.relname::text FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid
		WHERE p.pubname = 'mt_pub' AND c.relnamespace = 'mt_c'::regnamespace`)
	if len(direct) != 1 || direct[0] != "outbox" {
		t.Fatalf("members of schema mt_c: %v, want only its partitioned table", direct)
	}
}
