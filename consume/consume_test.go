package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/consume/internal/pgtest"
)

// The test broker: CDC_OUTBOX_TEST_KAFKA_BROKERS, set by `make test` like
// the PostgreSQL of package pgtest.
func kafkaBrokers(t testing.TB) []string {
	return strings.Split(pgtest.Require(t, "CDC_OUTBOX_TEST_KAFKA_BROKERS"), ",")
}

// kafkaClient returns a client of the test broker, closed at cleanup.
func kafkaClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(kafkaBrokers(t)...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// newTopic creates a topic of the test's own, deleted at cleanup.
func newTopic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	name := pgtest.Name(prefix)
	adm := kadm.NewClient(kafkaClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
	return name
}

// counts are the outcomes a Consumer reported to its Hooks.
type counts struct {
	processed, duplicates, failures, deadLettered, commitErrors atomic.Int64
}

func (c *counts) Observe(o Observation) {
	switch o.Outcome {
	case Processed:
		c.processed.Add(1)
	case Duplicate:
		c.duplicates.Add(1)
	case Failed:
		c.failures.Add(1)
	case DeadLettered:
		c.deadLettered.Add(1)
	case CommitFailed:
		c.commitErrors.Add(1)
	}
}

// stats are c's counts (its Config.Hooks, from config).
func stats(c *Consumer) *counts { return c.cfg.Hooks.(*counts) }

// env is one test's database (processed_events + a business table), group
// and topic.
type env struct {
	t     *testing.T
	url   string
	pool  *pgxpool.Pool
	group string
	topic string
}

func setup(t *testing.T, partitions int32) *env {
	t.Helper()
	return setupWith(t, partitions, func(url string) {
		script, err := os.ReadFile("../sql/processed_events.sql")
		if err != nil {
			t.Fatal(err)
		}
		pgtest.Exec(t, url, string(script))
		pgtest.Exec(t, url, string(script)) // safe to run twice
	})
}

// setupWith is setup with the dedupe table made by ddl.
func setupWith(t *testing.T, partitions int32, ddl func(url string)) *env {
	t.Helper()
	url := pgtest.Database(t)
	ddl(url)
	// No unique key on purpose: a duplicate business row must be countable.
	pgtest.Exec(t, url, `CREATE TABLE billing (source text NOT NULL, event_id text NOT NULL, amount bigint NOT NULL)`)
	pool, err := pgxpool.New(pgtest.Context(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &env{t: t, url: url, pool: pool, group: pgtest.Name("grp"), topic: newTopic(t, "consume", partitions)}
}

// event is what a test produces: an outbox record as cdc-outbox sends it.
type event struct {
	id     string // "" for no id header
	key    string
	amount int
	source string // "" for no source header, as from an older streamer
	topic  string // "" for the env's topic
}

func (e event) record(topic string) *kgo.Record {
	if e.topic != "" {
		topic = e.topic
	}
	r := &kgo.Record{
		Topic: topic,
		Key:   []byte(e.key),
		Value: fmt.Appendf(nil, `{"amount": %d}`, e.amount),
		Headers: []kgo.RecordHeader{
			{Key: "event_type", Value: []byte("PaymentCreated")},
			{Key: "aggregate_type", Value: []byte("payment")},
		},
	}
	if e.source != "" {
		r.Headers = append([]kgo.RecordHeader{{Key: "source", Value: []byte(e.source)}}, r.Headers...)
	}
	if e.id != "" {
		r.Headers = append([]kgo.RecordHeader{{Key: "id", Value: []byte(e.id)}}, r.Headers...)
	}
	return r
}

func (e *env) produce(events ...event) {
	e.t.Helper()
	cl := kafkaClient(e.t)
	rs := make([]*kgo.Record, len(events))
	for i, ev := range events {
		rs[i] = ev.record(e.topic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// bill is the business handler of the tests: one billing row per event.
func bill(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	var v struct{ Amount int64 }
	if err := json.Unmarshal(r.Value, &v); err != nil {
		return err
	}
	ev, _ := eventKey(r)
	_, err := tx.Exec(ctx, `INSERT INTO billing (source, event_id, amount) VALUES ($1, $2, $3)`, ev.source, ev.id, v.Amount)
	return err
}

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (e *env) config(h Handler) Config {
	return Config{
		Brokers: kafkaBrokers(e.t),
		Group:   e.group,
		Topics:  []string{e.topic},
		DB:      e.pool,
		Handler: h,
		Backoff: 10 * time.Millisecond,
		Hooks:   &counts{},
		Logger:  testLogger(),
	}
}

func (e *env) consumer(cfg Config) *Consumer {
	e.t.Helper()
	c, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c
}

// runUntil runs c until done says so, then cancels it and returns what Run
// returned; or returns Run's result if it returns first.
func runUntil(t *testing.T, c *Consumer, done func() bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Run(ctx) }()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case err := <-res:
			return err
		case <-deadline:
			cancel()
			<-res
			t.Fatal("timed out waiting for the consumer")
		case <-time.After(20 * time.Millisecond):
			if done() {
				cancel()
				return <-res
			}
		}
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// billing returns the number of business rows and of distinct event ids.
func (e *env) billing() (rows, distinct int) {
	return e.count(`SELECT count(*) FROM billing`), e.count(`SELECT count(DISTINCT (source, event_id)) FROM billing`)
}

func (e *env) processedRows() int {
	return e.count(`SELECT count(*) FROM processed_events WHERE consumer_group = $1`, e.group)
}

// committed returns the group's committed offset per partition of the
// topic (-1 when none) and the topic's end offsets.
func (e *env) committed() (committed, end map[int32]int64) {
	e.t.Helper()
	adm := kadm.NewClient(kafkaClient(e.t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, e.group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		e.t.Fatalf("fetch offsets: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, e.topic)
	if err != nil {
		e.t.Fatalf("list end offsets: %v", err)
	}
	committed, end = map[int32]int64{}, map[int32]int64{}
	for p, lo := range ends[e.topic] {
		end[p] = lo.Offset
		committed[p] = -1
		if o, ok := offs.Lookup(e.topic, p); ok {
			committed[p] = o.At
		}
	}
	return committed, end
}

func (e *env) requireAllCommitted() {
	e.t.Helper()
	committed, end := e.committed()
	for p, o := range end {
		if committed[p] != o {
			e.t.Errorf("partition %d: committed offset %d, end offset %d; want everything committed", p, committed[p], o)
		}
	}
}

// TestEachEventProcessedOnce: 200 events plus 50 redelivered copies; each
// event is processed once, the copies are counted as duplicates, and every
// offset is committed.
func TestEachEventProcessedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	var events []event
	for i := range 200 {
		ev := event{id: fmt.Sprintf("ev-%d", i), key: fmt.Sprintf("acct-%d", i%20), amount: i}
		events = append(events, ev)
		if i%4 == 3 { // a redelivery: the same record again, later in its partition
			events = append(events, events[len(events)-2])
		}
	}
	e.produce(events...)

	c := e.consumer(e.config(bill))
	start := time.Now()
	if err := runUntil(t, c, func() bool { return int(stats(c).processed.Load())+int(stats(c).duplicates.Load()) == 250 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("250 records in %v", time.Since(start).Round(time.Millisecond))
	c.Close()

	if rows, distinct := e.billing(); rows != 200 || distinct != 200 {
		t.Errorf("billing: %d rows, %d distinct events; want 200 and 200", rows, distinct)
	}
	if n := e.processedRows(); n != 200 {
		t.Errorf("processed_events: %d rows, want 200", n)
	}
	if p, d, f := int(stats(c).processed.Load()), int(stats(c).duplicates.Load()), int(stats(c).failures.Load()); p != 200 || d != 50 || f != 0 {
		t.Errorf("processed=%d duplicates=%d failures=%d; want 200, 50, 0", p, d, f)
	}
	e.requireAllCommitted()

	// A new consumer in the group gets nothing old: one new record per
	// partition is all it sees.
	seen := make(chan string, 100)
	c2 := e.consumer(e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		ev, _ := eventKey(r)
		seen <- ev.id
		return bill(ctx, tx, r)
	}))
	go func() {
		// Produced before or after c2 joins, the same: the group's
		// committed offsets, not the join, decide where c2 starts.
		cl := kafkaClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
		for p := range int32(3) {
			r := event{id: fmt.Sprintf("new-%d", p), key: "k", amount: 1}.record(e.topic)
			r.Partition = p
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
			}
		}
	}()
	if err := runUntil(t, c2, func() bool { return int(stats(c2).processed.Load()) == 3 }); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	close(seen)
	for id := range seen {
		if !strings.HasPrefix(id, "new-") {
			t.Errorf("the second consumer processed %s again", id)
		}
	}
	if d := int(stats(c2).duplicates.Load()); d != 0 {
		t.Errorf("the second consumer got %d old records", d)
	}
}

// TestReadsCommittedOnly: a record of an aborted Kafka transaction is
// never handled; one of a committed transaction and one written without a
// transaction are.
func TestReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	txn := kafkaClient(t, kgo.TransactionalID(pgtest.Name("txn")))
	for _, tc := range []struct {
		id     string
		commit kgo.TransactionEndTry
	}{{"aborted-1", kgo.TryAbort}, {"committed-1", kgo.TryCommit}} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := txn.ProduceSync(ctx, event{id: tc.id, key: "k", amount: 1}.record(e.topic)).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := txn.EndTransaction(ctx, tc.commit); err != nil {
			t.Fatal(err)
		}
	}
	e.produce(event{id: "plain-1", key: "k", amount: 1})

	var seen []string
	c := e.consumer(e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		ev, _ := eventKey(r)
		seen = append(seen, ev.id)
		return bill(ctx, tx, r)
	}))
	if err := runUntil(t, c, func() bool { return stats(c).processed.Load() == 2 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if strings.Join(seen, " ") != "committed-1 plain-1" {
		t.Fatalf("handled %v, want [committed-1 plain-1]", seen)
	}
}

// TestRetryThenSuccess: a handler that writes and then fails twice leaves
// nothing behind; the third attempt processes the event once.
func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	var events []event
	for i := range 10 {
		events = append(events, event{id: fmt.Sprintf("ev-%d", i), key: "k", amount: i})
	}
	e.produce(events...)

	var calls atomic.Int32
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if err := bill(ctx, tx, r); err != nil {
			return err
		}
		if ev, _ := eventKey(r); ev.id == "ev-4" && calls.Add(1) <= 2 {
			return errors.New("flaky downstream") // after its insert: must be rolled back
		}
		return nil
	})
	cfg.MaxAttempts = 3
	c := e.consumer(cfg)
	if err := runUntil(t, c, func() bool { return int(stats(c).processed.Load()) == 10 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	c.Close()
	if n := e.count(`SELECT count(*) FROM billing WHERE event_id = 'ev-4'`); n != 1 {
		t.Errorf("ev-4 has %d billing rows, want 1", n)
	}
	if rows, distinct := e.billing(); rows != 10 || distinct != 10 {
		t.Errorf("billing: %d rows, %d distinct; want 10 and 10", rows, distinct)
	}
	if n := e.processedRows(); n != 10 {
		t.Errorf("processed_events: %d rows, want 10", n)
	}
	if f := int(stats(c).failures.Load()); f != 2 {
		t.Errorf("failures = %d, want 2", f)
	}
	e.requireAllCommitted()
}

// TestDeadLetter: under DeadLetter, an event that always fails and a record
// without id go to the dead-letter topic with their origin and error, the
// offsets are committed, and the dead-lettered event is recorded as
// processed, so its redelivery is skipped rather than dead-lettered again.
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlt := newTopic(t, "dlq", 1)
	events := []event{
		{id: "ev-0", key: "k"}, {id: "ev-1", key: "k"}, {id: "ev-2", key: "k", amount: 42},
		{key: "k"}, // offset 3: no id header
		{id: "ev-4", key: "k"}, {id: "ev-5", key: "k"},
		{id: "ev-2", key: "k", amount: 42}, // offset 6: redelivery of the failing event
	}
	e.produce(events...)

	cfg := e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if err := bill(ctx, tx, r); err != nil {
			return err
		}
		if ev, _ := eventKey(r); ev.id == "ev-2" {
			return errors.New("invoice rejected: boom")
		}
		return nil
	})
	cfg.MaxAttempts = 2
	cfg.OnFailure = DeadLetter
	cfg.DeadLetterTopic = dlt
	c := e.consumer(cfg)
	if err := runUntil(t, c, func() bool {
		return int(stats(c).processed.Load())+int(stats(c).duplicates.Load())+int(stats(c).deadLettered.Load()) == len(events)
	}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	c.Close()

	if p, d, dl, f := int(stats(c).processed.Load()), int(stats(c).duplicates.Load()), int(stats(c).deadLettered.Load()), int(stats(c).failures.Load()); p != 4 || d != 1 || dl != 2 || f != 2 {
		t.Errorf("processed=%d duplicates=%d dead_lettered=%d failures=%d; want 4, 1, 2, 2", p, d, dl, f)
	}
	if n := e.count(`SELECT count(*) FROM billing WHERE event_id = 'ev-2'`); n != 0 {
		t.Errorf("ev-2 has %d billing rows, want none (every attempt rolled back)", n)
	}
	if n := e.count(`SELECT count(*) FROM processed_events WHERE consumer_group = $1 AND event_id = 'ev-2'`, e.group); n != 1 {
		t.Errorf("ev-2 has %d processed_events rows, want 1: a dead-lettered event is recorded", n)
	}
	if n := e.processedRows(); n != 5 {
		t.Errorf("processed_events: %d rows, want 5 (4 processed, 1 dead-lettered)", n)
	}
	e.requireAllCommitted()

	// The dead-letter topic holds exactly the two records, in order.
	cl := kafkaClient(t, kgo.ConsumeTopics(dlt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(got) < 2 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatalf("consume the dead-letter topic: %v (got %d records)", err, len(got))
		}
		got = append(got, fs.Records()...)
	}
	if len(got) != 2 {
		t.Fatalf("dead-letter topic: %d records, want 2", len(got))
	}
	header := func(r *kgo.Record, k string) string {
		for _, h := range r.Headers {
			if h.Key == k {
				return string(h.Value)
			}
		}
		return "<none>"
	}
	want := []map[string]string{
		{HeaderEventID: "ev-2", HeaderOriginalTopic: e.topic, HeaderOriginalPartition: "0", HeaderOriginalOffset: "2",
			HeaderConsumerGroup: e.group, HeaderAttempts: "2", "event_type": "PaymentCreated"},
		{HeaderEventID: "<none>", HeaderOriginalTopic: e.topic, HeaderOriginalPartition: "0", HeaderOriginalOffset: "3",
			HeaderConsumerGroup: e.group, HeaderAttempts: "0", "event_type": "PaymentCreated"},
	}
	for i, r := range got {
		for k, v := range want[i] {
			if h := header(r, k); h != v {
				t.Errorf("dead-letter record %d: header %s = %q, want %q", i, k, h, v)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, header(r, HeaderOriginalTimestamp)); err != nil {
			t.Errorf("dead-letter record %d: header %s: %v", i, HeaderOriginalTimestamp, err)
		}
		if string(r.Key) != "k" {
			t.Errorf("dead-letter record %d: key %q, want the original", i, r.Key)
		}
	}
	if h := header(got[0], HeaderError); !strings.Contains(h, "boom") {
		t.Errorf("dead-letter record 0: error header %q, want the handler's error", h)
	}
	if string(got[0].Value) != `{"amount": 42}` {
		t.Errorf("dead-letter record 0: value %s, want the original", got[0].Value)
	}
	if h := header(got[1], HeaderError); !strings.Contains(h, `"id"`) {
		t.Errorf("dead-letter record 1: error header %q, want the missing id", h)
	}
}

// TestUnavailableStops: a handler error wrapping ErrUnavailable (what the
// handler needs is down, not the record bad) stops Run after the last
// attempt even under DeadLetter: the record is neither dead-lettered nor
// recorded, and its offset is not committed.
func TestUnavailableStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produce(event{id: "ev-0", key: "k"}, event{id: "ev-1", key: "k"})
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if ev, _ := eventKey(r); ev.id == "ev-1" {
			return fmt.Errorf("%w: schema registry: connection refused", ErrUnavailable)
		}
		return bill(ctx, tx, r)
	})
	cfg.MaxAttempts = 2
	cfg.OnFailure = DeadLetter
	cfg.DeadLetterTopic = newTopic(t, "dlq", 1)
	c := e.consumer(cfg)
	err := runUntil(t, c, func() bool { return stats(c).deadLettered.Load() > 0 })
	var re *RecordError
	if !errors.As(err, &re) || !errors.Is(err, ErrUnavailable) || re.EventID != "ev-1" || re.Stage != StageHandler || re.Attempts != 2 {
		t.Fatalf("Run: %v; want a *RecordError for ev-1 after 2 attempts, wrapping ErrUnavailable", err)
	}
	if dl := stats(c).deadLettered.Load(); dl != 0 {
		t.Errorf("%d records dead-lettered, want none", dl)
	}
	if n := e.processedRows(); n != 1 {
		t.Errorf("processed_events: %d rows, want 1 (ev-0)", n)
	}
}

