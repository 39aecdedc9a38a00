package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
	"github.com/twmb/franz-go/pkg/kgo"
)

// One outbox split over K row-filtered slots (--shards, docs/sharding.md).
// Row filters need PostgreSQL 15: on 14 only TestShardsRefused runs, and
// checks the refusal.

// shards is the number of shards the tests split the outbox in.
const shards = 4

// shardSlots are the slots of the test's stream split in k shards.
func (e *env) shardSlots(k int) []string {
	var slots []string
	for i := range k {
		slots = append(slots, fmt.Sprintf("%s_shard_%d_of_%d", e.slot, i, k))
	}
	return slots
}

// waitShardsStreaming waits until a walsender streams from each of the k
// shards' slots (waitStreaming's reason, for every shard).
func (e *env) waitShardsStreaming(k int) {
	e.t.Helper()
	eventually(e.t, 60*time.Second, fmt.Sprintf("the streamer to stream from its %d shards' slots", k), func() bool {
		var n int
		err := e.pool.QueryRow(testenv.Context(e.t), `SELECT count(*) FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = ANY($1)`, e.shardSlots(k)).Scan(&n)
		return err == nil && n == k
	})
}

// waitShardsStarted waits until each shard of the process streams from
// its slot (its "starting" line).
func (s *streamer) waitShardsStarted() {
	s.t.Helper()
	eventually(s.t, time.Minute, "every shard to start streaming", func() bool {
		return strings.Count(s.logText(), `"msg":"starting"`) == shards
	})
}

// needsRowFilters skips a test of shards on PostgreSQL 14, which refuses
// them (TestShardsRefused checks that).
func needsRowFilters(t *testing.T, e *env) {
	t.Helper()
	if e.serverMajor() < 15 {
		t.Skipf("PostgreSQL %d has no row filters: shards are refused (TestShardsRefused)", e.serverMajor())
	}
}

// TestShardsSIGKILLCycles: 8 SIGKILLs of a streamer of 4 shards at random
// moments while 3 writers commit 12,000 events, rows and messages of the
// same aggregates interleaved, in transactions of 1 to 20: in both
// deliveries nothing is missing and per-aggregate order holds across rows
// and messages (one aggregate, one shard); at-least-once repeats at most
// what was in flight, exactly-once none.
func TestShardsSIGKILLCycles(t *testing.T) {
	t.Parallel()
	for _, delivery := range []string{"at-least-once", "exactly-once"} {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			const cycles, inflight, perWriter = 8, 1000, 4000
			e := newEnv(t)
			needsRowFilters(t, e)
			wl := newWorkload(e)
			wl.insert = mixedEvent
			ctx := testenv.Context(t)
			flags := []string{"--shards", fmt.Sprint(shards), "--delivery", delivery, "--max-inflight-events", fmt.Sprint(inflight)}
			first := e.start(flags...)
			e.waitShardsStreaming(shards)
			first.kill()
			done := wl.writeConcurrently(t, ctx, perWriter, 1, 5, 20)
			rng := rand.New(rand.NewPCG(35, 4))
			for cycle := 1; cycle <= cycles; cycle++ {
				s := e.start(flags...)
				// Each kill with every shard streaming, not while the
				// process prepares the slots.
				s.waitShardsStarted()
				eventually(t, 5*time.Minute, "the writers to progress", func() bool { return wl.written() >= cycle*3*perWriter/(cycles+1) })
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the kill's moment, not a wait for a condition
				s.kill()
			}
			done()
			s := e.start(flags...)
			what := fmt.Sprintf("after %d SIGKILL cycles of %d shards, rows and messages", cycles, shards)
			if delivery == "exactly-once" {
				wl.checkExactlyOnce([]string{"payment"}, what)
				s.stop()
				return
			}
			v, _ := wl.verify([]string{"payment"}, 3*time.Minute)
			t.Logf("verifier %s: %s", what, v)
			if v.expected != 3*perWriter || v.missing != 0 || v.orderViolations != 0 {
				t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
			}
			if v.duplicates > cycles*shards*inflight {
				t.Fatalf("%d duplicates: more than %d kills × %d shards × %d in flight", v.duplicates, cycles, shards, inflight)
			}
			s.stop()
		})
	}
}

