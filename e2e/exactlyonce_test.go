package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// exactlyOnce are the flags of exactly-once delivery.
var exactlyOnce = []string{"--delivery", "exactly-once"}

// eo is start with exactly-once delivery and extra flags.
func (e *env) eo(extra ...string) *streamer {
	e.t.Helper()
	return e.start(append(exactlyOnce[:len(exactlyOnce):len(exactlyOnce)], extra...)...)
}

// checkExactlyOnce is the read_committed verifier: every written event
// arrives (in per-aggregate order), and reading every committed record of
// the topics to their last stable offset finds each event id exactly once
// and nothing else.
func (wl *workload) checkExactlyOnce(types []string, what string) {
	t := wl.e.t
	t.Helper()
	v, _ := wl.verify(types, 3*time.Minute, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var topics []string
	for _, typ := range types {
		topics = append(topics, wl.e.topic(typ))
	}
	counts := committedRecords(t, topics...)
	extra, dups := 0, 0
	wl.mu.Lock()
	want := map[string]bool{}
	for _, ev := range wl.events {
		want[ev.id] = true
	}
	wl.mu.Unlock()
	for id, n := range counts {
		if !want[id] {
			extra += n
		} else if n > 1 {
			dups += n - 1
		}
	}
	t.Logf("read_committed verifier %s: %s; committed records read to the last stable offset: %d duplicates, %d not written", what, v, dups, extra)
	if v.missing != 0 || v.orderViolations != 0 || dups != 0 || extra != 0 {
		t.Fatalf("exactly-once broken: %s, %d duplicates, %d records not written; missing ids: %v", v, dups, extra, v.missingIDs)
	}
}

// committedRecords reads the topics to their last stable offsets as a
// read_committed consumer and counts the records by event id. Every batch
// the streamer writes is transactional, so the last offset below a stable
// offset is a transaction marker, which KeepControlRecords returns.
func committedRecords(t *testing.T, topics ...string) map[string]int {
	t.Helper()
	return committedRecordsBy(t, func(r *kgo.Record) string { return header(r, "id") }, topics...)
}

// committedRecordsBy is committedRecords counting by key(record) (an
// outbox's source and the event id, when several outboxes share a topic).
func committedRecordsBy(t *testing.T, key func(*kgo.Record) string, topics ...string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adm := kadm.NewClient(testenv.KafkaClient(t))
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list the last stable offsets of %v: %v", topics, err)
	}
	left := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			if left[o.Topic] == nil {
				left[o.Topic] = map[int32]int64{}
			}
			left[o.Topic][o.Partition] = o.Offset - 1
		}
	})
	counts := map[string]int{}
	if len(left) == 0 {
		return counts
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %v to the last stable offsets: still %v to go", topics, left)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Topic][r.Partition]; ok && r.Offset >= end {
				delete(left[r.Topic], r.Partition)
				if len(left[r.Topic]) == 0 {
					delete(left, r.Topic)
				}
			}
			if !r.Attrs.IsControl() {
				counts[key(r)]++
			}
		})
	}
	return counts
}

// kafkaCheckpoint reads the slot's checkpoint as the streamer does at
// start.
func (e *env) kafkaCheckpoint() sink.Checkpoint {
	e.t.Helper()
	ctx := testenv.Context(e.t)
	stream := e.streamIdentity()
	cp, err := sink.ReadCheckpoint(ctx, sink.Config{Brokers: e.brokers}, "cdc_outbox.checkpoints", stream, stream)
	if err != nil {
		e.t.Fatal(err)
	}
	return cp
}

// streamIdentity is the stream's identity, read on the server the first
// time it is asked for.
func (e *env) streamIdentity() string {
	e.t.Helper()
	if e.stream == "" {
		stream, err := replication.StreamIdentity(testenv.Context(e.t), e.url, e.slot)
		if err != nil {
			e.t.Fatal(err)
		}
		e.stream = stream
	}
	return e.stream
}

