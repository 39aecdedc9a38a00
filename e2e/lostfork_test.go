package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
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
		t.Run(delivery, func(t *testing.T) { failoverPastTheFork(t, delivery, false) })
	}
	// At-least-once delivery keeps no checkpoint: what tells a start on the
	// promoted standby that Kafka holds events past the fork, when no
	// cdc-outbox ran across the failover, is the published record.
	t.Run("at-least-once/down-across-the-failover", func(t *testing.T) { failoverPastTheFork(t, "at-least-once", true) })
}

// forkable is a PostgreSQL 17 primary with an asynchronous standby that
// can be cut off from it, and an env of the two.
type forkable struct {
	primary, standby *testenv.PostgresCluster
	// The standby replicates through cut (closed to cut it off);
	// cdc-outbox reaches it through late, silent until it is promoted, so
	// that the stream meets the promoted server and not the standby
	// before.
	cut, late *testenv.Proxy
	e         *env
}

func cutOffStandby(t *testing.T) forkable {
	t.Helper()
	primary := testenv.Cluster(t, testenv.ClusterOptions{Major: 17})
	cut := testenv.NewProxy(t, "127.0.0.1:0", hostPort(t, primary.URL))
	standby := primary.Standby(standbySlot, testenv.ClusterOptions{Upstream: "postgres://postgres@" + cut.Addr() + "/postgres?sslmode=disable"})
	late := testenv.NewProxy(t, "127.0.0.1:0", hostPort(t, standby.URL))
	e := newEnvAt(t, fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=primary", hostPort(t, primary.URL), hostPort(t, standby.URL)))
	e.runURL = fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable", hostPort(t, primary.URL), late.Addr())
	return forkable{primary: primary, standby: standby, cut: cut, late: late, e: e}
}

func failoverPastTheFork(t *testing.T, delivery string, down bool) {
	began := time.Now()
	f := cutOffStandby(t)
	primary, standby, cut, late, e := f.primary, f.standby, f.cut, f.late, f.e
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
			if !in[event(ev)] {
				return false
			}
		}
		return true
	})

	if down {
		// The streamer dies once it has recorded a position past every
		// event after the cut, and is not running when the primary fails.
		var at string
		if err := testenv.Connect(t, primary.URL).QueryRow(testenv.Context(t), `SELECT pg_current_wal_lsn()::text`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		past, err := pglogrepl.ParseLSN(at)
		if err != nil {
			t.Fatal(err)
		}
		stream := e.streamIdentity()
		eventually(t, time.Minute, "the published record past "+at, func() bool {
			cp, err := sink.ReadCheckpoint(testenv.Context(t), sink.Config{Brokers: e.brokers}, "cdc_outbox.checkpoints", stream, stream)
			if err != nil {
				return false
			}
			p, err := checkpoint.DecodePublished(cp.Published)
			return err == nil && p.End >= past
		})
		st.kill()
	}
	late.Blackhole()
	primary.Control("kill")
	standby.Control("promote")
	late.Restore()
	promoted := time.Now()
	log := ""
	if !down {
		if err := st.exited(2 * time.Minute); err == nil {
			t.Fatal("the streamer exited 0 after a failover past the fork")
		}
		log = st.logText()
		for _, want := range []string{`"msg":"lost history: cdc-outbox read the old primary's WAL past the fork`, "the promoted standby never received", "Start cdc-outbox again"} {
			if !strings.Contains(log, want) {
				st.dump()
				t.Fatalf("the streamer's log does not say %q", want)
			}
		}
	}
	fork := forkOf(t, standby.URL, 1)
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

	c := countHistories(t, e, readCommitted)
	t.Logf("%s failover past the fork: %s (of %d events written after the cut); skipped on restart %v; %s in all",
		delivery, c, len(pastCut), metricValue(t, st, "cdc_outbox_transactions_skipped_total"), time.Since(began).Round(time.Second))
	if c.lost == 0 {
		t.Fatal("no event of the lost history in Kafka: the test did not fail over past the fork")
	}
	// The new primary's bigserial hands the lost events' ids out again;
	// their events carry the source of the epoch begun at the fork.
	if c.reused == 0 {
		t.Fatal("no new event reuses an id of the lost history: the test does not show what the history epoch prevents")
	}
	if c.collisions != 0 {
		t.Fatalf("%d new events share source and id with an event of the lost history: a consumer deduping by source and id drops them", c.collisions)
	}
	if c.resourced != 0 {
		t.Fatalf("%d events were repeated under another source: the transactions before the fork are the first history's", c.resourced)
	}
	if down {
		// The restart found it, from the published record.
		log = st.logText()
		if !strings.Contains(log, `"msg":"lost history: the stream had published transactions up to a position on WAL this server does not have`) {
			t.Fatalf("the start on the promoted standby does not report the lost history:\n%s", tailOf(log, 3000))
		}
	}
	if !strings.Contains(log, `"msg":"lost history recorded`) {
		t.Fatalf("the streamer that met the fork did not record the lost history:\n%s", tailOf(log, 3000))
	}
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 1 {
		t.Fatalf("cdc_outbox_history_epoch = %v after the restart, want 1", n)
	}
	checkLostEvents(t, e, c)
	checkLostEventsCleaned(t, e, c)
	if delivery == "at-least-once" && !down {
		// republish, with the default source, sends every row under the
		// newest epoch's: none shares source and id with a lost event.
		out := e.republish("--slot", e.slot)
		if !strings.Contains(out, "the stream is in a later history epoch") {
			t.Fatalf("republish does not say it publishes under the epoch's source:\n%s", out)
		}
		after := countHistories(t, e, readCommitted)
		t.Logf("after republishing every row: %s", after)
		if after.collisions != 0 {
			t.Fatalf("after republish, %d events share source and id with an event of the lost history", after.collisions)
		}
	}
	// status shows the epoch, and warns of the lost history, in either
	// delivery (the epochs record is in the checkpoint topic in both).
	out, err := exec.Command(binary, "status", "--json", "--postgres-url", e.runURL, "--slot", e.slot,
		"--delivery", delivery, "--kafka-brokers", e.brokers[0]).Output()
	var status struct {
		HistoryEpoch int      `json:"history_epoch"`
		Epochs       []string `json:"history_epochs"`
		Warnings     []string
	}
	if jerr := json.Unmarshal(out, &status); jerr != nil {
		t.Fatalf("status --json: %v (%v): %s", jerr, err, out)
	}
	if status.HistoryEpoch != 1 || len(status.Epochs) != 1 || !slices.ContainsFunc(status.Warnings, func(w string) bool { return strings.Contains(w, "cdc-outbox lost-events") }) {
		t.Fatalf("%s: status does not show the history epoch and warn of the lost history: %s", delivery, out)
	}
	if delivery == "exactly-once" {
		log := st.logText()
		if !strings.Contains(log, `"msg":"lost history: the Kafka checkpoint lies on WAL this server never had`) {
			t.Fatalf("the restart does not report the lost history:\n%s", tailOf(log, 3000))
		}
		if n := metricValue(t, st, "cdc_outbox_lost_history_total"); n != 1 {
			t.Fatalf("cdc_outbox_lost_history_total = %v after the restart, want 1", n)
		}
	}
	st.stop()
}

