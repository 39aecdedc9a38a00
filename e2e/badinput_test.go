package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// badRow is an outbox row the streamer cannot publish, and the words its
// error must contain.
type badRow struct {
	name   string
	insert string // SQL inserting one bad row into outbox, RETURNING id::text
	cause  string
	// database holds CREATE DATABASE options when the row needs a database
	// unlike the default one.
	database string
}

// env is the row's test environment with the loose outbox table.
func (b badRow) env(t *testing.T) *env {
	e := newEnvAt(t, testenv.DatabaseWith(t, b.database))
	testenv.Exec(t, e.url, looseOutbox)
	return e
}

// sqlASCII makes a database that stores text bytes as they come, unchecked:
// the only way invalid UTF-8 reaches a text column.
const sqlASCII = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"

// The outbox table of these tests drops the NOT NULL constraints and takes
// a text payload, so rows can be as bad as a careless service makes them.
const looseOutbox = `DROP PUBLICATION cdc_outbox; DROP TABLE outbox;
CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_type text, aggregate_id text, event_type text,
	payload text, headers jsonb, created_at timestamptz DEFAULT now());
CREATE PUBLICATION cdc_outbox FOR TABLE outbox WITH (publish = 'insert');`

var badRows = []badRow{
	{"null payload", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'a1', 'E', NULL) RETURNING id::text`, `"payload"`, ""},
	{"payload not json", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'a1', 'E', 'not json {') RETURNING id::text`, `"payload"`, ""},
	{"headers not an object", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('payment', 'a1', 'E', '{}', '[1,2]') RETURNING id::text`, `"headers"`, ""},
	{"1 MB header value", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('payment', 'a1', 'E', '{}', jsonb_build_object('big', repeat('x', 1048576))) RETURNING id::text`, `"headers"`, ""},
	{"null aggregate id", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', NULL, 'E', '{}') RETURNING id::text`, `"aggregate_id"`, ""},
	{"empty aggregate id", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', '', 'E', '{}') RETURNING id::text`, `"aggregate_id"`, ""},
	{"invalid topic", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('no/such topic', 'a1', 'E', '{}') RETURNING id::text`, "topic", ""},
	{"larger than the broker accepts", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'a1', 'E', '"' || repeat('x', 1100000) || '"') RETURNING id::text`, "max-record-bytes", ""},
	{"reserved header keys", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('payment', 'a1', 'E', '{}', '{"id": "x", "event_type": "y"}') RETURNING id::text`, `has key "id", a header cdc-outbox sets itself`, ""},
	{"invalid UTF-8 key", `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', E'caf\xe9', 'E', '{}') RETURNING id::text`, `"aggregate_id": is not valid UTF-8`, sqlASCII},
}

// TestBadInputFail: under --on-bad-event=fail each bad row stops the
// stream with its event id, LSN and cause, and the slot stays before it.
func TestBadInputFail(t *testing.T) {
	t.Parallel()
	for _, bad := range badRows {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			e := bad.env(t)
			s := e.start()
			e.waitStreaming()
			var id string
			if err := e.pool.QueryRow(testenv.Context(t), bad.insert).Scan(&id); err != nil {
				t.Fatal(err)
			}
			after := e.currentLSN()
			if err := s.exited(60 * time.Second); err == nil {
				t.Fatal("the streamer exited 0 after a bad event under fail")
			}
			log := strings.ReplaceAll(s.logText(), `\"`, `"`) // JSON log lines escape quotes
			if !strings.Contains(log, "bad event "+id+" at LSN ") || !strings.Contains(log, bad.cause) {
				t.Fatalf("the error lacks event %s, its LSN or %q:\n%s", id, bad.cause, log)
			}
			e.waitSlotInactive()
			if confirmed, _ := e.slotLSNs(); confirmed >= after {
				t.Fatalf("the slot confirmed %d, past the bad event (WAL at %d after it)", confirmed, after)
			}
		})
	}
}