// TestExactlyOnceEndToEnd: in exactly-once delivery, two writers' events
// reach Kafka each exactly once for a read_committed consumer, across a
// clean restart; the checkpoint topic holds the slot's position, and the
// slot never confirms past it.
func TestExactlyOnceEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	s := e.eo()
	e.waitStreaming()
	wl.writeConcurrently(t, ctx, 1000, 1, 10)()
	wl.checkExactlyOnce([]string{"payment"}, "while streaming")
	eventually(t, time.Minute, "the last Kafka transaction", func() bool { return metricValue(t, s, "cdc_outbox_inflight_events") == 0 })
	m := scrape(t, s.httpAddr())
	if m[`cdc_outbox_kafka_transactions_total{outcome="committed"}`] == 0 || m[`cdc_outbox_kafka_transactions_total{outcome="aborted"}`] != 0 ||
		m["cdc_outbox_checkpoint_lsn"] == 0 || m["cdc_outbox_kafka_transaction_seconds_count"] == 0 {
		t.Fatalf("exactly-once metrics: committed %v, aborted %v, checkpoint %v, transaction seconds count %v",
			m[`cdc_outbox_kafka_transactions_total{outcome="committed"}`], m[`cdc_outbox_kafka_transactions_total{outcome="aborted"}`],
			m["cdc_outbox_checkpoint_lsn"], m["cdc_outbox_kafka_transaction_seconds_count"])
	}
	s.stop()
	// The checkpoint in Kafka is the one the streamer reported last. (The
	// slot may be further on: a keepalive moves it over WAL without outbox
	// rows when nothing is in flight.)
	if cp := e.kafkaCheckpoint(); !cp.Found || float64(cp.LSN) != m["cdc_outbox_checkpoint_lsn"] {
		t.Fatalf("Kafka checkpoint %+v, the streamer's last %v", cp, m["cdc_outbox_checkpoint_lsn"])
	}

	s = e.eo()
	e.waitStreaming()
	if err := wl.write(ctx, 3, 500, 5, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "after a restart")
	s.stop()
}

// TestExactlyOnceSIGKILLCycles: 20 SIGKILLs of the streamer, spread over
// the writing of 100,000 events by 4 writers in transactions of 1 to 50
// rows (each kill at a random moment once the writers are a twenty-first
// further). A read_committed consumer finds every event exactly once, in
// per-aggregate order: a restart skips what the Kafka checkpoint holds, and
// what a killed instance left open is aborted.
func TestExactlyOnceSIGKILLCycles(t *testing.T) {
	t.Parallel()
	const cycles, perWriter = 20, 25000
	e := newEnv(t)
	wl := newWorkload(e)
	ctx := testenv.Context(t)
	first := e.eo()
	e.waitStreaming()
	first.kill()

	writersDone := wl.writeConcurrently(t, ctx, perWriter, 1, 5, 20, 50)
	rng := rand.New(rand.NewPCG(5, 6))
	skipped := 0 // starts that skipped what Kafka held
	for cycle := 1; cycle <= cycles; cycle++ {
		s := e.eo("--max-inflight-events", "2000")
		eventually(t, 5*time.Minute, "the writers to progress", func() bool { return wl.written() >= cycle*4*perWriter/(cycles+1) })
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the kill's moment, not a wait for a condition
		s.kill()
		if strings.Contains(s.logText(), skippingMsg) {
			skipped++
		}
	}
	writersDone()
	s := e.eo()
	wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("after %d SIGKILL cycles (%d starts skipped transactions Kafka held)", cycles, skipped))
	s.stop()
}

const skippingMsg = "skipping transactions that Kafka holds already"

