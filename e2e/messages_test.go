package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/cdc-outbox/cdc-outbox/outbox"
)

// The outbox without a table: events as transactional logical decoding
// messages (docs/messages.md), in the plain-SQL form a service uses.

// emitEvent is the workload's statement for a message: the same event as
// insertEvent, its id from the outbox table's sequence so that ids never
// collide with rows', the envelope built by json_build_object.
const emitEvent = `SELECT n.id FROM (SELECT nextval('outbox_id_seq') AS id) n,
	LATERAL pg_logical_emit_message(true, 'cdc_outbox', json_build_object(
		'v', 1, 'id', n.id, 'aggregate_type', $1::text, 'aggregate_id', $2::text, 'event_type', 'PaymentCreated',
		'payload', $3::jsonb, 'headers', $4::jsonb, 'created_at', now())::text) m`

// mixedEvent writes an even id as an outbox row and an odd one as a
// message, so a transaction of several events interleaves both, and one
// aggregate's events come both ways.
const mixedEvent = `WITH n AS (SELECT nextval('outbox_id_seq') AS id),
	r AS (INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT id, $1::text, $2::text, 'PaymentCreated', $3::jsonb, $4::jsonb FROM n WHERE id % 2 = 0 RETURNING id),
	m AS (SELECT pg_logical_emit_message(true, 'cdc_outbox', json_build_object(
		'v', 1, 'id', id, 'aggregate_type', $1::text, 'aggregate_id', $2::text, 'event_type', 'PaymentCreated',
		'payload', $3::jsonb, 'headers', $4::jsonb, 'created_at', now())::text) FROM n WHERE id % 2 = 1)
	SELECT id FROM n WHERE (SELECT count(*) FROM r) + (SELECT count(*) FROM m) = 1`

// TestMessagesInterleavedWithRows: messages only, then rows and messages
// interleaved in transactions of 1 to 20 events from concurrent writers.
// Every event arrives, per-aggregate order holds across both kinds (the
// commit order), messages of other prefixes are passed over and counted,
// and the events metric tells the kinds apart.
func TestMessagesInterleavedWithRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.start()
	e.waitStreaming()

	wl := newWorkload(e)
	wl.insert = emitEvent
	wl.writeConcurrently(t, ctx, 300, 1, 10)()
	wl.check([]string{"payment"}, "messages only")

	// Other applications' messages, transactional and not, pass by.
	for _, q := range []string{
		`SELECT pg_logical_emit_message(true, 'heartbeat', 'x')`,
		`SELECT pg_logical_emit_message(false, 'heartbeat', 'x')`,
		`SELECT pg_logical_emit_message(true, 'cdc_outbox_other', '{"v":1}')`,
	} {
		testenv.Exec(t, e.url, q)
	}
	wl.insert = mixedEvent
	wl.writeConcurrently(t, ctx, 500, 1, 5, 20)()
	wl.check([]string{"payment"}, "rows and messages interleaved")

	eventually(t, time.Minute, "every record acknowledged", func() bool { return metricValue(t, s, "cdc_outbox_inflight_events") == 0 })
	m := scrape(t, s.httpAddr())
	topic := e.topic("payment")
	rows, msgs := m[`cdc_outbox_events_total{kind="row",topic="`+topic+`"}`], m[`cdc_outbox_events_total{kind="message",topic="`+topic+`"}`]
	t.Logf("events: %v rows, %v messages; other prefixes passed over: %v", rows, msgs, m[`cdc_outbox_events_skipped_total{reason="other_prefix"}`])
	if rows+msgs != 2100 || rows < 700 || msgs < 1300 || m[`cdc_outbox_events_skipped_total{reason="other_prefix"}`] != 3 {
		t.Fatalf("events_total rows %v + messages %v, want 2100, about 750 of them rows; other_prefix %v, want 3",
			rows, msgs, m[`cdc_outbox_events_skipped_total{reason="other_prefix"}`])
	}
	s.stop()
}