// histories is what Kafka holds of a server's outbox after its history
// forked from the one streamed before: the server's events (expected),
// those missing in Kafka and repeated there, the lost history's events in
// Kafka (lost), the server's events whose id one of those has too (reused)
// and those of them whose source is the same too (collisions: a consumer
// deduping by source and id, as the consume library does, drops them), and
// the server's events repeated under another source (resourced: a
// consumer deduping by source and id processes them again).
type histories struct {
	expected, missing, duplicates, lost, reused, collisions, resourced int
	// sources counts the server's events by the source they carry.
	sources map[string]int
	// lostIDs are the ids of the lost history's events in Kafka.
	lostIDs map[string]bool
}

func (h histories) String() string {
	return fmt.Sprintf("expected=%d missing=%d duplicates=%d (under another source %d); lost history in Kafka %d events, "+
		"new events reusing an id of one of them %d, with its source too %d; sources %v",
		h.expected, h.missing, h.duplicates, h.resourced, h.lost, h.reused, h.collisions, h.sources)
}

// countHistories waits until Kafka has every event of the outbox of e's
// server (the truth after a failover or a restore) and counts. An event is
// told by id and content: after a fork one id may name two events.
func countHistories(t *testing.T, e *env, readCommitted bool) histories {
	t.Helper()
	rows, _ := e.pool.Query(testenv.Context(t), `SELECT id::text, aggregate_id, coalesce((payload->>'seq')::int, 0) FROM outbox`)
	table, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (event, error) {
		var ev event
		err := row.Scan(&ev.id, &ev.aggregate, &ev.seq)
		return ev, err
	})
	if err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	want := map[event]bool{}
	for _, ev := range table {
		want[ev] = true
	}
	h := histories{expected: len(want), sources: map[string]int{}}
	var (
		got     map[event]int
		sources map[event]map[string]bool
	)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, sources = map[event]int{}, map[event]map[string]bool{}
		for _, r := range readSourced(t, e.topic("payment"), readCommitted) {
			got[r.event]++
			if sources[r.event] == nil {
				sources[r.event] = map[string]bool{}
			}
			sources[r.event][r.source] = true
		}
		h.missing = 0
		for ev := range want {
			if got[ev] == 0 {
				h.missing++
			}
		}
		if h.missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3m, %d of the %d events of the outbox are not in Kafka", h.missing, len(want))
		}
		time.Sleep(250 * time.Millisecond) // the poll's period
	}
	type key struct{ source, id string }
	ids, keys := map[string]bool{}, map[key]bool{} // of the lost history's events in Kafka
	for ev, n := range got {
		if !want[ev] {
			h.lost++
			ids[ev.id] = true
			for src := range sources[ev] {
				keys[key{src, ev.id}] = true
			}
		} else {
			h.duplicates += n - 1
		}
	}
	h.lostIDs = ids
	for ev := range want {
		if ids[ev.id] {
			h.reused++
		}
		collides := false
		for src := range sources[ev] {
			h.sources[src]++
			collides = collides || keys[key{src, ev.id}]
		}
		if collides {
			h.collisions++
		}
		if len(sources[ev]) > 1 {
			h.resourced++
		}
	}
	return h
}