// TestBadInputDeadLetter: under --on-bad-event=dead-letter each bad row
// goes to the dead-letter topic with its id and an error header, and the
// events after it still arrive.
func TestBadInputDeadLetter(t *testing.T) {
	t.Parallel()
	for _, bad := range badRows {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			e := bad.env(t)
			dlq := e.prefix + ".dead-letter"
			s := e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)
			e.waitStreaming()
			ctx := testenv.Context(t)
			var id string
			if err := e.pool.QueryRow(ctx, bad.insert).Scan(&id); err != nil {
				t.Fatal(err)
			}
			wl := newWorkload(e)
			if err := wl.write(ctx, 0, 10, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			if v, _ := wl.verify([]string{"payment"}, time.Minute); v.missing != 0 {
				t.Fatalf("events after the bad one: %s", v)
			}
			cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.FetchMaxBytes(8<<20))
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			fetches := cl.PollRecords(pctx, 1)
			if err := fetches.Err(); err != nil {
				t.Fatalf("read the dead-letter topic: %v", err)
			}
			r := fetches.Records()[0]
			if header(r, "id") != id || !strings.Contains(header(r, "error"), bad.cause) || header(r, "lsn") == "" {
				t.Fatalf("dead-letter record: id %q error %q lsn %q", header(r, "id"), header(r, "error"), header(r, "lsn"))
			}
			s.stop()
		})
	}
}

// TestBadEventResumesAfterFix: a row too large for --max-record-bytes stops
// the stream; after raising the limit, a restart resumes at that row and
// delivers it and what followed.
func TestBadEventResumesAfterFix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := e.start("--max-record-bytes", "2048")
	e.waitStreaming()
	ctx := testenv.Context(t)
	var id string
	if err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('payment', 'big', 'E', jsonb_build_object('pad', repeat('x', 4000))) RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 10, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if err := s.exited(60 * time.Second); err == nil {
		t.Fatal("the streamer exited 0 after an oversize event")
	}
	wl.events = append(wl.events, written{id: id, aggregate: "big", seq: 1 << 30})
	s = e.start("--max-record-bytes", "1048576")
	v, _ := wl.verify([]string{"payment"}, time.Minute)
	t.Logf("after the fix: %s", v)
	if v.missing != 0 {
		t.Fatalf("after the fix: %s; missing %v", v, v.missingIDs)
	}
	s.stop()
}

// TestDeadLetterRecordSizedAfterEncoding: bad rows whose text JSON escapes
// heavily (control characters take six bytes) are set aside in
// dead-letter records that fit --max-record-bytes as encoded: a 300,000-byte
// payload of \x01<>& (675,000 bytes as JSON) whole, a 600,000-byte one
// (1,350,000 bytes as JSON) with the payload left out and its size noted.
// Each is logged as sent only once the broker has it.
func TestDeadLetterRecordSizedAfterEncoding(t *testing.T) {
	t.Parallel()
	e := badRow{}.env(t)
	dlq := e.prefix + ".dead-letter"
	s := e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)
	e.waitStreaming()
	ctx := testenv.Context(t)
	var ids [2]string
	for i, n := range []int{75_000, 150_000} {
		if err := e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ('payment', 'a1', 'E', repeat(E'\x01<>&', $1)) RETURNING id::text`, n).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	got := readN(t, dlq, 2, time.Minute)
	if len(got) != 2 || header(got[0], "id") != ids[0] || header(got[1], "id") != ids[1] {
		t.Fatalf("dead-letter topic: want events %v, got %v", ids, describe(got))
	}
	for _, r := range got {
		if size := len(r.Value) + len(r.Key); size > 1048576 {
			t.Fatalf("dead-letter record of event %s is %d bytes, over --max-record-bytes", header(r, "id"), size)
		}
	}
	if v := string(got[0].Value); !strings.Contains(v, strings.Repeat(`\u0001<>&`, 1000)) {
		t.Fatalf("the first dead-letter record lacks the payload as it was: %.300s", v)
	}
	if v := string(got[1].Value); !strings.Contains(v, `"payload":{"omitted_bytes":600000}`) {
		t.Fatalf("the second dead-letter record does not note the payload left out: %.300s", v)
	}
	eventually(t, 30*time.Second, "both to be logged as sent", func() bool {
		return strings.Count(s.logText(), "bad event sent to the dead-letter topic") == 2
	})
	s.stop()
}