// TestStopPolicy: under Stop, Run returns an error naming the event and its
// offset; that offset is not committed, the ones before it are, and a new
// consumer retries from it.
func TestStopPolicy(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	var events []event
	for i := range 6 {
		events = append(events, event{id: fmt.Sprintf("ev-%d", i), key: "k", amount: i})
	}
	e.produce(events...)

	cfg := e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if ev, _ := eventKey(r); ev.id == "ev-3" {
			return errors.New("boom")
		}
		return bill(ctx, tx, r)
	})
	cfg.MaxAttempts = 2
	c := e.consumer(cfg)
	err := runUntil(t, c, func() bool { return false })
	var re *RecordError
	if !errors.As(err, &re) {
		t.Fatalf("Run returned %v, want a *RecordError", err)
	}
	if re.EventID != "ev-3" || re.Offset != 3 || re.Partition != 0 || re.Topic != e.topic || re.Stage != StageHandler || re.Attempts != 2 {
		t.Errorf("RecordError %+v; want ev-3 at offset 3, handler, 2 attempts", *re)
	}
	for _, s := range []string{"event ev-3", "offset 3", "partition 0", e.topic, "boom", "after 2 attempts"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	t.Logf("Run: %v", err)
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunTwice) {
		t.Errorf("second Run: %v, want ErrRunTwice", err)
	}
	c.Close()
	if committed, _ := e.committed(); committed[0] != 3 {
		t.Errorf("committed offset %d, want 3: the failed record's", committed[0])
	}
	if rows, _ := e.billing(); rows != 3 {
		t.Errorf("billing: %d rows, want 3", rows)
	}

	// The cause is fixed: a new consumer starts at ev-3.
	c2 := e.consumer(e.config(bill))
	if err := runUntil(t, c2, func() bool { return int(stats(c2).processed.Load()) == 3 }); err != nil {
		t.Fatalf("Run after the fix: %v", err)
	}
	c2.Close()
	if d := int(stats(c2).duplicates.Load()); d != 0 {
		t.Errorf("duplicates = %d, want 0: ev-0..ev-2 were committed", d)
	}
	if rows, distinct := e.billing(); rows != 6 || distinct != 6 {
		t.Errorf("billing: %d rows, %d distinct; want 6 and 6", rows, distinct)
	}
	e.requireAllCommitted()
}

