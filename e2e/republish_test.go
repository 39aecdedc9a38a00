package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// republish runs cdc-outbox republish with the environment's connection,
// broker and topic template, then extra, and returns its output; the test
// fails unless it exits 0.
func (e *env) republish(extra ...string) string {
	e.t.Helper()
	out, err := e.republishErr(extra...)
	if err != nil {
		e.t.Fatalf("republish %v: %v\n%s", extra, err, out)
	}
	return out
}

func (e *env) republishErr(extra ...string) (string, error) {
	e.t.Helper()
	args := append([]string{"republish",
		"--postgres-url", e.runURL,
		"--kafka-brokers", e.brokers[0],
		"--topic", e.prefix + ".{aggregate_type}",
		"--batch-size", "100", // several pages even for a small table
	}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	return string(out), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestRepublishMatchesStream re-sends streamed events from the table and
// compares each record with the stream's, byte for byte: topic, key,
// value, headers in order (the source among them) and timestamp. Then it
// selects by id range and by created_at, and a bad row stops the run at
// the row, saying where to resume.
func TestRepublishMatchesStream(t *testing.T) {
	e := newEnv(t)
	st := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	if err := wl.write(ctx, 0, 250, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	// Values whose text output could differ between the WAL and a query
	// if the sessions differed: a created_at far from UTC, headers with
	// escapes, a payload with spacing jsonb normalises.
	testenv.Exec(t, e.url, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at)
		VALUES ('payment', 'odd', 'Odd', '{"seq": 1, "b": 1,   "a": [1, 2.50, "\u00e9"]}', '{"x": "line\nbreak", "n": 1.0}', '2026-03-29 01:30:00.123456-09:30')`)
	wl.expectTable()
	wl.check([]string{"payment"}, "streamed")
	st.stop()

	out := e.republish()
	if !strings.Contains(out, "rows_read=251 acknowledged=251 dead_lettered=0 timestamps_replaced=0") {
		t.Fatalf("the summary does not count 251 rows read and acknowledged:\n%s", out)
	}
	_, got := wl.verify([]string{"payment"}, time.Minute)
	for id, ds := range got {
		if len(ds) != 2 {
			t.Fatalf("event %s delivered %d times, want 2 (streamed, republished)", id, len(ds))
		}
		a, b := ds[0].rec, ds[1].rec
		if a.Topic != b.Topic || !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) || !a.Timestamp.Equal(b.Timestamp) ||
			!slices.EqualFunc(a.Headers, b.Headers, func(x, y kgo.RecordHeader) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) }) {
			t.Fatalf("event %s: republished record differs from the streamed one:\nstream:    %s %q %q %v %s\nrepublish: %s %q %q %v %s",
				id, a.Topic, a.Key, a.Value, a.Headers, a.Timestamp, b.Topic, b.Key, b.Value, b.Headers, b.Timestamp)
		}
	}

	ids := e.ids(`SELECT id::text FROM outbox ORDER BY outbox.id`)
	after, until := ids[99], ids[149]
	e.republish("--after-id", after, "--until-id", until)
	var since string
	if err := e.pool.QueryRow(ctx, `SELECT created_at::text FROM outbox WHERE id = $1`, ids[200]).Scan(&since); err != nil {
		t.Fatal(err)
	}
	e.republish("--since", strings.Replace(since, " ", "T", 1)+":00") // RFC 3339
	_, got = wl.verify([]string{"payment"}, time.Minute)
	for i, id := range ids {
		want := 2
		if i > 99 && i <= 149 { // by id
			want++
		}
		if i >= 200 && i < 250 { // by created_at: row 200 began a transaction; the odd row 250 is from March
			want++
		}
		if n := len(got[id]); n != want {
			t.Fatalf("event %s (row %d) delivered %d times, want %d", id, i, n, want)
		}
	}

	// A row the mapping refuses stops the run there, under fail.
	testenv.Exec(t, e.url, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('bad/type', 'x', 'T', '{}')`)
	bad := e.ids(`SELECT id::text FROM outbox WHERE aggregate_type = 'bad/type'`)[0]
	out, err := e.republishErr("--after-id", ids[len(ids)-2])
	if err == nil || !strings.Contains(out, "bad event "+bad) {
		t.Fatalf("republish over a bad row: %v, want exit 1 naming event %s:\n%s", err, bad, out)
	}
	// The row before it was sent and acknowledged, the bad one not.
	if !strings.Contains(out, `resume="--after-id `+ids[len(ids)-1]+`"`) {
		t.Fatalf("republish stopped by a bad row does not say where to resume:\n%s", out)
	}

	// Under dead-letter, the stream and republish set the row aside alike;
	// only the stream knows its LSN.
	dlt := e.prefix + ".dead"
	st = e.start("--on-bad-event", "dead-letter", "--dead-letter-topic", dlt)
	e.republish("--after-id", ids[len(ids)-1], "--on-bad-event", "dead-letter", "--dead-letter-topic", dlt)
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(dlt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation())
	var dead []*kgo.Record
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for len(dead) < 2 && rctx.Err() == nil {
		cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) { dead = append(dead, r) })
	}
	st.stop()
	if len(dead) != 2 {
		t.Fatalf("%d dead-letter records, want 2 (the stream's, republish's)", len(dead))
	}
	withoutLSN := func(r *kgo.Record) []kgo.RecordHeader {
		return slices.DeleteFunc(slices.Clone(r.Headers), func(h kgo.RecordHeader) bool { return h.Key == "lsn" })
	}
	a, b := dead[0], dead[1]
	if !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.Value, b.Value) ||
		!slices.EqualFunc(withoutLSN(a), withoutLSN(b), func(x, y kgo.RecordHeader) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) }) {
		t.Fatalf("dead-letter records differ:\n%q %s %v\n%q %s %v", a.Key, a.Value, a.Headers, b.Key, b.Value, b.Headers)
	}
}