// checkLostEvents runs cdc-outbox lost-events and compares the ids it
// lists with those of the lost history's events the test found in Kafka
// (told by id and content from the server's events): the same ids.
func checkLostEvents(t *testing.T, e *env, c histories) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "lost-events", "--postgres-url", e.runURL, "--slot", e.slot, "--kafka-brokers", e.brokers[0],
		"--topics", e.topic("payment"), "--topic", e.prefix+".{aggregate_type}")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lost-events: %v\n%s", err, stderr.String())
	}
	listed := map[string]bool{}
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var ev struct{ ID, Why string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("lost-events printed %q: %v", line, err)
		}
		listed[ev.ID] = true
		lines++
	}
	var missed, extra []string
	for id := range c.lostIDs {
		if !listed[id] {
			missed = append(missed, id)
		}
	}
	for id := range listed {
		if !c.lostIDs[id] {
			extra = append(extra, id)
		}
	}
	t.Logf("lost-events listed %d records, %d ids; the test found %d lost events with %d ids", lines, len(listed), c.lost, len(c.lostIDs))
	if len(missed) > 0 || len(extra) > 0 {
		t.Fatalf("lost-events missed %d lost ids (%v) and listed %d that are not lost (%v)\n%s", len(missed), firstOf(missed), len(extra), firstOf(extra), stderr.String())
	}
}