// TestShardsPublishMessagesOnce: every slot decodes every message whatever
// its publication's row filter; with 4 shards each message is still
// published once (each shard keeps those of its own hash), rows once, and
// every shard streams a share.
func TestShardsPublishMessagesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	ctx := testenv.Context(t)
	s := e.start("--shards", fmt.Sprint(shards))
	e.waitShardsStreaming(shards)
	wl := newWorkload(e)
	wl.insert = mixedEvent
	wl.writeConcurrently(t, ctx, 500, 1, 10)()
	v, got := wl.verify([]string{"payment"}, 2*time.Minute)
	t.Logf("verifier, %d shards, rows and messages without faults: %s", shards, v)
	if v.missing != 0 || v.duplicates != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
	// Every shard confirmed past the events: each streamed its share.
	end := e.currentLSN()
	eventually(t, time.Minute, "every shard's slot to confirm the events", func() bool {
		var behind int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND confirmed_flush_lsn - '0/0' < $2`,
			e.shardSlots(shards), end).Scan(&behind)
		return err == nil && behind == 0
	})
	if len(got) != 1000 {
		t.Fatalf("%d event ids in Kafka, want 1000", len(got))
	}
	// The metrics are the stream's: the shards' events summed, the lag the
	// worst shard's.
	var n float64
	lags := 0
	for series, v := range scrape(t, s.httpAddr()) {
		if strings.HasPrefix(series, "cdc_outbox_events_total{") {
			n += v
		}
		if strings.HasPrefix(series, `cdc_outbox_shard_replication_lag_bytes{slot="`+e.slot+"_shard_") {
			lags++
		}
	}
	if lags != shards {
		t.Errorf("%d shards' cdc_outbox_shard_replication_lag_bytes, want %d", lags, shards)
	}
	if n != 1000 {
		t.Errorf("cdc_outbox_events_total = %v, want 1000 (rows and messages of the 4 shards)", n)
	}
	// status lists every shard, each active.
	out, err := exec.Command(binary, "status", "--json", "--postgres-url", e.url, "--slot", e.slot, "--shards", fmt.Sprint(shards)).Output()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Slot   string
		Shards []struct {
			Shard, Slot, Verdict string
			Active               bool
		}
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != shards || !strings.HasPrefix(st.Slot, e.slot+"_shard_") {
		t.Fatalf("status: %s", out)
	}
	for i, sh := range st.Shards {
		if sh.Slot != e.shardSlots(shards)[i] || !sh.Active || sh.Verdict != "healthy" {
			t.Errorf("status of shard %d: %+v", i, sh)
		}
	}
	s.stop()
	for i := range shards {
		if !strings.Contains(s.logText(), fmt.Sprintf(`"shard":"%d of %d"`, i, shards)) {
			t.Errorf("no log line of shard %d of %d", i, shards)
		}
	}
}