// TestMessageIsTheRowsRecord: an outbox row and a message of the same
// values (the id aside) become the same record: topic, key, value byte for
// byte, headers in order, timestamp. So does an event of outbox.Emit, but
// for its timestamp, the transaction's start.
func TestMessageIsTheRowsRecord(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start("--source", "billing-db")
	e.waitStreaming()
	const payload = `{"amount": 10.50, "note": "caf\u00e9 <&>", "items": [1, 2]}`
	const headers = `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "t1"}`
	const createdAt = "2026-12-01 10:00:00.123456+00"
	var rowID, msgID, emitID string
	var txStart time.Time
	ctx := testenv.Context(t)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
			VALUES ('payment', 'p-1', 'PaymentCaptured', $1, $2, $3) RETURNING id::text`, payload, headers, createdAt).Scan(&rowID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT n.id::text FROM (SELECT nextval('outbox_id_seq') AS id) n,
			LATERAL pg_logical_emit_message(true, 'cdc_outbox', json_build_object('v', 1, 'id', n.id, 'aggregate_type', 'payment',
				'aggregate_id', 'p-1', 'event_type', 'PaymentCaptured', 'payload', $1::jsonb, 'headers', $2::jsonb,
				'created_at', $3::timestamptz)::text) m`, payload, headers, createdAt).Scan(&msgID); err != nil {
			return err
		}
		// Emit keeps the payload as given; the row's jsonb column keeps
		// PostgreSQL's form of it, which Emit is given here.
		var asJSONB string
		if err := tx.QueryRow(ctx, `SELECT $1::jsonb::text, now()`, payload).Scan(&asJSONB, &txStart); err != nil {
			return err
		}
		var err error
		emitID, err = outbox.Emit(ctx, tx, outbox.Event{AggregateType: "payment", AggregateID: "p-1", EventType: "PaymentCaptured",
			Payload: json.RawMessage(asJSONB), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "t1"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, e.topic("payment"), 3)
	row := recs[0]
	for i, want := range []string{rowID, msgID, emitID} {
		if got := header(recs[i], "id"); got != want {
			t.Fatalf("record %d has id %q, want %s", i, got, want)
		}
	}
	for _, msg := range recs[1:] {
		if row.Topic != msg.Topic || string(row.Key) != string(msg.Key) || string(row.Value) != string(msg.Value) ||
			!slices.EqualFunc(row.Headers, msg.Headers, func(a, b kgo.RecordHeader) bool {
				return a.Key == b.Key && (a.Key == "id" || string(a.Value) == string(b.Value))
			}) {
			t.Fatalf("records differ:\nrow     %s %s %s %v\nmessage %s %s %s %v", row.Topic, row.Key, row.Value, row.Headers, msg.Topic, msg.Key, msg.Value, msg.Headers)
		}
	}
	if !row.Timestamp.Equal(recs[1].Timestamp) || !recs[2].Timestamp.Equal(txStart.Truncate(time.Millisecond)) {
		t.Fatalf("timestamps: row %v, message %v, Emit's %v (transaction start %v)", row.Timestamp, recs[1].Timestamp, recs[2].Timestamp, txStart)
	}
	s.stop()
}

// readRecords reads the first n records of topic.
func readRecords(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(testenv.Context(t), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		f := cl.PollRecords(ctx, n-len(recs))
		if err := f.Err(); err != nil {
			t.Fatalf("read %s: %v (have %d of %d records)", topic, err, len(recs), n)
		}
		recs = append(recs, f.Records()...)
	}
	return recs
}

// emitSQL is the plain-SQL form of message id of aggregate agg, number seq.
func emitSQL(id, agg string, seq int) string {
	return fmt.Sprintf(`SELECT pg_logical_emit_message(true, 'cdc_outbox', json_build_object('v', 1, 'id', '%s', 'aggregate_type', 'payment',
		'aggregate_id', '%s', 'event_type', 'PaymentCreated', 'payload', json_build_object('seq', %d))::text)`, id, agg, seq)
}

