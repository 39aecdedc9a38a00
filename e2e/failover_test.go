package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// haPair is a primary and a streaming standby of the test's own, of one
// PostgreSQL major, configured for failover slots as docs/operating.md says:
// the standby replicates through a physical slot with hot_standby_feedback
// and (17+) sync_replication_slots; the primary (17+) names that slot in
// synchronized_standby_slots.
type haPair struct {
	primary, standby *testenv.PostgresCluster
	// writers is a multi-host URL with target_session_attrs=primary, as a
	// service would use; streamer lists the standby first and leaves
	// target_session_attrs out: cdc-outbox must find the primary itself.
	writers, streamer string
}

const standbySlot = "standby_1"

// newHAPair starts the pair. syncCommit makes the standby synchronous, so
// that a commit a writer saw succeed is on the standby even when the
// primary is SIGKILLed right after: the test then counts on every
// acknowledged commit surviving the failover.
func newHAPair(t *testing.T, major int, syncCommit bool) *haPair {
	t.Helper()
	p := testenv.Cluster(t, testenv.ClusterOptions{Major: major})
	s := p.Standby(standbySlot, testenv.ClusterOptions{})
	var settings []string
	if major >= 17 {
		settings = append(settings, "synchronized_standby_slots = '"+standbySlot+"'")
	}
	if syncCommit {
		settings = append(settings, "synchronous_standby_names = '*'")
	}
	for _, set := range settings {
		testenv.Exec(t, p.URL, "ALTER SYSTEM SET "+set)
	}
	testenv.Exec(t, p.URL, "SELECT pg_reload_conf()")
	hp, sp := hostPort(t, p.URL), hostPort(t, s.URL)
	return &haPair{
		primary: p, standby: s,
		writers:  fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=primary", hp, sp),
		streamer: fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable", sp, hp),
	}
}

func hostPort(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// writers runs two writers that commit one event per transaction until
// stop is called, retrying through the failover (writeThroughFaults), at a
// few hundred events a second: enough to be writing whenever the failover
// happens, few enough to verify quickly.
type writers struct {
	wl     *workload
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startWriters(wl *workload) *writers {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writers{wl: wl, cancel: cancel}
	for i := range 2 {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for ctx.Err() == nil {
				// Ends when cancelled; the error then is the cancellation.
				_ = wl.writeThroughFaults(ctx, i, 10, 1, "payment")
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond): // pacing, not waiting for anything
				}
			}
		}()
	}
	wl.e.t.Cleanup(w.stop)
	return w
}

func (w *writers) stop() { w.cancel(); w.wg.Wait() }

func (w *writers) count() int {
	w.wl.mu.Lock()
	defer w.wl.mu.Unlock()
	return len(w.wl.events)
}

// waitMore waits until the writers committed n more events.
func (w *writers) waitMore(n int) {
	t := w.wl.e.t
	t.Helper()
	want := w.count() + n
	eventually(t, 2*time.Minute, fmt.Sprintf("%d events written", want), func() bool { return w.count() >= want })
}

// expectTable adds to the workload every row of the outbox on the (new)
// primary it has not recorded: the truth after a failover is what the
// promoted server holds. (A writer cancelled during COMMIT records
// nothing, though its row may exist.)
func (wl *workload) expectTable() {
	t := wl.e.t
	t.Helper()
	rows, _ := wl.e.pool.Query(testenv.Context(t), `SELECT id::text, aggregate_id, coalesce((payload->>'seq')::int, 0) FROM outbox`)
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (written, error) {
		var ev written
		err := row.Scan(&ev.id, &ev.aggregate, &ev.seq)
		return ev, err
	})
	if err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	wl.mu.Lock()
	defer wl.mu.Unlock()
	known := map[string]bool{}
	for _, ev := range wl.events {
		known[ev.id] = true
	}
	for _, ev := range all {
		if !known[ev.id] {
			wl.events = append(wl.events, ev)
		}
	}
}

// slotConfirmed is the slot's confirmed_flush_lsn on the server at url.
func slotConfirmed(t *testing.T, url, slot string) string {
	t.Helper()
	var lsn string
	conn := testenv.Connect(t, url)
	if err := conn.QueryRow(testenv.Context(t), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn); err != nil {
		t.Fatalf("read slot %s: %v", slot, err)
	}
	return lsn
}

// TestFailover fails a primary over to its standby while writers commit,
// on each major with failover slots: the old primary stopped, the standby
// promoted. cdc-outbox, given both hosts, finds the new primary and goes
// on from the synchronized slot: every event delivered. On 17 cdc-outbox
// creates the slot; on 18 it finds one made by hand without failover and
// switches it.
func TestFailover(t *testing.T) {
	for _, major := range []int{17, 18} {
		t.Run(strconv.Itoa(major), func(t *testing.T) { failover(t, major, false) })
	}
}

// TestFailoverPrimaryKilled is TestFailover with the old primary
// SIGKILLed: no shutdown that hands the standby the last WAL. The standby
// is synchronous, so the writers' acknowledged commits survive, and
// synchronized_standby_slots kept the walsender from sending cdc-outbox
// anything the standby lacked.
func TestFailoverPrimaryKilled(t *testing.T) { failover(t, 17, true) }