// TestShardsPostgresRestart: PostgreSQL restarts under a streamer of 4
// shards while writers commit: every shard reconnects (the holder takes
// its lock again), nothing is missing, order holds.
//
// Not parallel: it restarts the server every test shares.
func TestShardsPostgresRestart(t *testing.T) {
	e := newEnv(t)
	needsRowFilters(t, e)
	s := e.start("--shards", fmt.Sprint(shards))
	e.waitShardsStreaming(shards)
	wl := newWorkload(e)
	ctx, stop := context.WithCancel(testenv.Context(t))
	defer stop()
	writing := make(chan error, 3)
	for w := range 3 {
		go func() {
			for ctx.Err() == nil {
				if err := wl.writeThroughFaults(ctx, w, 50, 1+w*10, "payment"); err != nil && ctx.Err() == nil {
					writing <- err
					return
				}
			}
			writing <- nil
		}()
	}
	wl.progress(t, 100)
	testenv.ControlPostgres(t, "restart")
	e.waitShardsStreaming(shards)
	eventually(t, 30*time.Second, "the holder to take its lock again", func() bool {
		return strings.Contains(s.logText(), "holds the lock of the stream's shards again")
	})
	wl.progress(t, 100)
	stop()
	for range 3 {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	wl.expectTable()
	wl.check([]string{"payment"}, fmt.Sprintf("across a PostgreSQL restart, %d shards", shards))
	if strings.Contains(s.logText(), "stopped with an error") {
		t.Fatalf("the streamer stopped: %s", stoppedWith(s))
	}
	s.stop()
}

// TestShardsRefused: on PostgreSQL 14 --shards is refused naming the
// version; on 15+, a start with another number of shards than the server
// holds (or none) is refused naming the procedure, and leaves the shards'
// slots as they were.
func TestShardsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if major := e.serverMajor(); major < 15 {
		s := e.start("--shards", "2")
		if err := s.exited(time.Minute); err == nil {
			t.Fatal("--shards 2 on PostgreSQL 14 started")
		}
		if line := stoppedWith(s); !strings.Contains(line, fmt.Sprintf("the server is PostgreSQL %d", major)) || !strings.Contains(line, "--shards 1") {
			t.Fatalf("refusal: %s", line)
		}
		return
	}
	s := e.start("--shards", fmt.Sprint(shards))
	e.waitShardsStreaming(shards)
	s.stop()
	for _, k := range []string{"2", "1"} {
		other := e.start("--shards", k)
		if err := other.exited(time.Minute); err == nil {
			t.Fatalf("--shards %s started beside %d shards", k, shards)
		}
		line := stoppedWith(other)
		if !strings.Contains(line, "split otherwise") || !strings.Contains(line, e.shardSlots(shards)[0]) || !strings.Contains(line, "docs/sharding.md") {
			t.Fatalf("--shards %s: %s", k, line)
		}
	}
	var n int
	if err := e.pool.QueryRow(testenv.Context(t), `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1 || '%'`, e.slot).Scan(&n); err != nil || n != shards {
		t.Fatalf("%d slots of the stream after the refusals (%v), want the %d shards' only", n, err, shards)
	}
	// An aggregate id that hashtext cannot take in a row filter.
	testenv.Exec(t, e.url, `CREATE TABLE uuid_outbox (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id uuid NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	u := e.start("--shards", "2", "--table", "uuid_outbox", "--slot", e.slot+"_uuid", "--publication", "uuid_outbox")
	if err := u.exited(time.Minute); err == nil {
		t.Fatal("--shards 2 started on an outbox whose aggregate id is a uuid")
	}
	if line := stoppedWith(u); !strings.Contains(line, `the aggregate id column \"aggregate_id\" of public.uuid_outbox is uuid`) || !strings.Contains(line, "--column-aggregate-id") {
		t.Fatalf("refusal of a uuid aggregate id: %s", line)
	}
}

// TestShardsStandby: a second instance of a stream of 4 shards waits for
// the first and holds none of its shards meanwhile, even while they are
// free for a moment; when the first stops it takes all 4, and every event
// arrives.
func TestShardsStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	ctx := testenv.Context(t)
	flags := []string{"--shards", fmt.Sprint(shards)}
	active := e.start(flags...)
	e.waitShardsStreaming(shards)
	standby := e.start(flags...)
	eventually(t, 30*time.Second, "the standby to wait for the shards", func() bool {
		return strings.Contains(standby.logText(), "another process holds the stream's shards")
	})
	wl := newWorkload(e)
	wl.writeConcurrently(t, ctx, 200, 1, 10)()
	wl.check([]string{"payment"}, "before the takeover")
	if strings.Contains(standby.logText(), "holds the stream's shards") && !strings.Contains(standby.logText(), "another process holds") ||
		strings.Count(standby.logText(), `"msg":"starting"`) > 0 {
		t.Fatalf("the standby took shards while the active instance held them:\n%s", standby.logText())
	}
	active.stop()
	e.waitShardsStreaming(shards)
	standby.waitShardsStarted()
	wl.writeConcurrently(t, ctx, 200, 1, 10)()
	wl.check([]string{"payment"}, "after the takeover")
	standby.stop()
}