// TestMessagesRolledBackPublishNothing: a rolled-back transaction, a
// subtransaction rolled back to its savepoint and a prepared transaction
// rolled back publish nothing; what was emitted around the savepoint and a
// prepared transaction committed are published, once.
func TestMessagesRolledBackPublishNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var prepared int
	if err := e.pool.QueryRow(testenv.Context(t), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&prepared); err != nil || prepared == 0 {
		t.Fatalf("max_prepared_transactions is %d (%v) on the test server: two-phase commit needs it above 0; "+
			"scripts/postgres.sh sets it when it makes a cluster, so make this one again (scripts/postgres.sh destroy)", prepared, err)
	}
	s := e.start()
	e.waitStreaming()
	gid := testenv.Name("gid")
	// A prepared transaction left behind would hold every slot creation
	// on the server back.
	t.Cleanup(func() {
		testenv.Exec(t, e.url, `DO $$DECLARE g text; BEGIN
			FOR g IN SELECT gid FROM pg_prepared_xacts WHERE gid LIKE '`+gid+`-%' LOOP EXECUTE format('ROLLBACK PREPARED %L', g); END LOOP; END$$`)
	})
	for _, script := range []string{
		"BEGIN; " + emitSQL("rolled-back", "a", 1) + "; ROLLBACK",
		"BEGIN; " + emitSQL("before-savepoint", "a", 1) + "; SAVEPOINT s; " + emitSQL("in-savepoint", "a", 2) +
			"; ROLLBACK TO SAVEPOINT s; " + emitSQL("after-savepoint", "a", 2) + "; COMMIT",
		"BEGIN; " + emitSQL("prepared-rolled-back", "a", 3) + "; PREPARE TRANSACTION '" + gid + "-1'",
		"ROLLBACK PREPARED '" + gid + "-1'",
		"BEGIN; " + emitSQL("prepared-committed", "a", 3) + "; PREPARE TRANSACTION '" + gid + "-2'",
		"COMMIT PREPARED '" + gid + "-2'",
		emitSQL("last", "a", 4),
	} {
		testenv.Exec(t, e.url, script)
	}
	want := []string{"before-savepoint", "after-savepoint", "prepared-committed", "last"}
	recs := readRecords(t, e.topic("payment"), len(want))
	var got []string
	for _, r := range recs {
		got = append(got, header(r, "id"))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	// Nothing else: the topic has one partition and the events counter
	// counts every record acknowledged.
	eventually(t, time.Minute, "every record acknowledged", func() bool { return metricValue(t, s, "cdc_outbox_inflight_events") == 0 })
	if n := metricValue(t, s, `cdc_outbox_events_total{kind="message",topic="`+e.topic("payment")+`"}`); n != float64(len(want)) {
		t.Fatalf("%v message events acknowledged, want %d", n, len(want))
	}
	s.stop()
}

// TestMessageBadEvents: a non-transactional outbox message and one whose
// content is no envelope are bad events under both policies: under fail
// the stream stops naming the event, its LSN and the fix, and confirms
// nothing past it; under dead-letter the content goes to the dead-letter
// topic as it came and the events after it arrive. Never is either
// published as an event.
func TestMessageBadEvents(t *testing.T) {
	t.Parallel()
	for _, bad := range []struct {
		name, sql, id, cause string
	}{
		{"non-transactional", `SELECT pg_logical_emit_message(false, 'cdc_outbox', json_build_object('v', 1, 'id', 'lone', 'aggregate_type', 'payment',
			'aggregate_id', 'a', 'event_type', 'E', 'payload', '{}'::json)::text)`, "lone", "pg_logical_emit_message(true, ...)"},
		{"malformed", `SELECT pg_logical_emit_message(true, 'cdc_outbox', '{"v": 1, "id": "typo", "aggregate_type": "payment", "aggregateid": "a", "event_type": "E", "payload": {}}')`,
			"typo", `message member "aggregateid" is not a member of envelope version 1`},
	} {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := testenv.Context(t)
			s := e.start()
			e.waitStreaming()
			testenv.Exec(t, e.url, bad.sql)
			// The insert position: a non-transactional message is not
			// flushed, so the write position may still be before it.
			var after int64
			if err := e.pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if err := s.exited(60 * time.Second); err == nil {
				t.Fatal("the streamer exited 0 after a bad event under fail")
			}
			log := strings.ReplaceAll(s.logText(), `\"`, `"`)
			if !strings.Contains(log, "bad event "+bad.id+" at LSN ") || !strings.Contains(log, bad.cause) || !strings.Contains(log, "--on-bad-event=dead-letter") {
				t.Fatalf("the error lacks event %s, its LSN, %q or the way past it:\n%s", bad.id, bad.cause, log)
			}
			e.waitSlotInactive()
			if confirmed, _ := e.slotLSNs(); confirmed >= after {
				t.Fatalf("the slot confirmed %d, past the bad event (WAL at %d after it)", confirmed, after)
			}

			dlq := e.prefix + ".dead-letter"
			s = e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)
			wl := newWorkload(e)
			wl.insert = emitEvent
			if err := wl.write(ctx, 0, 20, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			v, got := wl.verify([]string{"payment"}, time.Minute)
			if v.missing != 0 || len(got[bad.id]) != 0 {
				s.dump()
				t.Fatalf("events after the bad one: %s; the bad one published %d times", v, len(got[bad.id]))
			}
			r := readRecords(t, dlq, 1)[0]
			if header(r, "id") != bad.id || !strings.Contains(header(r, "error"), bad.cause) || header(r, "lsn") == "" ||
				header(r, "message_prefix") != "cdc_outbox" || !strings.Contains(string(r.Value), `"id"`) {
				t.Fatalf("dead-letter record: id %q error %q lsn %q prefix %q value %s",
					header(r, "id"), header(r, "error"), header(r, "lsn"), header(r, "message_prefix"), r.Value)
			}
			s.stop()
		})
	}
}