// checkLostEventsCleaned deletes the 150 oldest rows of the server's
// outbox, events of the history the server shares with Kafka, as a table
// cleaned as docs/records.md recommends, and checks that lost-events
// still lists exactly the lost events: not the events whose rows were
// deleted, which lie before the shared events still in the table.
func checkLostEventsCleaned(t *testing.T, e *env, c histories) {
	t.Helper()
	testenv.Exec(t, e.url, `DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 150)`)
	checkLostEvents(t, e, c)
}

func firstOf(ids []string) []string { return ids[:min(len(ids), 10)] }

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
	var out []event
	for _, r := range readSourced(t, topic, readCommitted) {
		out = append(out, r.event)
	}
	return out
}

// sourced is an event as a record carries it, with its source header.
type sourced struct {
	event
	source string
}

// readSourced reads every record of topic to its end (its last stable
// offset for a read_committed reader) and returns their events and
// sources.
func readSourced(t *testing.T, topic string, readCommitted bool) []sourced {
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
	var out []sourced
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
			out = append(out, sourced{event{header(r, "id"), string(r.Key), body.Seq}, header(r, "source")})
		})
	}
	return out
}

// TestExactlyOnceRestoredBaseBackup: a cluster restored from a base backup
// and started as a primary keeps the system identifier and the timeline
// and writes other transactions at the LSNs the old primary had used. The
// Kafka checkpoint, written on the old primary after the backup, names an
// LSN the restored cluster reaches again with other transactions. Every
// event of the restored cluster is in Kafka, read_committed, and the lost
// history is reported:
//
//   - recreate-slot: cdc-outbox starts with --recreate-slot right after the
//     restore; the server's WAL ends before the checkpoint, so the
//     checkpoint is not on its history, and nothing is skipped.
//   - slot-before-writes: the slot is made right after the restore and the
//     restored cluster writes past the checkpoint's LSN before cdc-outbox
//     starts; cdc-outbox skips the transactions before it tentatively,
//     finds another commit there (or none), and reads them again.
//   - slot-before-writes-lone-message: the same, and the restored cluster
//     also emits a non-transactional outbox message among its first
//     writes, before the checkpoint's LSN. Skipped tentatively like the
//     transactions around it, its dead-letter record must not confirm its
//     position: the refutation reads again from where the stream began,
//     and the transactions before the message are published.
func TestExactlyOnceRestoredBaseBackup(t *testing.T) {
	for _, c := range []struct {
		name            string
		slotFirst, lone bool
	}{{"recreate-slot", false, false}, {"slot-before-writes", true, false}, {"slot-before-writes-lone-message", true, true}} {
		t.Run(c.name, func(t *testing.T) { restoredBaseBackup(t, c.slotFirst, c.lone) })
	}
}