// TestShardsChangeCount: the procedure of docs/sharding.md that changes
// the number of shards from 2 to 4 under writers, with nothing lost: the
// new shards' publications and slots are created while the old shards
// stream, the old ones stop once each has confirmed past the new slots'
// start, their slots are dropped, and the new shards start. What committed
// in between is published by both (duplicates, which consumers skip by
// event id); nothing is missing, per-aggregate order holds.
func TestShardsChangeCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	ctx, stop := context.WithCancel(testenv.Context(t))
	defer stop()
	old := e.start("--shards", "2")
	e.waitShardsStreaming(2)
	wl := newWorkload(e)
	writing := make(chan error, 2)
	for w := range 2 {
		go func() {
			for ctx.Err() == nil {
				if err := wl.write(ctx, w, 20, 1+w*4, "payment", false); err != nil && ctx.Err() == nil {
					writing <- err
					return
				}
			}
			writing <- nil
		}()
	}
	wl.progress(t, 200)

	// 1. The new shards' publications, then their slots, while the old
	// shards stream (docs/sharding.md gives these statements).
	for i := range 4 {
		testenv.Exec(t, e.url, fmt.Sprintf(`CREATE PUBLICATION cdc_outbox_shard_%d_of_4 FOR TABLE outbox
			WHERE ((hashtext(aggregate_id) & 2147483647) %% 4 = %d) WITH (publish = 'insert')`, i, i))
	}
	for _, slot := range e.shardSlots(4) {
		testenv.Exec(t, e.url, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	}
	wl.progress(t, 200)
	// 2. Every old shard confirmed past the newest new slot's start.
	eventually(t, time.Minute, "the old shards to confirm past the new slots' start", func() bool {
		var past bool
		err := e.pool.QueryRow(ctx, `SELECT bool_and(confirmed_flush_lsn >= (SELECT max(confirmed_flush_lsn) FROM pg_replication_slots WHERE slot_name = ANY($2)))
			FROM pg_replication_slots WHERE slot_name = ANY($1)`, e.shardSlots(2), e.shardSlots(4)).Scan(&past)
		return err == nil && past
	})
	// 3. Stop the old shards, drop their slots.
	old.stop()
	for _, slot := range e.shardSlots(2) {
		testenv.WaitSlotInactive(t, e.url, slot)
		testenv.Exec(t, e.url, `SELECT pg_drop_replication_slot($1)`, slot)
	}
	// 4. Start the new count.
	s := e.start("--shards", "4")
	e.waitShardsStreaming(4)
	wl.progress(t, 200)
	stop()
	for range 2 {
		if err := <-writing; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	wl.check([]string{"payment"}, "across a change from 2 to 4 shards")
	s.stop()
}

// TestShardsFailover fails a PostgreSQL 17 primary over to its standby
// while writers commit to an outbox of 4 shards: each shard's failover
// slot is synchronized to the standby first, the old primary stopped, the
// standby promoted. Every shard goes on from its synchronized slot on the
// new primary, the holder takes its lock there, and every event arrives.
func TestShardsFailover(t *testing.T) {
	ha := newHAPair(t, 17, false)
	e := newEnvAt(t, ha.writers)
	e.runURL = ha.streamer
	st := e.start("--shards", fmt.Sprint(shards), "--slot-poll-interval", "1s")
	e.waitShardsStreaming(shards)
	wl := newWorkload(e)
	w := startWriters(wl)
	w.waitMore(300)
	for _, slot := range e.shardSlots(shards) {
		testenv.WaitSlotSynced(t, ha.standby.URL, slot, slotConfirmed(t, ha.primary.URL, slot))
	}
	ha.primary.Control("stop")
	ha.standby.Control("promote")
	e.waitShardsStreaming(shards) // the pool now reaches the new primary
	w.waitMore(300)
	w.stop()
	wl.expectTable()
	wl.check([]string{"payment"}, fmt.Sprintf("after failing over PostgreSQL 17 under %d shards", shards))
	if st.cmd.ProcessState != nil {
		t.Fatal("the streamer exited during the failover")
	}
	if log := st.logText(); !strings.Contains(log, "holds the lock of the stream's shards again") {
		t.Error("the holder did not take its lock again on the new primary")
	}
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 0 {
		t.Errorf("cdc_outbox_history_epoch = %v after a failover that lost nothing, want 0", n)
	}
	st.stop()
}

// TestShardsPatternNewTenant: an outbox pattern split in 2 shards, run as
// a superuser, which installs the membership trigger and registers the
// pattern with each shard's row filter: a tenant created under load (its
// first rows in its creating transaction) joins both shards' publications
// with their filters, and every event arrives once, per-aggregate order
// intact. A tenant whose aggregate id is a uuid cannot join (a warning to
// its session): its creation still succeeds.
func TestShardsPatternNewTenant(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	testenv.Exec(t, e.url, `DROP TABLE public.outbox`)
	ts := newTenants(e)
	tables := ts.create("st_", 2)
	s := e.start(e.manyArgs("st_*.outbox", "--shards", "2", "--slot-poll-interval", "1s")...)
	e.waitShardsStreaming(2)
	ctx := testenv.Context(t)
	wait := ts.writeAll(ctx, tables, 300, 5)

	const newTable = "st_new.outbox"
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA st_new; `+tenantOutbox(newTable)); err != nil {
		t.Fatal(err)
	}
	var first []tenantEvent
	for i := range 10 {
		var id int64
		agg := fmt.Sprintf("%s-a%d", newTable, i%3)
		if err := tx.QueryRow(ctx, `INSERT INTO `+newTable+` (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, 'PaymentCreated', $2) RETURNING id`,
			agg, fmt.Sprintf(`{"seq": %d}`, i/3+1)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		first = append(first, tenantEvent{table: newTable, id: fmt.Sprint(id), aggregate: agg, seq: i/3 + 1})
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ts.mu.Lock()
	ts.events = append(ts.events, first...)
	ts.mu.Unlock()
	testenv.Exec(t, e.url, `CREATE SCHEMA st_uuid; CREATE TABLE st_uuid.outbox (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id uuid NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	wait()
	v := ts.verify(e.topic("payment"), ts.sources(append(tables, newTable)), 3*time.Minute)
	t.Logf("verifier, a pattern in 2 shards with a tenant created under load: %s", v)
	if v.missing != 0 || v.duplicates != 0 || v.orderViolations != 0 || v.unknown != 0 || v.tables != 3 {
		t.Fatalf("verifier: %s; missing: %v", v, v.missingIDs)
	}
	var filtered int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'st_new' AND rowfilter LIKE '%hashtext(aggregate_id)%'`).Scan(&filtered); err != nil || filtered != 2 {
		t.Fatalf("the new tenant is in %d shards' publications with a filter (%v), want 2", filtered, err)
	}
	s.stop()
}

// TestShardsFirstStartUnderWriters: the first start of 4 shards while a
// writer commits and transactions stay open in the cluster, so that the
// first slot's creation waits for them: every event committed after the
// first slot's position reaches Kafka, whichever shard its aggregate is
// of. (Slots created one after the other, each waiting in turn, missed
// what the later shards' aggregates committed in between.)
func TestShardsFirstStartUnderWriters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	ctx, stop := context.WithCancel(testenv.Context(t))
	defer stop()
	// Transactions that stay open, one beginning before the other ends:
	// a slot's creation waits until those running when it began end.
	holding := make(chan error, 2)
	for h := range 2 {
		go func() {
			conn, err := e.pool.Acquire(ctx)
			if err != nil {
				holding <- err
				return
			}
			defer conn.Release()
			for i := 0; ctx.Err() == nil; i++ {
				if i == 0 && h == 1 {
					_, _ = conn.Exec(ctx, `SELECT pg_sleep(0.4)`) // staggered: one is open at any moment
				}
				if _, err := conn.Exec(ctx, `BEGIN; SELECT txid_current(); SELECT pg_sleep(0.8); COMMIT`); err != nil && ctx.Err() == nil {
					holding <- err
					return
				}
			}
			holding <- nil
		}()
	}
	// The writer: each event with the WAL position before it began.
	type written struct {
		id     string
		before int64
	}
	var mu sync.Mutex
	var events []written
	writing := make(chan error, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			var w written
			err := e.pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&w.before)
			if err == nil {
				err = e.pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('payment', $1, 'PaymentCreated', '{}') RETURNING id::text`, fmt.Sprintf("agg-%d", i%97)).Scan(&w.id)
			}
			if err != nil {
				if ctx.Err() == nil {
					writing <- err
				}
				close(writing)
				return
			}
			mu.Lock()
			events = append(events, w)
			mu.Unlock()
		}
		close(writing)
	}()
	eventually(t, time.Minute, "the writer to commit", func() bool { mu.Lock(); defer mu.Unlock(); return len(events) > 100 })
	s := e.start("--shards", fmt.Sprint(shards))
	e.waitShardsStreaming(shards)
	// Where each shard's stream starts (its slot's position when made):
	// every event that began after the first of them must reach Kafka.
	first := int64(-1)
	for _, m := range regexp.MustCompile(`"msg":"starting".*"start_lsn":([0-9]+)`).FindAllStringSubmatch(s.logText(), -1) {
		lsn, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 || lsn < first {
			first = lsn
		}
	}
	if first < 0 {
		t.Fatalf("no start_lsn in the streamer's log:\n%s", s.logText())
	}
	eventually(t, time.Minute, "the writer to commit past the start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) > 0 && events[len(events)-1].before > first+100_000
	})
	stop()
	for range 2 {
		if err := <-holding; err != nil {
			t.Fatalf("an open transaction: %v", err)
		}
	}
	if err := <-writing; err != nil {
		t.Fatalf("writer: %v", err)
	}
	want := map[string]bool{}
	for _, w := range events {
		if w.before >= first {
			want[w.id] = true
		}
	}
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(e.topic("payment")), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := map[string]bool{}
	missing := func() (n int) {
		for id := range want {
			if !got[id] {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(time.Minute); missing() > 0 && time.Now().Before(deadline); {
		pctx, cancel := context.WithTimeout(testenv.Context(t), time.Second)
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got[header(r, "id")] = true })
		cancel()
	}
	if n := missing(); n > 0 {
		t.Fatalf("%d of the %d events committed after the first shard's slot was made are not in Kafka after a minute", n, len(want))
	}
	t.Logf("%d events after the first slot's position, all in Kafka; %d written in all", len(want), len(events))
	s.stop()
}