// TestMissingIDStops: under Stop, a record without id stops Run before
// anything is done for it.
func TestMissingIDStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produce(event{id: "ev-0", key: "k"}, event{key: "k"}, event{id: "ev-2", key: "k"})
	var calls atomic.Int32
	c := e.consumer(e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		calls.Add(1)
		return bill(ctx, tx, r)
	}))
	err := runUntil(t, c, func() bool { return false })
	var re *RecordError
	if !errors.Is(err, ErrMissingEventID) || !errors.As(err, &re) || re.Offset != 1 || re.Stage != StageEventID {
		t.Fatalf("Run returned %v; want a *RecordError for offset 1 wrapping ErrMissingEventID", err)
	}
	c.Close()
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1 (ev-0 only)", n)
	}
	if committed, _ := e.committed(); committed[0] != 1 {
		t.Errorf("committed offset %d, want 1", committed[0])
	}
}

// TestCrashSafety stops a consumer mid-stream and starts another; then
// simulates a crash that lost every offset commit after the database
// commits. Each event is processed exactly once throughout.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	const n = 400
	var events []event
	for i := range n {
		events = append(events, event{id: fmt.Sprintf("ev-%d", i), key: fmt.Sprintf("acct-%d", i%37), amount: i})
	}
	e.produce(events...)
	slowBill := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		time.Sleep(time.Millisecond)
		return bill(ctx, tx, r)
	}

	// 1. Stopped mid-stream.
	cfg := e.config(slowBill)
	cfg.MaxPollRecords = 50
	c1 := e.consumer(cfg)
	if err := runUntil(t, c1, func() bool { return int(stats(c1).processed.Load()) >= 100 }); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	c1.Close()
	first := e.processedRows()
	if first >= n {
		t.Fatalf("the first consumer processed all %d events before it was stopped; the test proves nothing", first)
	}
	t.Logf("first consumer: %d events", first)

	// 2. Restarted: finishes the rest, redelivering nothing it committed.
	c2 := e.consumer(e.config(slowBill))
	if err := runUntil(t, c2, func() bool { return e.processedRows() == n }); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	c2.Close()
	if rows, distinct := e.billing(); rows != n || distinct != n {
		t.Fatalf("billing: %d rows, %d distinct; want %d and %d", rows, distinct, n, n)
	}
	if p := int(stats(c2).processed.Load()); p != n-first {
		t.Errorf("second consumer processed %d, want %d", p, n-first)
	}
	e.requireAllCommitted()

	// 3. A crash after the database commits but before any offset commit:
	// rewind the group to the start. Everything comes again; nothing runs.
	adm := kadm.NewClient(kafkaClient(t))
	var rewind kadm.Offsets
	for p := range int32(4) {
		rewind.AddOffset(e.topic, p, 0, -1)
	}
	if err := adm.CommitAllOffsets(context.Background(), e.group, rewind); err != nil {
		t.Fatalf("rewind the group: %v", err)
	}
	var calls atomic.Int32
	c3 := e.consumer(e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		calls.Add(1)
		return bill(ctx, tx, r)
	}))
	if err := runUntil(t, c3, func() bool { return int(stats(c3).duplicates.Load()) == n }); err != nil {
		t.Fatalf("third Run: %v", err)
	}
	c3.Close()
	if calls.Load() != 0 {
		t.Errorf("handler ran %d times after the rewind, want 0", calls.Load())
	}
	if rows, distinct := e.billing(); rows != n || distinct != n {
		t.Errorf("billing after the rewind: %d rows, %d distinct; want %d and %d", rows, distinct, n, n)
	}
	e.requireAllCommitted()
}