func restoredBaseBackup(t *testing.T, slotFirst, lone bool) {
	began := time.Now()
	old := testenv.Cluster(t, testenv.ClusterOptions{})
	// The backup: a standby, stopped, later started without standby.signal
	// (a restore of a base backup with the WAL it has).
	backup := old.Standby("backup_1", testenv.ClusterOptions{})
	e := newEnvAt(t, old.URL)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	st := e.eo("--slot-failover=false")
	e.waitStreaming()
	if err := wl.write(ctx, 1, 300, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	var lsn string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the backup to replay up to "+lsn, func() bool {
		var ok bool
		conn := testenv.Connect(t, backup.URL)
		defer conn.Close(context.Background())
		return conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&ok) == nil && ok
	})
	backup.Control("stop")

	// The old primary goes on; Kafka commits its events and a checkpoint
	// past the backup's WAL.
	if err := wl.write(ctx, 2, 400, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, 2*time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted())); v.missing != 0 {
		t.Fatalf("before the restore: %s", v)
	}
	e.streamIdentity() // read while the old primary runs; the backup has the same
	st.kill()
	old.Control("kill")
	cp := e.kafkaCheckpoint()

	if err := os.Remove(filepath.Join(backup.DataDir, "standby.signal")); err != nil {
		t.Fatal(err)
	}
	backup.Control("start")
	e.url, e.runURL = backup.URL, backup.URL
	pool, err := pgxpool.New(ctx, backup.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool = pool
	flags := []string{"--recreate-slot"}
	var start pglogrepl.LSN
	if slotFirst {
		flags = nil
		var at string
		if err := pool.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot).Scan(&at); err != nil {
			t.Fatal(err)
		}
		if start, err = pglogrepl.ParseLSN(at); err != nil {
			t.Fatal(err)
		}
		for w := 10; ; w++ {
			if err := wl.write(ctx, w, 200, 5, "payment", false); err != nil {
				t.Fatal(err)
			}
			if lone && w == 10 {
				var below bool
				if err := pool.QueryRow(ctx, `SELECT pg_logical_emit_message(false, 'cdc_outbox', '{"v":1,"id":"lone-restored"}') < $1::pg_lsn`,
					cp.LSN.String()).Scan(&below); err != nil {
					t.Fatal(err)
				}
				if !below {
					t.Fatalf("the lone message lies past the Kafka checkpoint %s: the test needs it before", cp.LSN)
				}
			}
			var past bool
			if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() > $1::pg_lsn`, cp.LSN.String()).Scan(&past); err != nil {
				t.Fatal(err)
			}
			if past {
				break
			}
		}
	}
	if lone {
		flags = append(flags, "--on-bad-event", "dead-letter", "--dead-letter-topic", e.prefix+".dead-letter")
	}
	st = e.eo(flags...)
	e.waitStreaming()
	if !slotFirst {
		if start, err = pglogrepl.ParseLSN(slotConfirmed(t, backup.URL, e.slot)); err != nil {
			t.Fatal(err)
		}
	}
	if err := wl.write(ctx, 3, 600, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	c := countHistories(t, e, true)
	log := st.logText()
	t.Logf("restored base backup, exactly-once, %s: slot at %s, Kafka checkpoint at %s; %s; %s in all",
		map[bool]string{false: "--recreate-slot", true: "slot made before the writes"}[slotFirst], start, cp.LSN, c, time.Since(began).Round(time.Second))
	if start >= cp.LSN {
		t.Fatalf("the slot starts at %s, at or past the Kafka checkpoint %s: the restored cluster's WAL does not overlap what Kafka holds", start, cp.LSN)
	}
	want := []string{`"msg":"lost history: the Kafka checkpoint lies on WAL this server never had`, "lies past the server's WAL"}
	if slotFirst {
		// The transactions before the checkpoint's position were skipped
		// tentatively, then read again.
		want = []string{"the Kafka checkpoint is not on this server's WAL history", "reading again the"}
	}
	for _, w := range want {
		if !strings.Contains(log, w) {
			t.Fatalf("the restart does not say %q:\n%s", w, tailOf(log, 3000))
		}
	}
	if n := metricValue(t, st, "cdc_outbox_lost_history_total"); n != 1 {
		t.Fatalf("cdc_outbox_lost_history_total = %v, want 1", n)
	}
	// Where the restored history parts from the lost one is not known:
	// everything streamed after the restore is the new epoch's, and the
	// shared part's events are repeated under its source (resourced).
	if c.collisions != 0 {
		t.Fatalf("%d events of the restored cluster share source and id with an event of the lost history: a consumer deduping by source and id drops them", c.collisions)
	}
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 1 {
		t.Fatalf("cdc_outbox_history_epoch = %v after the restore, want 1", n)
	}
	checkLostEvents(t, e, c)
	checkLostEventsCleaned(t, e, c)
	st.stop()
}

// TestFailoverInATransactionSentInPart (at-least-once, PostgreSQL 17, an
// asynchronous standby cut off from the primary): a 200,000-row
// transaction commits on the primary after the cut, and while cdc-outbox
// is handing it to the producer, with thousands of its rows on their way
// to Kafka and its commit not yet read, the primary dies and the standby
// is promoted. Those rows reach Kafka but are of a history the new primary
// does not have, whose bigserial hands their ids out again: the stream
// must take them for a lost history as it does whole transactions past
// the fork (stop, record an epoch), or every new event that reuses one of
// their ids goes out under the same source.
//
// The broker is paused from just before the cut to the promotion, with a
// transaction of one event in flight, so that no keepalive can move the
// confirmed position past the fork meanwhile (the position is then the
// last commit before the cut), and the rows of the large transaction wait
// in the producer; they are sent once the broker resumes. Not parallel: it
// pauses the broker every test shares.
func TestFailoverInATransactionSentInPart(t *testing.T) {
	began := time.Now()
	ctx := testenv.Context(t)
	f := cutOffStandby(t)
	primary, standby, cut, late, e := f.primary, f.standby, f.cut, f.late, f.e
	flags := []string{"--slot-poll-interval", "1s"}
	st := e.start(flags...)
	e.waitStreaming()
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 100, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.check([]string{"payment"}, "before the cut")
	testenv.WaitSlotSynced(t, standby.URL, e.slot, slotConfirmed(t, primary.URL, e.slot))

	resume := brokerFault(t, "pause", "resume")
	if err := wl.write(ctx, 1, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the event written with the broker paused in flight", func() bool {
		return metricValue(t, st, "cdc_outbox_inflight_events") >= 1
	})
	end := pglogrepl.LSN(e.currentLSN())
	eventually(t, time.Minute, "the standby to receive the WAL up to "+end.String(), func() bool {
		var ok bool
		conn := testenv.Connect(t, standby.URL)
		defer conn.Close(context.Background())
		return conn.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn() >= $1::pg_lsn`, end.String()).Scan(&ok) == nil && ok
	})
	cut.Close()
	const rows = 200_000
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'payment', 'big-' || g, 'PaymentCreated', jsonb_build_object('seq', 1) FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "1,000 rows of the large transaction handed to the producer", func() bool {
		return metricValue(t, st, "cdc_outbox_inflight_events") >= 1000
	})
	late.Blackhole()
	primary.Control("kill")
	standby.Control("promote")
	resume()
	late.Restore()
	if err := st.exited(2 * time.Minute); err == nil {
		t.Fatalf("the streamer went on on the new primary:\n%s", tailOf(st.logText(), 3000))
	}
	log := st.logText()
	for _, w := range []string{`"msg":"lost history: cdc-outbox read the old primary's WAL past the fork`, `"msg":"lost history recorded`} {
		if !strings.Contains(log, w) {
			t.Fatalf("the streamer does not say %q:\n%s", w, tailOf(log, 3000))
		}
	}

	e.pool.Reset() // its connections died with the old primary
	st = e.start(flags...)
	e.waitStreaming()
	if err := wl.write(ctx, 2, 500, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	c := countHistories(t, e, false)
	t.Logf("failover in a transaction sent in part (of %d rows); %s; %s in all", rows, c, time.Since(began).Round(time.Second))
	if c.lost == 0 || c.reused == 0 {
		t.Fatalf("no row of the transaction in Kafka, or no new event reusing an id of one: the test shows nothing (%s)", c)
	}
	if c.missing != 0 || c.collisions != 0 {
		t.Fatalf("%d events of the new primary missing, %d sharing source and id with a row of the lost transaction", c.missing, c.collisions)
	}
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 1 {
		t.Fatalf("cdc_outbox_history_epoch = %v after the restart, want 1", n)
	}
	st.stop()
}