// TestShardsPartitionedOutbox: 2 shards of a partitioned outbox, its
// publications made with publish_via_partition_root by cdc-outbox, while a
// partition is added under load (the root's row filter applies to every
// partition, the new one too): nothing missing, order holds.
func TestShardsPartitionedOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	e.partitionedOutbox()
	s := e.start("--shards", "2")
	e.waitShardsStreaming(2)
	for _, sh := range []string{"cdc_outbox_shard_0_of_2", "cdc_outbox_shard_1_of_2"} {
		if !e.pubViaRoot(sh) {
			t.Fatalf("publication %s of a partitioned outbox without publish_via_partition_root", sh)
		}
	}
	ctx := testenv.Context(t)
	wl := newWorkload(e)
	stop := wl.steady(ctx, 5*time.Millisecond)
	defer stop()
	wl.progress(t, 200)
	testenv.Exec(t, e.url, `CREATE TABLE outbox_2 PARTITION OF outbox FOR VALUES IN (2)`)
	e.setBucket(2)
	wl.progress(t, 200)
	stop()
	wl.check([]string{"payment"}, "2 shards of a partitioned outbox, a partition added under load")
	s.stop()
}

// TestShardsQuotedNames: 2 shards of an outbox whose schema, table,
// aggregate id column and publication need quoting (capitals, spaces):
// the shards' publications, row filters and slots are made and streamed,
// nothing missing, order holds.
func TestShardsQuotedNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	needsRowFilters(t, e)
	const table = `"Billing"."Outbox Events"`
	testenv.Exec(t, e.url, `CREATE SCHEMA "Billing";
		CREATE TABLE `+table+` (LIKE public.outbox INCLUDING ALL);
		ALTER TABLE `+table+` RENAME COLUMN aggregate_id TO "Agg Id"`)
	s := e.start("--shards", "2", "--table", table, "--publication", "Billing Events", "--column-aggregate-id", "Agg Id")
	e.waitShardsStreaming(2)
	wl := newWorkload(e)
	wl.insert = strings.Replace(strings.Replace(insertEvent, "outbox", table, 1), "aggregate_id", `"Agg Id"`, 1)
	ctx := testenv.Context(t)
	for w := range 2 {
		if err := wl.write(ctx, w, 100, 5, "payment", false); err != nil {
			t.Fatal(err)
		}
	}
	wl.check([]string{"payment"}, "2 shards of "+table)
	s.stop()
}