// TestRebalance: a second member joins mid-stream and the first leaves;
// partitions move twice, and still every event is processed once.
func TestRebalance(t *testing.T) {
	t.Parallel()
	e := setup(t, 4)
	const n = 400
	var events []event
	for i := range n {
		events = append(events, event{id: fmt.Sprintf("ev-%d", i), key: fmt.Sprintf("acct-%d", i%41), amount: i})
	}
	e.produce(events...)
	slowBill := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		time.Sleep(2 * time.Millisecond)
		return bill(ctx, tx, r)
	}
	shared := &counts{} // one set for both members, as one process's metrics would be
	newMember := func() *Consumer {
		cfg := e.config(slowBill)
		cfg.Hooks = shared
		cfg.MaxPollRecords = 20
		return e.consumer(cfg)
	}

	a := newMember()
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	var wg sync.WaitGroup
	var errA error
	wg.Go(func() { errA = a.Run(ctxA) })
	for deadline := time.Now().Add(60 * time.Second); e.processedRows() < 50; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the first member")
		}
	}
	b := newMember() // joins mid-stream: A's partitions are rebalanced

	errB := runUntil(t, b, func() bool {
		switch rows := e.processedRows(); {
		case rows >= 250 && ctxA.Err() == nil:
			stopA() // A leaves: its partitions move to B
			wg.Wait()
			a.Close()
		case rows == n:
			return true
		}
		return false
	})
	stopA()
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("Run: A %v, B %v", errA, errB)
	}
	b.Close()
	if rows, distinct := e.billing(); rows != n || distinct != n {
		t.Errorf("billing: %d rows, %d distinct; want %d and %d", rows, distinct, n, n)
	}
	// Both members count on one set of hooks.
	t.Logf("processed=%v duplicates=%v commit_errors=%v", int(stats(b).processed.Load()), int(stats(b).duplicates.Load()), int(stats(b).commitErrors.Load()))
	// Duplicates are allowed here (a member removed while processing has
	// its commit refused, and its records come again), double processing is
	// not: each event's transaction commits once.
	if p := int(stats(b).processed.Load()); p != n {
		t.Errorf("processed_total = %d, want %d", p, n)
	}
	e.requireAllCommitted()
}

