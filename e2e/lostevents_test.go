package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// lostListing is what cdc-outbox lost-events printed and said.
type lostListing struct {
	ids       []int // listed, in order
	unbounded int
	another   []int // listed as a row that is another event
	stderr    string
	err       error
}

// lostEvents runs cdc-outbox lost-events over the test's payment topic with
// the record format and extra flags.
func (e *env) lostEvents(format, checkpoints string, extra ...string) lostListing {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"lost-events", "--postgres-url", e.runURL, "--slot", e.slot, "--kafka-brokers", e.brokers[0],
		"--topics", e.topic("payment"), "--topic", e.prefix + ".{aggregate_type}", "--record-format", format, "--checkpoint-topic", checkpoints}, extra...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	l := lostListing{stderr: stderr.String(), err: err}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var ev struct {
			ID        string
			Why       string
			Unbounded bool
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			e.t.Fatalf("lost-events printed %q: %v", line, err)
		}
		id, _ := strconv.Atoi(ev.ID)
		l.ids = append(l.ids, id)
		if ev.Unbounded {
			l.unbounded++
		}
		if strings.Contains(ev.Why, "another event") {
			l.another = append(l.another, id)
		}
	}
	slices.Sort(l.ids)
	return l
}

func span(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestLostEventsFormatsAndCleanedTable: lost-events reads the records in
// the format the stream wrote (native headers; CloudEvents binary, ce_id
// and ce_source; structured, the JSON event's id and source) and bounds
// itself to what lies past the history the table and Kafka share. The
// stream publishes events 1 to 60; then the server is made to look as after
// a failover that lost 51 to 60 (their rows gone, 55's id given to another
// event), with a table cleaned as docs/records.md recommends (rows 1 to 30
// deleted), and the epochs record a stream writes when it finds a lost
// history. Listed: exactly 51 to 60, 55 as another event; not the cleaned
// 1 to 30, which lie before the shared 31 to 50. Before the fix the
// CloudEvents formats listed nothing ("lost 0") and native listed 1 to 30
// too. With every row deleted (rows deleted as they are written), nothing
// bounds the partition: all 60 are listed, marked unbounded, with a
// warning; --since leaves out the older ones. With another --record-format
// than the stream's, lost-events stops and names the right one.
func TestLostEventsFormatsAndCleanedTable(t *testing.T) {
	for _, format := range []string{"native", "cloudevents-binary", "cloudevents-structured"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			checkpoints := e.prefix + ".checkpoints"
			st := e.start("--record-format", format, "--checkpoint-topic", checkpoints)
			e.waitStreaming()
			insert := func(from, to int) {
				testenv.Exec(t, e.url, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					SELECT 'payment', 'pay-' || (g %% 3), 'PaymentCreated', jsonb_build_object('seq', g) FROM generate_series(%d, %d) g`, from, to))
			}
			insert(1, 50)
			var lostSince string
			if err := e.pool.QueryRow(testenv.Context(t), `SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`).Scan(&lostSince); err != nil {
				t.Fatal(err)
			}
			insert(51, 60)
			adm := kadm.NewClient(testenv.KafkaClient(t))
			eventually(t, time.Minute, "the 60 events in Kafka", func() bool {
				ends, err := adm.ListEndOffsets(testenv.Context(t), e.topic("payment"))
				n := int64(0)
				ends.Each(func(o kadm.ListedOffset) {
					if o.Err == nil {
						n += o.Offset
					}
				})
				return err == nil && n >= 60
			})
			st.stop()

			// The failover's damage, and the stream's record of it.
			testenv.Exec(t, e.url, `DELETE FROM outbox WHERE id > 50; DELETE FROM outbox WHERE id <= 30;
				INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (55, 'payment', 'pay-new', 'PaymentCreated', '{"seq": 1000}')`)
			w, err := sink.NewStreamRecords(sink.Config{Brokers: e.brokers}, checkpoints)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			epochs := checkpoint.Epochs{{N: 1, Timeline: 2, From: 0x3000000, LostEpoch: 0, LostTimeline: 1, LostFrom: 0x3000000, LostTo: 0x3100000, At: time.Now()}}
			if err := w.Write(testenv.Context(t), sink.EpochsKey(e.streamIdentity()), epochs.Encode()); err != nil {
				t.Fatal(err)
			}

			l := e.lostEvents(format, checkpoints)
			t.Logf("%s, table cleaned of 1-30: lost-events listed %v (another event: %v, unbounded %d)", format, l.ids, l.another, l.unbounded)
			if l.err != nil || !slices.Equal(l.ids, span(51, 60)) || !slices.Equal(l.another, []int{55}) || l.unbounded != 0 {
				t.Fatalf("lost-events (%v) listed %v, another event %v, unbounded %d; want 51 to 60, 55 another event, none unbounded\n%s",
					l.err, l.ids, l.another, l.unbounded, l.stderr)
			}

			// A table that keeps no row: nothing bounds the partition.
			testenv.Exec(t, e.url, `DELETE FROM outbox`)
			l = e.lostEvents(format, checkpoints)
			if l.err != nil || !slices.Equal(l.ids, span(1, 60)) || l.unbounded != 60 || !strings.Contains(l.stderr, "nothing bounds them") {
				t.Fatalf("lost-events on an empty table (%v): listed %v, %d unbounded; want 1 to 60, all unbounded, and a warning\n%s", l.err, l.ids, l.unbounded, l.stderr)
			}
			l = e.lostEvents(format, checkpoints, "--since", lostSince)
			t.Logf("%s, empty table, --since %s: listed %v", format, lostSince, l.ids)
			if l.err != nil || !slices.Equal(l.ids, span(51, 60)) {
				t.Fatalf("lost-events --since %s (%v): listed %v, want 51 to 60\n%s", lostSince, l.err, l.ids, l.stderr)
			}

			other := "native"
			if format == "native" {
				other = "cloudevents-binary"
			}
			l = e.lostEvents(other, checkpoints)
			if l.err == nil || len(l.ids) != 0 || !strings.Contains(l.stderr, "give --record-format "+format) {
				t.Fatalf("lost-events --record-format %s over %s records (%v): listed %v; want an error naming %s\n%s", other, format, l.err, l.ids, format, l.stderr)
			}
		})
	}
}
