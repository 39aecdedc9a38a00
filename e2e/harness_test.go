// Package e2e runs the real cdc-outbox binary against the real PostgreSQL
// and Kafka of the test environment and checks what arrives in Kafka.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

var binary string

// TestMain builds the binary once; every test runs it as a subprocess, the
// way users run it.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cdc-outbox-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "cdc-outbox")
	build := exec.Command("go", "build", "-o", binary, "../cmd/cdc-outbox")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build cdc-outbox:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's isolated world: its own database with the default
// outbox table, slot, and topic prefix.
type env struct {
	t   *testing.T
	url string // a superuser's: setup, workloads, checks
	// runURL is what the streamer connects with: url, unless the test runs
	// it as another role.
	runURL  string
	slot    string
	prefix  string
	brokers []string
	pool    *pgxpool.Pool
	// stream is the stream's identity (replication.StreamIdentity) once
	// read: it outlives the server it was read on (a promoted standby or
	// a restored backup has the same one).
	stream string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvAt(t, testenv.Database(t))
}

// newEnvAt is newEnv in the database at url, a superuser's URL: on a
// cluster of the test's own (testenv.Cluster), its postgres database.
func newEnvAt(t *testing.T, url string) *env {
	t.Helper()
	e := &env{
		t:       t,
		url:     url,
		runURL:  url,
		slot:    testenv.Name("slot"),
		prefix:  testenv.Name("e2e"),
		brokers: testenv.KafkaBrokers(t),
	}
	sql, err := os.ReadFile("../sql/publication.sql")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.url, string(sql))
	e.pool, err = pgxpool.New(testenv.Context(t), e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	return e
}

// walSenderTimeout sets the server's wal_sender_timeout (a duration such
// as "2s") for the streamer's connections only.
func (e *env) walSenderTimeout(d string) { e.runURL += "&options=-c%20wal_sender_timeout%3D" + d }

// topic is the topic of an aggregate type under this test's template.
func (e *env) topic(aggregateType string) string { return e.prefix + "." + aggregateType }

// args are the streamer flags for this environment, then extra.
func (e *env) args(extra ...string) []string {
	return append([]string{"run",
		"--postgres-url", e.runURL,
		"--kafka-brokers", e.brokers[0],
		"--slot", e.slot,
		"--topic", e.prefix + ".{aggregate_type}",
		"--status-interval", "100ms",
		"--http-addr", "127.0.0.1:0",
		"--log-format", "json",
	}, extra...)
}

// streamer is a running cdc-outbox process.
type streamer struct {
	t    *testing.T
	cmd  *exec.Cmd
	log  string
	done chan error
	// waited is set once Wait has returned: the cleanup reads it instead of
	// cmd.ProcessState, which Wait writes on its own goroutine.
	waited atomic.Bool
}

func (e *env) start(extra ...string) *streamer {
	e.t.Helper()
	return e.startEnv(nil, extra...)
}

