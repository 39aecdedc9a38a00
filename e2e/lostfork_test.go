package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// event is an event as the verifier of a forked history tells them apart:
// by id and content, because after such a failover one id may name two
// events, one of each history.
type event struct {
	id, aggregate string
	seq           int
}

// TestFailoverPastTheFork is a failover without synchronized_standby_slots
// (PostgreSQL 17, an asynchronous standby), the standby cut off from the
// primary while cdc-outbox goes on streaming: events committed on the old
// primary after the cut reach Kafka (in exactly-once delivery, with a
// Kafka checkpoint past the standby's WAL), then the primary is SIGKILLed
// and the standby promoted, whose timeline forks before them. cdc-outbox,
// reconnecting, stops without confirming anything on the new primary and
// says which WAL range was lost; started again, it streams the new
// primary from its slot, skipping (exactly-once) only what Kafka holds up
// to the fork. The writers go on throughout. Every event of the new
// primary's outbox is in Kafka (read_committed in exactly-once delivery);
// the events of the lost range stay in Kafka, and the new primary's
// bigserial gives some of their ids to new events, which the test counts
// and reports, as the log and cdc_outbox_lost_history_total do.
func TestFailoverPastTheFork(t *testing.T) {
	for _, delivery := range []string{"exactly-once", "at-least-once"} {
		t.Run(delivery, func(t *testing.T) { failoverPastTheFork(t, delivery) })
	}
}

func failoverPastTheFork(t *testing.T, delivery string) {
	began := time.Now()
	primary := testenv.Cluster(t, testenv.ClusterOptions{Major: 17})
	// The standby replicates through cut (closed to cut it off); cdc-outbox
	// reaches it through late, silent until it is promoted, so that the
	// stream meets the promoted server and not the standby before.
	cut := testenv.NewProxy(t, "127.0.0.1:0", hostPort(t, primary.URL))
	standby := primary.Standby(standbySlot, testenv.ClusterOptions{Upstream: "postgres://postgres@" + cut.Addr() + "/postgres?sslmode=disable"})
	late := testenv.NewProxy(t, "127.0.0.1:0", hostPort(t, standby.URL))
	e := newEnvAt(t, fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=primary", hostPort(t, primary.URL), hostPort(t, standby.URL)))
	e.runURL = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable", hostPort(t, primary.URL), late.Addr())
	flags := []string{"--delivery", delivery, "--slot-poll-interval", "1s"}
	readCommitted := delivery == "exactly-once"

	st := e.start(flags...)
	e.waitStreaming()
	wl := newWorkload(e)
	w := startWriters(wl)
	w.waitMore(300)
	testenv.WaitSlotSynced(t, standby.URL, e.slot, slotConfirmed(t, primary.URL, e.slot))

	// Cut the standby off; what the primary commits from now on is not on
	// the standby, and cdc-outbox streams it to Kafka.
	cut.Close()
	before := w.count()
	w.waitMore(400)
	wl.mu.Lock()
	pastCut := append([]written(nil), wl.events[before:]...)
	wl.mu.Unlock()
	eventually(t, 2*time.Minute, fmt.Sprintf("the %d events committed after the cut in Kafka", len(pastCut)), func() bool {
		in := map[event]bool{}
		for _, ev := range readEvents(t, e.topic("payment"), readCommitted) {
			in[ev] = true
		}
		for _, ev := range pastCut {
			if !in[event{ev.id, ev.aggregate, ev.seq}] {
				return false
			}
		}
		return true
	})

	late.Blackhole()
	primary.Control("kill")
	standby.Control("promote")
	late.Restore()
	promoted := time.Now()
	if err := st.exited(2 * time.Minute); err == nil {
		t.Fatal("the streamer exited 0 after a failover past the fork")
	}
	fork := forkOf(t, standby.URL, 1)
	log := st.logText()
	for _, want := range []string{`"msg":"lost history: events were handed to Kafka for WAL past the fork`, "the promoted standby never received", "Start cdc-outbox again"} {
		if !strings.Contains(log, want) {
			st.dump()
			t.Fatalf("the streamer's log does not say %q", want)
		}
	}
	// Nothing was confirmed on the new primary past the fork.
	confirmed, err := pglogrepl.ParseLSN(slotConfirmed(t, standby.URL, e.slot))
	if err != nil || confirmed > fork {
		t.Fatalf("the new primary's slot confirmed %s (%v), past the fork at %s", confirmed, err, fork)
	}
	t.Logf("fork at %s; slot on the new primary at %s; the streamer stopped %s after the promotion",
		fork, confirmed, time.Since(promoted).Round(time.Millisecond))

	st = e.start(flags...)
	e.waitStreaming()
	w.waitMore(600)
	w.stop()

	// The truth is the new primary's outbox.
	rows, _ := e.pool.Query(testenv.Context(t), `SELECT id::text, aggregate_id, coalesce((payload->>'seq')::int, 0) FROM outbox`)
	table, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (event, error) {
		var ev event
		err := row.Scan(&ev.id, &ev.aggregate, &ev.seq)
		return ev, err
	})
	if err != nil {
		t.Fatalf("read the new primary's outbox: %v", err)
	}
	want := map[event]bool{}
	for _, ev := range table {
		want[ev] = true
	}
	var missing, duplicates, lost, collisions int
	var got map[event]int
	eventually(t, 3*time.Minute, fmt.Sprintf("the %d events of the new primary in Kafka", len(table)), func() bool {
		got = map[event]int{}
		for _, ev := range readEvents(t, e.topic("payment"), readCommitted) {
			got[ev]++
		}
		missing = 0
		for ev := range want {
			if got[ev] == 0 {
				missing++
			}
		}
		return missing == 0
	})
	ids := map[string]bool{} // ids of the lost history's events in Kafka
	for ev, n := range got {
		if !want[ev] {
			lost++
			ids[ev.id] = true
		} else {
			duplicates += n - 1
		}
	}
	for ev := range want {
		if ids[ev.id] {
			collisions++
		}
	}
	t.Logf("%s failover past the fork: new primary's outbox %d events, missing %d, duplicates %d; lost history in Kafka %d events (of %d written after the cut), "+
		"new events sharing an id with one of them %d; skipped on restart %v; %s in all",
		delivery, len(table), missing, duplicates, lost, len(pastCut), collisions,
		metricValue(t, st, "cdc_outbox_transactions_skipped_total"), time.Since(began).Round(time.Second))
	if lost == 0 {
		t.Fatal("no event of the lost history in Kafka: the test did not fail over past the fork")
	}
	if delivery == "exactly-once" {
		log := st.logText()
		if !strings.Contains(log, `"msg":"lost history: the Kafka checkpoint lies past the fork`) {
			t.Fatalf("the restart does not report the lost history:\n%s", tailOf(log, 3000))
		}
		if n := metricValue(t, st, "cdc_outbox_lost_history_total"); n != 1 {
			t.Fatalf("cdc_outbox_lost_history_total = %v after the restart, want 1", n)
		}
	}
	st.stop()
}

