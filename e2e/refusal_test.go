package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// brokerRefusal is a row the mapping accepts and the broker refuses.
type brokerRefusal struct {
	name string
	// topicConfig is the configuration of the topic the good rows go to
	// (created by the test, aggregate type "agg").
	topicConfig map[string]string
	// culprit inserts the refused row between good rows of the same
	// aggregate, RETURNING id::text.
	culprit string
	// wholeTopic: the topic template is {aggregate_type} alone, and the
	// good rows name their topic in full.
	wholeTopic bool
	// prepare runs before the streamer starts.
	prepare func(t *testing.T, e *env)
	cause   string // in the error: the broker's code
	hint    string // in the error under fail
}

var brokerRefusals = []brokerRefusal{
	{
		name:        "too large for the topic",
		topicConfig: map[string]string{"max.message.bytes": "2048"},
		culprit:     `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('agg', 'a', 'E', jsonb_build_object('seq', 3, 'pad', repeat('x', 5000))) RETURNING id::text`,
		cause:       "MESSAGE_TOO_LARGE",
		hint:        "max.message.bytes",
	},
	{
		name:        "timestamp out of the topic's range",
		topicConfig: map[string]string{"message.timestamp.after.max.ms": "60000"},
		culprit:     `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ('agg', 'a', 'E', '{"seq": 3}', now() + interval '10 minutes') RETURNING id::text`,
		cause:       "INVALID_TIMESTAMP",
		hint:        "message.timestamp.after.max.ms",
	},
	{
		// A name the mapping accepts, but no client may write to: an
		// internal topic.
		name:       "invalid topic",
		culprit:    `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('__consumer_offsets', 'a', 'E', '{"seq": 3}') RETURNING id::text`,
		wholeTopic: true,
		cause:      "INVALID_TOPIC_EXCEPTION",
		hint:       "does not accept this topic",
	},
}

func (r brokerRefusal) args() []string {
	if r.wholeTopic {
		return []string{"--topic", "{aggregate_type}"}
	}
	return nil
}

func createTopic(t *testing.T, topic string, config map[string]string) {
	t.Helper()
	configs := map[string]*string{}
	for k, v := range config {
		configs[k] = &v
	}
	adm := kadm.NewClient(testenv.KafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, 1, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// writeAroundCulprit commits, for aggregate "a" of type "agg", events 1 and
// 2, the culprit, event 4 in one transaction (so they share a batch), then
// event 5 in the next. It returns the culprit's id and the WAL position
// after its transaction.
func writeAroundCulprit(t *testing.T, e *env, r brokerRefusal) (id string, after int64) {
	t.Helper()
	ctx := testenv.Context(t)
	typ := "agg"
	if r.wholeTopic {
		typ = e.topic("agg")
	}
	good := `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('` + typ + `', 'a', 'E', jsonb_build_object('seq', $1::int))`
	culprit := r.culprit
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, seq := range []int{1, 2} {
		if _, err := tx.Exec(ctx, good, seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.QueryRow(ctx, culprit).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, good, 4); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after = e.currentLSN()
	if _, err := e.pool.Exec(ctx, good, 5); err != nil {
		t.Fatal(err)
	}
	return id, after
}

// readN reads topic from the start until n records arrived or timeout.
func readN(t *testing.T, topic string, n int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(8<<20), kgo.MetadataMinAge(250*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	return got
}

// TestBrokerRefusalDeadLetter: under dead-letter, a row the broker refuses
// (it shared a batch with events before and after it of the same
// aggregate) goes to the dead-letter topic with the broker's error, and
// every other event arrives once, in order.
func TestBrokerRefusalDeadLetter(t *testing.T) {
	t.Parallel()
	for _, r := range brokerRefusals {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			createTopic(t, e.topic("agg"), r.topicConfig)
			if r.prepare != nil {
				r.prepare(t, e)
			}
			dlq := e.prefix + ".dead-letter"
			s := e.start(append(r.args(), "--on-bad-event", "dead-letter", "--dead-letter-topic", dlq)...)
			e.waitStreaming()
			id, _ := writeAroundCulprit(t, e, r)

			dead := readN(t, dlq, 1, time.Minute)
			if len(dead) != 1 || header(dead[0], "id") != id || !strings.Contains(header(dead[0], "error"), r.cause) {
				t.Fatalf("dead-letter topic: want event %s with %s in its error header, got %d records %v", id, r.cause, len(dead), describe(dead))
			}
			got := readN(t, e.topic("agg"), 4, time.Minute)
			var seqs []int
			for _, rec := range got {
				var body struct{ Seq int }
				_ = json.Unmarshal(rec.Value, &body)
				seqs = append(seqs, body.Seq)
			}
			if fmt.Sprint(seqs) != "[1 2 4 5]" {
				t.Fatalf("aggregate a in the topic: %v, want [1 2 4 5]", seqs)
			}
			eventually(t, 30*time.Second, "the log to say the event was set aside", func() bool {
				return strings.Contains(s.logText(), "bad event sent to the dead-letter topic")
			})
			s.stop()
		})
	}
}

// TestBrokerRefusalFail: under fail, the stream stops naming the refused
// event (not a neighbour of its batch), its LSN, the broker's code and a
// hint for that refusal, and the slot stays before its transaction.
func TestBrokerRefusalFail(t *testing.T) {
	t.Parallel()
	for _, r := range brokerRefusals {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			createTopic(t, e.topic("agg"), r.topicConfig)
			if r.prepare != nil {
				r.prepare(t, e)
			}
			s := e.start(r.args()...)
			e.waitStreaming()
			id, after := writeAroundCulprit(t, e, r)
			if err := s.exited(time.Minute); err == nil {
				t.Fatal("the streamer exited 0 after a broker refusal under fail")
			}
			log := s.logText()
			for _, want := range []string{"bad event " + id + " at LSN ", r.cause, r.hint} {
				if !strings.Contains(log, want) {
					t.Fatalf("the error lacks %q:\n%s", want, log)
				}
			}
			if confirmed, _ := e.slotLSNs(); confirmed >= after {
				t.Fatalf("the slot confirmed %d, past the refused event's transaction (WAL at %d after it)", confirmed, after)
			}
		})
	}
}