// startEnv is start with environment variables (KEY=value) added to the
// test's own.
func (e *env) startEnv(environ []string, extra ...string) *streamer {
	e.t.Helper()
	log, err := os.CreateTemp(e.t.TempDir(), "streamer-*.log")
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(binary, e.args(extra...)...)
	if environ != nil {
		cmd.Env = append(os.Environ(), environ...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	s := &streamer{t: e.t, cmd: cmd, log: log.Name(), done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		s.waited.Store(true)
		s.done <- err
		log.Close()
	}()
	e.t.Cleanup(func() {
		if !s.waited.Load() {
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		if e.t.Failed() {
			s.dump()
		}
	})
	return s
}

// startStandby starts a second instance on the slot of a streaming one
// and waits until it reports the slot in use: a hot standby, waiting.
func (e *env) startStandby(extra ...string) *streamer {
	e.t.Helper()
	standby := e.start(extra...)
	eventually(e.t, 30*time.Second, "the standby to report the slot in use", func() bool {
		return strings.Contains(standby.logText(), "in use by another process")
	})
	return standby
}

// waitStreaming waits until a walsender streams from the streamer's slot:
// events committed before the slot reached its consistent point are not in
// its stream, so workloads start after. (The slot alone is not enough: it is
// already active while pg_create_logical_replication_slot waits for that
// point.)
func (e *env) waitStreaming() {
	e.t.Helper()
	eventually(e.t, 60*time.Second, "the streamer to stream from its slot", func() bool {
		var streaming bool
		err := e.pool.QueryRow(testenv.Context(e.t), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)`, e.slot).Scan(&streaming)
		return err == nil && streaming
	})
}

func (s *streamer) dump() {
	b, _ := os.ReadFile(s.log)
	if len(b) > 20000 {
		b = b[len(b)-20000:]
	}
	s.t.Logf("streamer log (%s):\n%s", s.log, b)
}

// kill SIGKILLs the process: no drain, no final status update.
func (s *streamer) kill() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
}

// stop sends SIGTERM and expects a clean exit.
func (s *streamer) stop() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			s.dump()
			s.t.Fatalf("streamer exited with %v after SIGTERM", err)
		}
	case <-time.After(60 * time.Second):
		s.t.Fatal("streamer did not stop within 60s of SIGTERM")
	}
}

// exited waits for the process to end on its own and returns its error.
func (s *streamer) exited(timeout time.Duration) error {
	s.t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(timeout):
		s.dump()
		s.t.Fatalf("streamer still running after %s", timeout)
		return nil
	}
}

// httpAddr is the address the streamer's HTTP endpoint listens on, from its
// log (json or text).
func (s *streamer) httpAddr() string {
	s.t.Helper()
	var addr string
	eventually(s.t, 30*time.Second, "the HTTP endpoint", func() bool {
		m := httpAddrLine.FindStringSubmatch(s.logText())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

var httpAddrLine = regexp.MustCompile(`(?:"msg":"serving /metrics, /healthz and /readyz","addr":"|msg="serving /metrics, /healthz and /readyz" addr=)([^"\s]+)`)

func (s *streamer) logText() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// written is one event the workload committed.
type written struct {
	id        string
	aggregate string
	seq       int
}

// workload writes outbox events from concurrent writers, each owning its
// aggregates, numbering each aggregate's events 1, 2, 3... so the verifier
// can check order.
type workload struct {
	e  *env
	mu sync.Mutex
	// events are the committed events, in no particular order.
	events []written
	seq    map[string]int
	// insert is the statement writing one event, as the service writes it.
	insert string
}

const insertEvent = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
	VALUES ($1, $2, 'PaymentCreated', $3, $4) RETURNING id`

func newWorkload(e *env) *workload {
	return &workload{e: e, seq: map[string]int{}, insert: insertEvent}
}

// writeConcurrently starts one writer per entry of txSizes (writer w
// writes n payment events in transactions of txSizes[w] rows) and returns
// the wait for them all, which fails the test on a writer's error.
func (wl *workload) writeConcurrently(t *testing.T, ctx context.Context, n int, txSizes ...int) (wait func()) {
	writing := make(chan error, len(txSizes))
	for w, size := range txSizes {
		go func() { writing <- wl.write(ctx, w, n, size, "payment", false) }()
	}
	return func() {
		t.Helper()
		for range txSizes {
			if err := <-writing; err != nil {
				t.Fatalf("writer: %v", err)
			}
		}
	}
}

// write commits n events of aggregate type typ from writer w, in
// transactions of txSize rows; deleteAfter also deletes each transaction's
// rows before committing (the insert-then-delete pattern).
func (wl *workload) write(ctx context.Context, w, n, txSize int, typ string, deleteAfter bool) error {
	return wl.run(ctx, w, n, txSize, typ, deleteAfter, false)
}

// writeThroughFaults is write for writers that keep going while the server
// restarts or crashes: a failed transaction is retried, and a commit whose
// outcome is unknown (the connection died during COMMIT) is settled by
// looking for its rows once the server is back.
func (wl *workload) writeThroughFaults(ctx context.Context, w, n, txSize int, typ string) error {
	return wl.run(ctx, w, n, txSize, typ, false, true)
}

// planned is an event before it is written: its aggregate and sequence are
// fixed, so a retried transaction writes the same events in the same order.
type planned struct {
	aggregate string
	seq       int
}

func (wl *workload) run(ctx context.Context, w, n, txSize int, typ string, deleteAfter, tolerant bool) error {
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	for done := 0; done < n; {
		var plan []planned
		for i := 0; i < txSize && done < n; i, done = i+1, done+1 {
			agg := fmt.Sprintf("w%d-a%d", w, rng.IntN(10))
			wl.mu.Lock()
			wl.seq[agg]++
			plan = append(plan, planned{agg, wl.seq[agg]})
			wl.mu.Unlock()
		}
		for attempt := 1; ; attempt++ {
			batch, committed, err := wl.attempt(ctx, w, plan, typ, deleteAfter)
			if err == nil || (tolerant && committed) {
				wl.mu.Lock()
				wl.events = append(wl.events, batch...)
				wl.mu.Unlock()
				break
			}
			if !tolerant || ctx.Err() != nil || attempt > 600 {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// attempt writes one planned transaction. When COMMIT fails it reports
// whether the rows exist anyway (tolerant writers ask the server, retrying
// until it answers).
func (wl *workload) attempt(ctx context.Context, w int, plan []planned, typ string, deleteAfter bool) (batch []written, committed bool, err error) {
	tx, err := wl.e.pool.Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	ids := make([]int64, 0, len(plan))
	for _, p := range plan {
		payload := fmt.Sprintf(`{"aggregate": %q, "seq": %d, "note": "caf\u00e9 \ud83d\udcb3"}`, p.aggregate, p.seq)
		var id int64
		err := tx.QueryRow(ctx, wl.insert,
			typ, p.aggregate, payload, fmt.Sprintf(`{"traceparent": "00-%032x-%016x-01", "writer": %d}`, w, p.seq, w)).Scan(&id)
		if err != nil {
			_ = tx.Rollback(ctx)
			return nil, false, err
		}
		ids = append(ids, id)
		batch = append(batch, written{id: strconv.FormatInt(id, 10), aggregate: p.aggregate, seq: p.seq})
	}
	if deleteAfter {
		if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE aggregate_type = $1`, typ); err != nil {
			_ = tx.Rollback(ctx)
			return nil, false, err
		}
	}
	if err = tx.Commit(ctx); err == nil {
		return batch, true, nil
	}
	if deleteAfter {
		return nil, false, err // its rows are gone either way: unknowable
	}
	for i := 0; i < 600 && ctx.Err() == nil; i++ {
		var found int
		if qerr := wl.e.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1)`, ids).Scan(&found); qerr == nil {
			return batch, found == len(ids), err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, false, err
}

// delivered is one record read back from Kafka.
type delivered struct {
	rec *kgo.Record
	id  string
	seq int
}

// verdict is what the verifier found.
type verdict struct {
	expected, missing, duplicates, orderViolations int
	missingIDs                                     []string
}

func (v verdict) String() string {
	return fmt.Sprintf("expected=%d missing=%d duplicates=%d order_violations=%d", v.expected, v.missing, v.duplicates, v.orderViolations)
}

// verify consumes the topics of the given aggregate types until every
// written event has arrived or timeout, and checks per-aggregate order of
// first deliveries. It returns everything delivered, by event id. opts are
// added to the consumer's (kgo.FetchIsolationLevel for read_committed).
func (wl *workload) verify(types []string, timeout time.Duration, opts ...kgo.Opt) (verdict, map[string][]delivered) {
	t := wl.e.t
	t.Helper()
	wl.mu.Lock()
	want := map[string]written{}
	for _, ev := range wl.events {
		want[ev.id] = ev
	}
	wl.mu.Unlock()

	var topics []string
	for _, typ := range types {
		topics = append(topics, wl.e.topic(typ))
	}
	cl := testenv.KafkaClient(t, append([]kgo.Opt{kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AllowAutoTopicCreation(), kgo.MetadataMinAge(250 * time.Millisecond)}, opts...)...)
	got := map[string][]delivered{}
	lastSeq := map[string]int{}
	v := verdict{expected: len(want)}
	seen := 0
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for seen < len(want) && ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) {
			id := header(r, "id")
			var body struct{ Seq int }
			value := r.Value
			if len(value) > 5 && value[0] == 0 {
				value = value[5:] // JSON Schema's: the registry's wire header, then the payload
			}
			_ = json.Unmarshal(value, &body)
			if len(got[id]) == 0 {
				if _, ok := want[id]; ok {
					seen++
				}
				agg := string(r.Key)
				if body.Seq <= lastSeq[agg] {
					v.orderViolations++
				}
				lastSeq[agg] = body.Seq
			} else {
				v.duplicates++
			}
			got[id] = append(got[id], delivered{rec: r, id: id, seq: body.Seq})
		})
	}
	for id := range want {
		if len(got[id]) == 0 {
			v.missing++
			if len(v.missingIDs) < 20 {
				v.missingIDs = append(v.missingIDs, id)
			}
		}
	}
	return v, got
}

// check verifies the topics, logs the verdict and fails on a missing event
// or an order violation.
func (wl *workload) check(types []string, what string) {
	t := wl.e.t
	t.Helper()
	v, _ := wl.verify(types, 3*time.Minute)
	t.Logf("verifier %s: %s", what, v)
	if v.missing != 0 || v.orderViolations != 0 {
		t.Fatalf("verifier: %s; missing ids: %v", v, v.missingIDs)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// slotLSNs returns the slot's confirmed_flush_lsn and the server's current
// WAL position, as byte positions.
func (e *env) slotLSNs() (confirmed, current int64) {
	e.t.Helper()
	err := e.pool.QueryRow(testenv.Context(e.t), `SELECT coalesce(confirmed_flush_lsn - '0/0', 0)::bigint, (pg_current_wal_lsn() - '0/0')::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&confirmed, &current)
	if err != nil {
		e.t.Fatalf("read slot %s: %v", e.slot, err)
	}
	return confirmed, current
}

// waitSlotInactive waits until the walsender of a streamer that stopped
// has released the slot (testenv.WaitSlotInactive): only then is the
// slot's confirmed position final and the slot free to drop.
func (e *env) waitSlotInactive() {
	e.t.Helper()
	testenv.WaitSlotInactive(e.t, e.url, e.slot)
}

// pendingIDs are the ids of the outbox rows the slot streams next, oldest
// first (testenv.PendingInserts): after the streamer stopped on a row, the
// rows it confirmed are not among them and the rows it did not are.
func (e *env) pendingIDs() []string {
	e.t.Helper()
	e.waitSlotInactive()
	var ids []string
	for _, line := range testenv.PendingInserts(e.t, e.url, e.slot, "public.outbox") {
		m := pendingID.FindStringSubmatch(line)
		if m == nil {
			e.t.Fatalf("no id in the pending insert %q", line)
		}
		ids = append(ids, m[1])
	}
	return ids
}

var pendingID = regexp.MustCompile(`^table public\.outbox: INSERT: id\[bigint\]:(\d+) `)

// serverMajor is the test server's major version (14 for 14.23).
func (e *env) serverMajor() int {
	e.t.Helper()
	return testenv.ServerMajor(e.t, e.url)
}

// ids runs a query returning one text column, the test fails on error.
func (e *env) ids(query string) []string {
	e.t.Helper()
	rows, _ := e.pool.Query(testenv.Context(e.t), query)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
	return ids
}

// currentLSN is the server's WAL position now, as a byte position.
func (e *env) currentLSN() int64 {
	e.t.Helper()
	var lsn int64
	if err := e.pool.QueryRow(testenv.Context(e.t), `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&lsn); err != nil {
		e.t.Fatal(err)
	}
	return lsn
}

// prime writes one event and waits until it is in Kafka, so the topic and
// the producer id exist and a fault that follows tests only the fault.
func (wl *workload) prime(ctx context.Context) {
	t := wl.e.t
	t.Helper()
	if err := wl.write(ctx, 0, 1, 1, "payment", false); err != nil {
		t.Fatal(err)
	}
	if v, _ := wl.verify([]string{"payment"}, time.Minute); v.missing != 0 {
		t.Fatalf("before the fault: %s", v)
	}
}

// brokerFault does fault to the shared broker now (stop, kill, pause) and
// undo (start, resume) when the test calls the returned function, or at
// cleanup if it never does, so a failing test does not leave the broker
// down for the rest.
func brokerFault(t *testing.T, fault, undo string) (undoNow func()) {
	t.Helper()
	testenv.ControlKafka(t, fault)
	done := false
	undoNow = func() {
		if !done {
			done = true
			testenv.ControlKafka(t, undo)
		}
	}
	t.Cleanup(undoNow)
	return undoNow
}

// eventually polls cond every 100ms until it holds or timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