// TestRepublishResumesTimestampWithoutZone: with created_at a timestamp
// without time zone, a run selected by time that stops at a bad row prints
// a resume hint with created_at as PostgreSQL prints it, without an
// offset; run again with that hint, republish accepts it and sends the
// rows from that row on.
func TestRepublishResumesTimestampWithoutZone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	testenv.Exec(t, e.url, `ALTER TABLE outbox ALTER COLUMN created_at TYPE timestamp USING created_at AT TIME ZONE 'UTC'`)
	testenv.Exec(t, e.url, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT CASE WHEN g = 60 THEN 'bad/type' ELSE 'payment' END, 'a', 'T', jsonb_build_object('seq', g),
			'2026-01-02 15:04:05.123456'::timestamp + g * interval '1.5 s' FROM generate_series(1, 100) g`)
	out, err := e.republishErr("--since", "2026-01-02 00:00:00")
	m := regexp.MustCompile(`resume="--since '([^']+)'"`).FindStringSubmatch(out)
	if err == nil || m == nil {
		t.Fatalf("republish over a bad row: %v, want exit 1 with a --since resume hint:\n%s", err, out)
	}
	hint := m[1]
	if strings.ContainsAny(hint[10:], "+-Z") {
		t.Fatalf("resume hint %q has an offset: created_at is a timestamp without time zone", hint)
	}
	var from int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE created_at >= $1::timestamp`, hint).Scan(&from); err != nil {
		t.Fatal(err)
	}
	out = e.republish("--since", hint, "--on-bad-event", "dead-letter", "--dead-letter-topic", testenv.Topic(t, "dead", 1))
	want := fmt.Sprintf("rows_read=%d acknowledged=%d dead_lettered=1", from, from)
	if !strings.Contains(out, want) {
		t.Fatalf("republish --since %q (the resume hint): want %s:\n%s", hint, want, out)
	}
	t.Logf("resumed with --since '%s': %s", hint, want)
}

// TestRepublishExplicitSourceTakesTheEpoch: after a lost history the
// stream publishes under its source with /epoch-N, whether the source is
// its default or given (--source, or source: in the configuration file
// run and republish share); republish with an explicit source does the
// same, so that none of its rows shares source and id with an event of the
// lost history, as republish with the default source already did. The
// epochs record is the one a stream writes when it finds a lost history.
// Before the fix, both explicit forms published under the bare source.
func TestRepublishExplicitSourceTakesTheEpoch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	testenv.Exec(t, e.url, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'payment', 'pay-' || g, 'PaymentCreated', jsonb_build_object('seq', g) FROM generate_series(1, 30) g`)
	checkpoints := e.prefix + ".checkpoints"
	w, err := sink.NewStreamRecords(sink.Config{Brokers: e.brokers}, checkpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	epochs := checkpoint.Epochs{{N: 2, Timeline: 2, From: 0x3000000, LostEpoch: 1, LostTimeline: 1, LostFrom: 0x2000000, LostTo: 0x2F00000, At: time.Now()}}
	if err := w.Write(ctx, sink.EpochsKey(e.streamIdentity()), epochs.Encode()); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "cdc-outbox.yaml")
	if err := os.WriteFile(file, []byte("source: billing-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		how  string
		args []string
		want string
	}{
		{"--source", []string{"--source", "billing"}, "billing/epoch-2"},
		{"source: in the configuration file", []string{"--config", file}, "billing-file/epoch-2"},
	} {
		e.prefix = testenv.Name("e2e") // a topic of each run's own
		out := e.republish(append(c.args, "--slot", e.slot, "--checkpoint-topic", checkpoints)...)
		if !strings.Contains(out, "the stream is in a later history epoch") {
			t.Errorf("republish with %s does not say it publishes under the epoch's source:\n%s", c.how, out)
		}
		sources := map[string]int{}
		for _, r := range readSourced(t, e.topic("payment"), false) {
			sources[r.source]++
		}
		t.Logf("republish with %s: records by source %v", c.how, sources)
		if len(sources) != 1 || sources[c.want] != 30 {
			t.Errorf("republish with %s: records by source %v, want all 30 under %q", c.how, sources, c.want)
		}
	}
}