// TestExactlyOnceZombieFenced: a hot-standby takeover with the old instance
// frozen. The old instance is SIGSTOPped with records waiting for its next
// Kafka transaction, its walsender is terminated, a new instance takes the
// slot over (registering the same transactional id, which fences the old
// one), and the old one is resumed: it stops with the fencing error, having
// written nothing more, and a read_committed consumer finds every event
// exactly once. The old instance commits every 20 s: its commit after the
// first event (the prime) is then the last one before it freezes, however
// slow the machine, and the records it holds are sure to wait.
func TestExactlyOnceZombieFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	old := e.eo("--transaction-interval", "20s", "--max-inflight-events", "100000")
	e.waitStreaming()
	wl.prime(ctx)
	// Events the old instance has received and holds for its next
	// transaction when it freezes.
	before := metricValue(t, old, "cdc_outbox_received_lsn")
	if err := wl.write(ctx, 1, 200, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the old instance to receive the events", func() bool {
		return metricValue(t, old, "cdc_outbox_received_lsn") > before && metricValue(t, old, "cdc_outbox_inflight_events") > 0
	})
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.url, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.slot)

	takeover := e.eo()
	e.waitStreaming()
	if err := wl.write(ctx, 2, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := old.exited(2 * time.Minute); err == nil {
		t.Fatal("the fenced instance exited 0")
	}
	stopped := stoppedWith(old)
	t.Logf("the fenced instance: %s", stopped)
	if !strings.Contains(stopped, "fenced") || !strings.Contains(stopped, "another instance") {
		t.Fatalf("the old instance's error does not say it was fenced:\n%s", tailOf(old.logText(), 3000))
	}
	wl.checkExactlyOnce([]string{"payment"}, "after a takeover and a fenced zombie")
	takeover.stop()
}

// TestExactlyOnceAbortedRecordsVisibleUncommitted: a record the broker
// refuses inside a Kafka transaction aborts the whole transaction and stops
// the stream (nothing is confirmed past it). The records of that
// transaction the broker had already written stay in the log as aborted: a
// read_uncommitted consumer sees them, a read_committed one does not.
func TestExactlyOnceAbortedRecordsVisibleUncommitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	// A topic whose records may be at most 1000 bytes, for the second
	// event of the transaction.
	adm := kadm.NewClient(testenv.KafkaClient(t))
	small := "1000"
	if resp, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &small}, e.topic("small")); err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	s := e.eo()
	e.waitStreaming()
	testenv.Exec(t, e.url, `BEGIN;
		INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'a1', 'Small', '{"seq": 1}');
		INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('small', 'a2', 'Big', jsonb_build_object('pad', repeat('x', 5000)));
		COMMIT`)
	if err := s.exited(2 * time.Minute); err == nil {
		t.Fatal("the streamer exited 0 after the broker refused a record of its transaction")
	}
	stopped := stoppedWith(s)
	t.Logf("the streamer: %s", stopped)
	if !strings.Contains(stopped, "MESSAGE_TOO_LARGE") || !strings.Contains(stopped, "aborts its whole Kafka transaction") {
		t.Fatalf("the error does not name the broker's refusal:\n%s", tailOf(s.logText(), 3000))
	}
	uncommitted := recordsIn(t, e.topic("payment"), kgo.ReadUncommitted())
	committed := recordsIn(t, e.topic("payment"), kgo.ReadCommitted())
	t.Logf("records of the aborted transaction: read_uncommitted sees %d, read_committed %d", uncommitted, committed)
	if uncommitted != 1 || committed != 0 {
		t.Fatalf("read_uncommitted sees %d records (want 1, the aborted one), read_committed %d (want 0)", uncommitted, committed)
	}
}

// recordsIn counts the data records of a one-partition topic up to its end
// as a consumer with the isolation level sees them.
func recordsIn(t *testing.T, topic string, level kgo.IsolationLevel) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := kadm.NewClient(testenv.KafkaClient(t))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil || ends.Error() != nil {
		t.Fatalf("end offsets of %s: %v %v", topic, err, ends.Error())
	}
	var end int64
	ends.Each(func(o kadm.ListedOffset) { end = max(end, o.Offset) })
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords())
	n := 0
	for last := int64(-1); last < end-1; {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s to offset %d: at %d", topic, end, last)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			last = r.Offset
			if !r.Attrs.IsControl() {
				n++
			}
		})
	}
	return n
}