func describe(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprintf("id=%s error=%q", header(r, "id"), header(r, "error")))
	}
	return out
}

// TestCreatedAtFarAheadGetsProduceTime: a created_at two days ahead (a
// wrong clock, or a timestamp column written in local time far east of
// UTC) would be refused by the broker (message.timestamp.after.max.ms, one
// hour by default). Under either policy the event is published with the
// produce time instead, with a warning naming it and a counter; it is not
// a bad event.
func TestCreatedAtFarAheadGetsProduceTime(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"fail", "dead-letter"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			dlq := e.prefix + ".dead-letter"
			s := e.start("--on-bad-event", policy, "--dead-letter-topic", dlq)
			e.waitStreaming()
			addr := s.httpAddr()
			var id string
			if err := e.pool.QueryRow(testenv.Context(t), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
				VALUES ('payment', 'a', 'E', '{}', now() + interval '2 days') RETURNING id::text`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			got := readN(t, e.topic("payment"), 1, time.Minute)
			if len(got) != 1 || header(got[0], "id") != id {
				t.Fatalf("want event %s in the topic, got %v", id, describe(got))
			}
			if ts := got[0].Timestamp; ts.Before(before.Add(-time.Minute)) || ts.After(time.Now().Add(time.Minute)) {
				t.Fatalf("record timestamp %s, want the produce time (about %s)", ts, before)
			}
			eventually(t, 30*time.Second, "the replaced timestamp to be counted", func() bool {
				return scrape(t, addr)["cdc_outbox_timestamps_replaced_total"] == 1
			})
			if log := s.logText(); !strings.Contains(log, "created_at is too far ahead") || !strings.Contains(log, `"event_id":"`+id+`"`) {
				t.Fatalf("no warning naming event %s:\n%s", id, log)
			}
			if m := scrape(t, addr); m[`cdc_outbox_bad_events_total{action="failed",kind="row"}`]+m[`cdc_outbox_bad_events_total{action="dead_lettered",kind="row"}`] != 0 {
				t.Fatal("counted as a bad event")
			}
			s.stop()
		})
	}
}