// TestMessagesSIGKILLCycles: 10 SIGKILLs of the streamer at random moments
// while 3 writers commit 30,000 events, rows and messages interleaved, in
// transactions of 1 to 20. Nothing is missing, per-aggregate order holds,
// and the duplicates stay within what can be in flight at each kill.
func TestMessagesSIGKILLCycles(t *testing.T) {
	t.Parallel()
	const cycles, inflight = 10, 2000
	e := newEnv(t)
	wl := newWorkload(e)
	wl.insert = mixedEvent
	ctx := testenv.Context(t)
	first := e.start()
	e.waitStreaming()
	first.kill()
	done := wl.writeConcurrently(t, ctx, 10000, 1, 5, 20)
	rng := rand.New(rand.NewPCG(27, 1))
	for cycle := 1; cycle <= cycles; cycle++ {
		s := e.start("--max-inflight-events", fmt.Sprint(inflight))
		eventually(t, 5*time.Minute, "the writers to progress", func() bool { return wl.written() >= cycle*30000/(cycles+1) })
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the kill's moment, not a wait for a condition
		s.kill()
	}
	done()
	s := e.start()
	v, _ := wl.verify([]string{"payment"}, 5*time.Minute)
	t.Logf("verifier after %d SIGKILL cycles, rows and messages: %s", cycles, v)
	if v.expected != 30000 || v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
	if v.duplicates > cycles*inflight {
		t.Fatalf("%d duplicates: more than %d kills × %d in flight", v.duplicates, cycles, inflight)
	}
	s.stop()
}

// TestExactlyOnceMessages: in exactly-once delivery, rows and messages
// interleaved reach a read_committed consumer each exactly once, across a
// SIGKILL; a non-transactional message under dead-letter is set aside in
// a Kafka transaction of its own, once.
func TestExactlyOnceMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	wl.insert = mixedEvent
	dlq := e.prefix + ".dead-letter"
	flags := []string{"--on-bad-event", "dead-letter", "--dead-letter-topic", dlq}
	s := e.eo(flags...)
	e.waitStreaming()
	wl.writeConcurrently(t, ctx, 1000, 1, 10)()
	testenv.Exec(t, e.url, `SELECT pg_logical_emit_message(false, 'cdc_outbox', '{"v":1,"id":"lone"}')`)
	wl.checkExactlyOnce([]string{"payment"}, "rows and messages")
	s.kill()
	s = e.eo(flags...)
	wl.writeConcurrently(t, ctx, 500, 5)()
	wl.checkExactlyOnce([]string{"payment"}, "after a SIGKILL")
	if n := committedRecords(t, dlq)["lone"]; n != 1 {
		t.Fatalf("the non-transactional message's dead-letter record is in Kafka %d times, want once", n)
	}
	s.stop()
}

// TestRepublishSaysMessagesHaveNoRows: events written only as messages
// leave the table empty, and republish says it has nothing to send them
// from.
func TestRepublishSaysMessagesHaveNoRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	wl.insert = emitEvent
	if err := wl.write(testenv.Context(t), 0, 10, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "messages")
	s.stop()
	out := e.republish()
	if !strings.Contains(out, "republished nothing") || !strings.Contains(out, "have no row: republish cannot send them again") {
		t.Fatalf("republish of a message outbox:\n%s", out)
	}
}

// TestOtherPrefixesDoNotHoldTheSlot: with nothing but other applications'
// messages in the WAL (a heartbeat, non-transactional, and a transactional
// one), the slot's confirmed position moves past them: passed over, they
// hold nothing back.
func TestOtherPrefixesDoNotHoldTheSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start()
	e.waitStreaming()
	for range 3 {
		testenv.Exec(t, e.url, `SELECT pg_logical_emit_message(false, 'heartbeat', 'beat')`)
		testenv.Exec(t, e.url, `SELECT pg_logical_emit_message(true, 'other_app', 'x')`)
	}
	var after int64
	if err := e.pool.QueryRow(testenv.Context(t), `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the slot to confirm past the other prefixes' messages", func() bool {
		confirmed, _ := e.slotLSNs()
		return confirmed >= after
	})
	if n := metricValue(t, s, `cdc_outbox_events_skipped_total{reason="other_prefix"}`); n != 6 {
		t.Fatalf("%v messages passed over, want 6", n)
	}
	s.stop()
}