// stoppedWith is the error the streamer's last log line says it stopped
// with.
func stoppedWith(s *streamer) string {
	var line string
	for _, l := range strings.Split(s.logText(), "\n") {
		if strings.Contains(l, `"msg":"stopped with an error"`) {
			line = l
		}
	}
	return line
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// metricValue scrapes one series of the streamer's metrics (0 when absent).
func metricValue(t *testing.T, s *streamer, series string) float64 {
	t.Helper()
	return scrape(t, s.httpAddr())[series]
}

// killBehindCheckpoint streams events in exactly-once delivery and
// SIGKILLs the streamer after Kafka committed them and before it told
// PostgreSQL (status updates only every 5s), so that the slot's confirmed
// position is behind the Kafka checkpoint: a restart is sent again what
// Kafka holds, and must skip it. extra are more streamer flags.
func (wl *workload) killBehindCheckpoint(ctx context.Context, extra ...string) {
	e, t := wl.e, wl.e.t
	t.Helper()
	committed := kgo.FetchIsolationLevel(kgo.ReadCommitted())
	for attempt := 1; ; attempt++ {
		s := e.eo(append([]string{"--status-interval", "5s", "--keepalive-interval", "10s"}, extra...)...)
		e.waitStreaming()
		if err := wl.write(ctx, attempt, 300, 10, "payment", false); err != nil {
			t.Fatal(err)
		}
		if v, _ := wl.verify([]string{"payment"}, 2*time.Minute, committed); v.missing != 0 {
			t.Fatalf("before the kill: %s", v)
		}
		s.kill()
		e.waitSlotInactive()
		confirmed, _ := e.slotLSNs()
		cp := e.kafkaCheckpoint()
		t.Logf("attempt %d: slot confirmed %d, Kafka checkpoint %d", attempt, confirmed, cp.LSN)
		if int64(cp.LSN) > confirmed {
			return
		}
		// A status update went out between the commit and the kill.
		if attempt == 5 {
			t.Fatal("the slot confirmed the Kafka checkpoint before every kill: nothing to skip")
		}
	}
}

// TestExactlyOnceSkipsWhatKafkaHolds: the streamer is killed after Kafka
// committed its transactions and before it told PostgreSQL (status updates
// only every 5s), so the slot's confirmed position is behind the Kafka
// checkpoint. The next start reads the checkpoint, PostgreSQL sends those
// transactions again, and they are skipped: each event is still in Kafka
// once.
func TestExactlyOnceSkipsWhatKafkaHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	wl.killBehindCheckpoint(ctx)
	// status shows both positions: the Kafka checkpoint ahead of the slot.
	out, err := exec.Command(binary, "status", "--json", "--postgres-url", e.url, "--slot", e.slot,
		"--delivery", "exactly-once", "--kafka-brokers", e.brokers[0]).Output()
	var st struct {
		Delivery           string `json:"delivery"`
		KafkaCheckpointLSN string `json:"kafka_checkpoint_lsn"`
		KafkaAheadBytes    int64  `json:"kafka_ahead_bytes"`
		Warnings           []string
	}
	if jerr := json.Unmarshal(out, &st); jerr != nil {
		t.Fatalf("status --json: %v (%v): %s", jerr, err, out)
	}
	if st.Delivery != "exactly-once" || st.KafkaCheckpointLSN != e.kafkaCheckpoint().LSN.String() || st.KafkaAheadBytes <= 0 || len(st.Warnings) != 0 {
		t.Fatalf("status does not show the Kafka checkpoint ahead of the slot: %s", out)
	}

	s := e.eo()
	eventually(t, time.Minute, "the restart to skip the transactions Kafka holds", func() bool {
		return strings.Contains(s.logText(), skippingMsg)
	})
	if err := wl.write(ctx, 9, 100, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "after a restart behind the Kafka checkpoint")
	if n := metricValue(t, s, "cdc_outbox_transactions_skipped_total"); n == 0 {
		t.Fatal("cdc_outbox_transactions_skipped_total is 0")
	}
	s.stop()
}