// forkOf reads, on the promoted server at url, the LSN where timeline tli
// ended: its timeline history file.
func forkOf(t *testing.T, url string, tli int32) pglogrepl.LSN {
	t.Helper()
	var history string
	conn := testenv.Connect(t, url)
	if err := conn.QueryRow(testenv.Context(t), `SELECT pg_read_file('pg_wal/' || lpad(upper(to_hex($1 + 1)), 8, '0') || '.history')`, tli).Scan(&history); err != nil {
		t.Fatalf("read the timeline history: %v", err)
	}
	for _, line := range strings.Split(history, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == fmt.Sprint(tli) {
			lsn, err := pglogrepl.ParseLSN(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return lsn
		}
	}
	t.Fatalf("timeline %d not in the history:\n%s", tli, history)
	return 0
}

// readEvents reads every record of topic to its end (its last stable offset
// for a read_committed reader) and returns the events.
func readEvents(t *testing.T, topic string, readCommitted bool) []event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := kadm.NewClient(testenv.KafkaClient(t))
	list, level := adm.ListEndOffsets, kgo.ReadUncommitted()
	if readCommitted {
		list, level = adm.ListCommittedOffsets, kgo.ReadCommitted()
	}
	ends, err := list(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list the end offsets of %s: %v", topic, err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset - 1
		}
	})
	var out []event
	if len(left) == 0 {
		return out
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords())
	defer cl.Close()
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s to its end: still %v to go", topic, left)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset >= end {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			var body struct{ Seq int }
			_ = json.Unmarshal(r.Value, &body)
			out = append(out, event{header(r, "id"), string(r.Key), body.Seq})
		})
	}
	return out
}