// TestTableCheck: Run refuses a database without processed_events, or with
// one that could not detect duplicates.
func TestTableCheck(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool, err := pgxpool.New(pgtest.Context(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := Config{
		Brokers: kafkaBrokers(t), Group: pgtest.Name("grp"), Topics: []string{"unused"},
		DB: pool, Handler: bill, Logger: testLogger(),
	}
	run := func() error {
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.Run(ctx)
	}
	if err := run(); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("without the table: %v", err)
	}
	// The table as it was before sources.
	pgtest.Exec(t, url, `CREATE TABLE processed_events (event_id text, consumer_group text, processed_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (consumer_group, event_id))`)
	if err := run(); err == nil || !strings.Contains(err.Error(), "no source column") {
		t.Errorf("a table from before sources: %v", err)
	}
	pgtest.Exec(t, url, `ALTER TABLE processed_events DROP CONSTRAINT processed_events_pkey, ADD COLUMN source text NOT NULL DEFAULT ''`)
	if err := run(); err == nil || !strings.Contains(err.Error(), "no unique key") {
		t.Errorf("without the primary key: %v", err)
	}
}

// TestProcessedEventsSQL: the script is rerunnable and creates the key and
// the index the package relies on.
func TestProcessedEventsSQL(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	script, err := os.ReadFile("../sql/processed_events.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, url, string(script))
	pgtest.Exec(t, url, string(script))
	conn := pgtest.Connect(t, url)
	var pk, idx string
	err = conn.QueryRow(pgtest.Context(t), `
		SELECT (SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'processed_events'::regclass AND contype = 'p'),
		       (SELECT indexdef FROM pg_indexes WHERE tablename = 'processed_events' AND indexname = 'processed_events_processed_at')`).Scan(&pk, &idx)
	if err != nil {
		t.Fatal(err)
	}
	if pk != "PRIMARY KEY (consumer_group, source, event_id)" || !strings.Contains(idx, "(processed_at)") {
		t.Errorf("primary key %q, index %q", pk, idx)
	}
}

// TestProcessedEventsUpgrade: sql/processed_events.sql upgrades a table
// from before sources in place. Its rows get source ”, so a replay of the
// records they were made from (which carry no source header) is still
// skipped, while an event with the same id from a source is new.
func TestProcessedEventsUpgrade(t *testing.T) {
	t.Parallel()
	e := setupWith(t, 1, func(url string) {
		pgtest.Exec(t, url, `CREATE TABLE processed_events (
			event_id text NOT NULL, consumer_group text NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (consumer_group, event_id));
			CREATE INDEX processed_events_processed_at ON processed_events (processed_at)`)
	})
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO processed_events (event_id, consumer_group) VALUES ('1', $1), ('2', $1)`, e.group); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("../sql/processed_events.sql")
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, e.url, string(script))
	pgtest.Exec(t, e.url, string(script))
	var pk string
	if err := e.pool.QueryRow(context.Background(), `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = 'processed_events'::regclass AND contype = 'p'`).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if pk != "PRIMARY KEY (consumer_group, source, event_id)" {
		t.Errorf("after the upgrade: %s", pk)
	}
	if n := e.count(`SELECT count(*) FROM processed_events WHERE source = '' AND consumer_group = $1`, e.group); n != 2 {
		t.Errorf("%d old rows with source '', want 2", n)
	}

	// Events 1 and 2 again from the old streamer (no source): skipped.
	// Events 1 and 2 from a source, and 3 from either: processed.
	e.produce(event{id: "1", key: "k"}, event{id: "2", key: "k"}, event{id: "3", key: "k"},
		event{id: "1", key: "k", source: "payments"}, event{id: "2", key: "k", source: "payments"})
	c := e.consumer(e.config(bill))
	if err := runUntil(t, c, func() bool { return stats(c).processed.Load()+stats(c).duplicates.Load() == 5 }); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if p, d := stats(c).processed.Load(), stats(c).duplicates.Load(); p != 3 || d != 2 {
		t.Errorf("processed %d, duplicates %d; want 3 and 2", p, d)
	}
}

// TestCleanup deletes only rows older than the cutoff, of every group.
func TestCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := pgtest.Context(t)
	_, err := e.pool.Exec(ctx, `
		INSERT INTO processed_events (event_id, consumer_group, processed_at)
		SELECT 'old-' || i, 'g' || (i % 2), now() - interval '2 hours' - i * interval '1 second' FROM generate_series(1, 7) i
		UNION ALL
		SELECT 'new-' || i, 'g' || (i % 2), now() - interval '59 minutes' FROM generate_series(1, 4) i`)
	if err != nil {
		t.Fatal(err)
	}
	n, err := Cleanup(ctx, e.pool, time.Hour, 2)
	if err != nil || n != 7 {
		t.Fatalf("Cleanup = %d, %v; want 7 rows deleted", n, err)
	}
	if left := e.count(`SELECT count(*) FROM processed_events WHERE event_id LIKE 'new-%'`); left != 4 || e.count(`SELECT count(*) FROM processed_events`) != 4 {
		t.Errorf("after Cleanup: %d new rows left of %d rows; want only the 4 new ones", left, e.count(`SELECT count(*) FROM processed_events`))
	}
	if n, err := Cleanup(ctx, e.pool, time.Hour, 2); err != nil || n != 0 {
		t.Errorf("second Cleanup = %d, %v; want 0", n, err)
	}
	if n, err := Cleanup(ctx, e.pool, time.Nanosecond, 0); err != nil || n != 4 {
		t.Errorf("Cleanup with batch size 0 (the default) = %d, %v; want the 4 left", n, err)
	}
	for _, bad := range []struct {
		older time.Duration
		batch int
		want  string
	}{{0, 10, "olderThan"}, {time.Hour, -1, "batchSize"}} {
		if _, err := Cleanup(ctx, e.pool, bad.older, bad.batch); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Cleanup(%v, %d) = %v, want an error about %s", bad.older, bad.batch, err, bad.want)
		}
	}
}

// TestDatabaseErrorStops: a failure outside the handler (here the commit,
// refused by a deferred constraint) stops Run after the last attempt even
// under DeadLetter: an outage must not dead-letter healthy events.
func TestDatabaseErrorStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlt := newTopic(t, "dlq", 1)
	pgtest.Exec(t, e.url, `CREATE TABLE ledger (entry int UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	e.produce(event{id: "ev-0", key: "k"}, event{id: "ev-1", key: "k"})
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if ev, _ := eventKey(r); ev.id == "ev-1" {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES (1), (1)`) // fails at COMMIT
			return err
		}
		return bill(ctx, tx, r)
	})
	cfg.MaxAttempts = 2
	cfg.OnFailure = DeadLetter
	cfg.DeadLetterTopic = dlt
	c := e.consumer(cfg)
	err := runUntil(t, c, func() bool { return false })
	var re *RecordError
	if !errors.As(err, &re) || re.EventID != "ev-1" || re.Offset != 1 || re.Stage != StageDatabase || re.Attempts != 2 {
		t.Fatalf("Run returned %v; want a database *RecordError for ev-1 at offset 1 after 2 attempts", err)
	}
	c.Close()
	if dl := int(stats(c).deadLettered.Load()); dl != 0 {
		t.Errorf("dead_lettered = %d, want 0", dl)
	}
	if committed, _ := e.committed(); committed[0] != 1 {
		t.Errorf("committed offset %d, want 1", committed[0])
	}
	if n := e.processedRows(); n != 1 {
		t.Errorf("processed_events: %d rows, want 1 (ev-0)", n)
	}
}