// TestExactlyOnceReconnects: the replication connection is cut five times
// under load (the walsender terminated); the streamer reconnects from its
// confirmed position, drops the records of the transaction that was open,
// and skips what it already handed to Kafka transactions: each event is in
// Kafka once.
func TestExactlyOnceReconnects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	s := e.eo()
	e.waitStreaming()
	writersDone := wl.writeConcurrently(t, ctx, 3000, 1, 50)
	for cut := 0; cut < 5; cut++ {
		wl.progress(t, 300)
		testenv.Exec(t, e.url, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.slot)
	}
	writersDone()
	wl.checkExactlyOnce([]string{"payment"}, "across 5 cut replication connections")
	if n := strings.Count(s.logText(), "replication connection lost"); n == 0 {
		t.Fatal("the streamer never lost its connection")
	}
	s.stop()
}

// TestExactlyOnceBrokerKilled: the broker is SIGKILLed while writers
// commit and started again on the same data; then PostgreSQL is restarted
// and later crashes (SIGKILL). The streamer rides through each (a Kafka
// transaction that cannot finish is aborted and its records written again
// in the next one), and a read_committed consumer finds every event exactly
// once.
//
// Not parallel: it kills the broker and PostgreSQL every test shares.
func TestExactlyOnceServerFaults(t *testing.T) {
	e := newEnv(t)
	ctx := testenv.Context(t)
	s := e.eo()
	e.waitStreaming()
	wl := newWorkload(e)
	wl.prime(ctx)
	// Each fault while two writers commit, at a point of their progress.
	phase := 0
	during := func(fault func()) {
		writing := make(chan error, 2)
		for w := 1; w <= 2; w++ {
			go func() { writing <- wl.writeThroughFaults(ctx, 10*phase+w, 3000, 10, "payment") }()
		}
		wl.progress(t, 300)
		fault()
		for w := 1; w <= 2; w++ {
			if err := <-writing; err != nil {
				t.Fatalf("writer: %v", err)
			}
		}
		phase++
	}
	during(func() { brokerFault(t, "kill", "start")() }) // killed, then started again on the same data
	// A broker killed while a commit is asked leaves its outcome unknown.
	// cdc-outbox settles it (sink.Transactional.settle), but when the
	// broker made the commit and bumped the producer's epoch with it, the
	// client finds itself fenced and cdc-outbox stops, as its message
	// says; started again, as a supervisor does, it resumes from the
	// checkpoint. What must hold either way is the count: every event
	// once. It may stop some seconds after the broker is back, so each
	// phase looks.
	restartIfStoppedOnCommit := func() {
		select {
		case err := <-s.done:
			if log := s.logText(); !strings.Contains(log, "fenced") && !strings.Contains(log, "commit the transaction") {
				s.dump()
				t.Fatalf("the streamer stopped with %v, not on a commit whose outcome the broker's SIGKILL left unknown", err)
			}
			t.Logf("the streamer stopped on a commit the broker's SIGKILL left unknown (%v); started again", err)
			s = e.eo()
			e.waitStreaming()
		default:
		}
	}
	restartIfStoppedOnCommit()
	during(func() { testenv.ControlPostgres(t, "restart") })
	restartIfStoppedOnCommit()
	during(func() {
		testenv.ControlPostgres(t, "kill")
		testenv.ControlPostgres(t, "start")
	})
	restartIfStoppedOnCommit()
	wl.checkExactlyOnce([]string{"payment"}, "across a broker SIGKILL, a PostgreSQL restart and a PostgreSQL crash")
	if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the streamer did not ride through: %v", err)
	}
	s.stop()
}