func failover(t *testing.T, major int, kill bool) {
	ha := newHAPair(t, major, kill)
	e := newEnvAt(t, ha.writers)
	e.runURL = ha.streamer
	if major == 18 {
		testenv.Exec(t, ha.primary.URL, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot)
	}
	st := e.start("--slot-poll-interval", "1s")
	e.waitStreaming()
	var failoverSlot bool
	if err := e.pool.QueryRow(testenv.Context(t), `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&failoverSlot); err != nil || !failoverSlot {
		t.Fatalf("the slot cdc-outbox created is not a failover slot (failover=%v, %v)", failoverSlot, err)
	}

	wl := newWorkload(e)
	w := startWriters(wl)
	w.waitMore(300)
	// The standby must hold the slot, persisted, before the failover: a
	// promotion drops a synchronized slot that is still temporary.
	testenv.WaitSlotSynced(t, ha.standby.URL, e.slot, slotConfirmed(t, ha.primary.URL, e.slot))
	// status shows it, on either server.
	for _, c := range []struct {
		server, url string
		want        map[string]any
	}{
		{"primary", ha.primary.URL, map[string]any{"failover": true, "synced": false, "server_in_recovery": false,
			"synchronized_standby_slots": standbySlot, "standbys_streaming": true, "warnings": []any{}}},
		{"standby", ha.standby.URL, map[string]any{"failover": true, "synced": true, "server_in_recovery": true}},
	} {
		out, _ := exec.Command(binary, "status", "--json", "--postgres-url", c.url, "--slot", e.slot).Output()
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("status --json on the %s: %v\n%s", c.server, err, out)
		}
		for k, v := range c.want {
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("status on the %s: %s is %v, want %v\n%s", c.server, k, got[k], v, out)
			}
		}
	}

	began := time.Now()
	if kill {
		ha.primary.Control("kill")
	} else {
		ha.primary.Control("stop")
	}
	ha.standby.Control("promote")
	promoted := time.Now()
	e.waitStreaming() // the pool now reaches the new primary
	t.Logf("old primary %s and standby promoted in %s; cdc-outbox streaming from the new primary %s after the promotion",
		map[bool]string{true: "SIGKILLed", false: "stopped"}[kill], promoted.Sub(began).Round(time.Millisecond), time.Since(promoted).Round(time.Millisecond))
	w.waitMore(300)
	w.stop()
	wl.expectTable()
	wl.check([]string{"payment"}, fmt.Sprintf("after failing over PostgreSQL %d (primary %s)", major, map[bool]string{true: "SIGKILLed", false: "stopped"}[kill]))
	if st.cmd.ProcessState != nil {
		t.Fatal("the streamer exited during the failover")
	}
	if log := st.logText(); !strings.Contains(log, "PostgreSQL failed over") {
		t.Error("the streamer's log does not say that PostgreSQL failed over")
	}
	// Nothing was lost, so no history epoch began: every event keeps the
	// outbox's one source.
	if n := metricValue(t, st, "cdc_outbox_history_epoch"); n != 0 {
		t.Errorf("cdc_outbox_history_epoch = %v after a failover that lost nothing, want 0", n)
	}
	sources := map[string]int{}
	for _, r := range readSourced(t, e.topic("payment"), false) {
		sources[r.source]++
	}
	if len(sources) != 1 {
		t.Errorf("the events carry %d sources after a failover that lost nothing, want one: %v", len(sources), sources)
	}
	st.stop()
}

// TestFailoverBefore17 is the same failover on PostgreSQL 16, which has no
// failover slots: the promoted standby has no slot, and cdc-outbox stops
// with an error that says so and how to recover, instead of creating a new
// slot that would skip what was committed since. The recovery it names
// restores a complete stream: start with --recreate-slot, then republish
// after the last id up to which Kafka has every event.
func TestFailoverBefore17(t *testing.T) {
	ha := newHAPair(t, 16, false)
	e := newEnvAt(t, ha.writers)
	e.runURL = ha.streamer
	st := e.start()
	e.waitStreaming()
	wl := newWorkload(e)
	w := startWriters(wl)
	w.waitMore(300)

	ha.primary.Control("stop")
	ha.standby.Control("promote")
	if err := st.exited(2 * time.Minute); err == nil {
		t.Fatal("the streamer exited 0 after the failover lost its slot")
	}
	log := st.logText()
	for _, want := range []string{"does not exist on the new primary", "--recreate-slot", "cdc-outbox republish --after-id"} {
		if !strings.Contains(log, want) {
			st.dump()
			t.Fatalf("the streamer's error does not say %q", want)
		}
	}
	w.waitMore(200) // writers go on against the new primary meanwhile

	// The last id up to which Kafka has every event: ids are not committed
	// in their order, so the highest id in Kafka may have a lower one
	// missing before it.
	_, got := wl.verify([]string{"payment"}, 10*time.Second)
	wl.mu.Lock()
	var ids []int64
	for _, ev := range wl.events {
		id, _ := strconv.ParseInt(ev.id, 10, 64)
		ids = append(ids, id)
	}
	wl.mu.Unlock()
	slices.Sort(ids)
	var after int64
	for _, id := range ids {
		if len(got[strconv.FormatInt(id, 10)]) == 0 {
			break
		}
		after = id
	}
	t.Logf("Kafka has every event up to id %d (of %d written so far)", after, len(ids))

	st = e.start("--recreate-slot")
	e.waitStreaming()
	out := e.republish("--after-id", strconv.FormatInt(after, 10))
	t.Logf("republish: %s", lastLine(out))
	w.waitMore(200)
	w.stop()
	wl.expectTable()
	// Order is not checked: the new slot streams what writers commit while
	// republish still sends older events of the same aggregates, so their
	// first deliveries interleave. docs/operating.md says so.
	v, _ := wl.verify([]string{"payment"}, 3*time.Minute)
	t.Logf("verifier after failing over PostgreSQL 16, --recreate-slot and republish: %s", v)
	if v.missing != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
	st.stop()
}