// TestExactlyOnceLargeTransaction: one PostgreSQL transaction of 30,000
// rows, fifteen times --max-inflight-events, is never split: its records
// wait for its commit without pausing reading (which would wait forever for
// a commit that cannot arrive), then go in one Kafka transaction. Each
// event is in Kafka once.
func TestExactlyOnceLargeTransaction(t *testing.T) {
	t.Parallel()
	const rows = 30000
	e := newEnv(t)
	wl := newWorkload(e)
	s := e.eo("--max-inflight-events", "2000")
	e.waitStreaming()
	ids := e.ids(fmt.Sprintf(`WITH w AS (INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'payment', 'agg-' || (g %% 100), 'Bulk', jsonb_build_object('seq', g / 100 + 1)
		FROM generate_series(0, %d) g RETURNING id, aggregate_id, payload) SELECT id::text || ' ' || aggregate_id || ' ' || (payload->>'seq') FROM w`, rows-1))
	for _, line := range ids {
		var w written
		if _, err := fmt.Sscanf(line, "%s %s %d", &w.id, &w.aggregate, &w.seq); err != nil {
			t.Fatal(err)
		}
		wl.events = append(wl.events, w)
	}
	wl.checkExactlyOnce([]string{"payment"}, fmt.Sprintf("after one transaction of %d rows", rows))
	s.stop()
}

// TestExactlyOnceCheckpointOfAnotherCluster: the checkpoint topic holds a
// checkpoint under the slot's name (the former default key) written by
// another cluster with the same slot name (its origin differs), at an LSN
// far ahead of this server's. Its LSN means nothing here: it is not read,
// and nothing is skipped.
func TestExactlyOnceCheckpointOfAnotherCluster(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	cfg := sink.Config{Brokers: e.brokers}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, "cdc_outbox.checkpoints"); err != nil {
		t.Fatal(err)
	}
	foreign := sink.CheckpointRecord("cdc_outbox.checkpoints", e.slot, "7000000000000000000/5/16384", 0xFFFF_0000_0000)
	if err := testenv.KafkaClient(t).ProduceSync(ctx, foreign).FirstErr(); err != nil {
		t.Fatal(err)
	}
	wl := newWorkload(e)
	s := e.eo()
	e.waitStreaming()
	if err := wl.write(ctx, 1, 200, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "with another cluster's checkpoint in the topic")
	if !strings.Contains(s.logText(), "no checkpoint of this stream in Kafka yet") {
		t.Fatalf("the foreign checkpoint was taken for this stream's:\n%s", tailOf(s.logText(), 3000))
	}
	s.stop()
}

// TestExactlyOnceHotStandby: a second instance started while the first
// streams waits for the slot without fencing the first (it registers the
// transactional id only once it holds the slot); the first goes on
// committing. When the first is SIGKILLed, the second takes over, and each
// event is in Kafka once.
func TestExactlyOnceHotStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testenv.Context(t)
	active := e.eo()
	e.waitStreaming()
	standby := e.startStandby(exactlyOnce...)
	wl := newWorkload(e)
	if err := wl.write(ctx, 0, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	wl.checkExactlyOnce([]string{"payment"}, "with a standby waiting")
	if err := active.cmd.Process.Signal(syscall.Signal(0)); err != nil || strings.Contains(active.logText(), "fenced") {
		t.Fatalf("the standby's start stopped the active instance: %v\n%s", err, tailOf(active.logText(), 3000))
	}
	active.kill()
	if err := wl.write(ctx, 1, 300, 10, "payment", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the standby to take over", func() bool {
		return strings.Count(standby.logText(), `"msg":"streaming"`) == 1
	})
	wl.checkExactlyOnce([]string{"payment"}, "across the takeover")
	standby.stop()
}
