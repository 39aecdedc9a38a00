package sink_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

func newTransactional(t *testing.T, id, checkpoints string) *sink.Transactional {
	t.Helper()
	tp, err := sink.NewTransactional(sink.TxConfig{
		Config:          sink.Config{Brokers: testenv.KafkaBrokers(t), Linger: time.Millisecond},
		TransactionalID: id, CheckpointTopic: checkpoints, CheckpointKey: "slot_a", Origin: "1/2/3",
		Timeline: func() int32 { return 3 }, Interval: 20 * time.Millisecond, CommitRecords: 1000,
	}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Close)
	return tp
}

// TestTransactionalCommitsWholeTransactionsWithTheirCheckpoint, on the real
// broker: records up to the last boundary commit with a checkpoint of that
// boundary, and only then are their promises called; records after it
// wait, and Discard drops them.
func TestTransactionalCommitsWholeTransactionsWithTheirCheckpoint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.Topic(t, "txn", 3)
	checkpoints := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, checkpoints); err != nil {
		t.Fatal(err)
	}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, checkpoints); err != nil {
		t.Fatalf("the checkpoint topic exists: %v", err)
	}
	// A topic just created may not be described yet: poll.
	adm := kadm.NewClient(testenv.KafkaClient(t))
	for compacted := false; !compacted; {
		configs, err := adm.DescribeTopicConfigs(ctx, checkpoints)
		if err == nil {
			c, cerr := configs.On(checkpoints, nil)
			compacted = cerr == nil && hasConfig(c.Configs, "cleanup.policy", "compact")
			if cerr == nil && len(c.Configs) > 0 && !compacted {
				t.Fatalf("the checkpoint topic is not compacted: %v", c.Configs)
			}
		}
		if !compacted {
			select {
			case <-ctx.Done():
				t.Fatalf("the checkpoint topic's configuration: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_a", "1/2/3"); err != nil || cp.Found {
		t.Fatalf("a new checkpoint topic: %+v, %v", cp, err)
	}

	tp := newTransactional(t, testenv.Name("txid"), checkpoints)
	if err := tp.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	acked := make(chan string, 10)
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			t.Errorf("record %s: %v", r.Key, err)
		}
		acked <- string(r.Key)
	}
	for _, k := range []string{"a", "b", "c"} {
		tp.Produce(&kgo.Record{Topic: topic, Key: []byte(k), Value: []byte("{}")}, promise)
	}
	committedAt := time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)
	tp.Boundary(0x400, 740, committedAt.Add(-time.Millisecond))
	tp.Boundary(0x500, 741, committedAt)
	tp.Produce(&kgo.Record{Topic: topic, Key: []byte("open"), Value: []byte("{}")}, promise)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tp.Run(runCtx) }()
	for range 3 {
		select {
		case k := <-acked:
			if k == "open" {
				t.Fatal("a record after the last boundary was committed")
			}
		case <-ctx.Done():
			t.Fatal("the transaction did not commit")
		}
	}
	if tp.Checkpoint() != 0x500 {
		t.Fatalf("Checkpoint() = %s after the commit", tp.Checkpoint())
	}
	cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_a", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x500 || cp.Origin != "1/2/3" {
		t.Fatalf("checkpoint read back: %+v, %v; want 0/500 of 1/2/3", cp, err)
	}
	// It names the commit at that LSN in its history: what a later start
	// verifies.
	if want := (sink.Commit{End: 0x500, Timeline: 3, Xid: 741, CommitTime: committedAt}); cp.Commit != want {
		t.Fatalf("checkpoint's commit: %+v, want %+v", cp.Commit, want)
	}
	if other, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_b", "1/2/3"); err != nil || other.Found {
		t.Fatalf("another slot's checkpoint: %+v, %v", other, err)
	}
	if dropped := tp.Discard(); len(dropped) != 1 || string(dropped[0].Key) != "open" {
		t.Fatalf("Discard returned %d records", len(dropped))
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run after its context ended: %v", err)
	}
	select {
	case k := <-acked:
		t.Fatalf("record %s acknowledged after it was discarded", k)
	default:
	}
}

// TestTransactionalFenced: a second producer registering the same
// transactional id fences the first, whose next transaction fails with an
// error that says so; its records are never acknowledged and its
// checkpoint never written.
func TestTransactionalFenced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.Topic(t, "fenced", 1)
	checkpoints := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, checkpoints); err != nil {
		t.Fatal(err)
	}
	id := testenv.Name("txid")
	old, taker := newTransactional(t, id, checkpoints), newTransactional(t, id, checkpoints)
	if err := old.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	if err := taker.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	old.Produce(&kgo.Record{Topic: topic, Value: []byte("{}")}, func(*kgo.Record, error) { t.Error("a fenced producer's record was acknowledged") })
	old.Boundary(0x700, 1, time.Now())
	err := old.Run(ctx)
	var te *sink.TxError
	if !errors.As(err, &te) || !te.Fenced() {
		t.Fatalf("the fenced producer's Run returned %v, want a fenced *sink.TxError", err)
	}
	if cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_a", "1/2/3"); err != nil || cp.Found {
		t.Fatalf("checkpoint after the fenced transaction: %+v, %v", cp, err)
	}
}

func hasConfig(cs []kadm.Config, key, value string) bool {
	for _, c := range cs {
		if c.Key == key && c.Value != nil && *c.Value == value {
			return true
		}
	}
	return false
}

// TestReadCheckpointPastOpenTransactions: the checkpoint topic is shared by
// every slot. Another producer's transaction left open on it (a killed
// instance of another slot, until the broker times it out) holds back the
// last stable offset, where a read_committed consumer stops; the slot's
// checkpoint committed after it is still read. A checkpoint of an aborted
// transaction is passed over, and so is one whose transaction is still
// open.
func TestReadCheckpointPastOpenTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkpoints := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, checkpoints); err != nil {
		t.Fatal(err)
	}
	inTxn := func(id string, end *kgo.TransactionEndTry, records ...*kgo.Record) *kgo.Client {
		cl := testenv.KafkaClient(t, kgo.TransactionalID(id))
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if end != nil {
			if err := cl.EndTransaction(ctx, *end); err != nil {
				t.Fatal(err)
			}
		}
		return cl
	}
	commit, abort := kgo.TryCommit, kgo.TryAbort
	inTxn(testenv.Name("other"), nil, sink.CheckpointRecord(checkpoints, "slot_other", "9/9/9", 0x100)) // left open
	mine := testenv.Name("mine")
	inTxn(mine, &commit, sink.CheckpointRecord(checkpoints, "slot_a", "1/2/3", 0x900))
	inTxn(mine, &abort, sink.CheckpointRecord(checkpoints, "slot_a", "1/2/3", 0xA00))
	inTxn(mine+"x", nil, sink.CheckpointRecord(checkpoints, "slot_a", "1/2/3", 0xB00)) // undecided

	cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_a", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x900 {
		t.Fatalf("checkpoint %+v, %v; want the committed 0/900", cp, err)
	}
}

// TestReadCheckpointHighestOfItsOrigin: on a checkpoint topic of several
// partitions, shared by streams that use the same key (two clusters with
// the default slot name under the former default names), the checkpoint
// read is the committed one of the wanted origin with the highest LSN,
// whichever partition holds it and whatever was written after it: a lower
// one written later on another partition, another origin's higher one.
func TestReadCheckpointHighestOfItsOrigin(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkpoints := testenv.Topic(t, "checkpoints", 3)
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	cl := testenv.KafkaClient(t, kgo.TransactionalID(testenv.Name("txid")), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	commit := func(partition int32, origin string, lsn uint64) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := sink.CheckpointRecord(checkpoints, "cdc_outbox", origin, pglogrepl.LSN(lsn))
		r.Partition = partition
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	commit(1, "1/2/3", 0x900)
	commit(0, "7/8/9", 0xF00) // another cluster's, under the same key
	commit(2, "1/2/3", 0x500)
	commit(0, "1/2/3", 0x700)

	cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "cdc_outbox", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x900 || cp.Origin != "1/2/3" {
		t.Fatalf("checkpoint %+v, %v; want 0/900 of 1/2/3", cp, err)
	}
	if cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "cdc_outbox", "4/5/6"); err != nil || cp.Found {
		t.Fatalf("checkpoint of an origin that wrote none: %+v, %v", cp, err)
	}
}

// TestReadCheckpointWaitsForASlowBroker: every fetch of the checkpoint
// topic takes 6 s to reach the broker (a proxy on the broker's PROXIED
// listener holds it), more than any single poll used to wait. The
// checkpoint is still found; and with a deadline shorter than the delay,
// the read fails with an error naming the partition not read to its end,
// never a checkpoint "not found", which would send again everything
// since the slot's position.
func TestReadCheckpointWaitsForASlowBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkpoints := testenv.Name("checkpoints")
	direct := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	if err := sink.EnsureCheckpointTopic(ctx, direct, checkpoints); err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.TransactionalID(testenv.Name("txid")))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, sink.CheckpointRecord(checkpoints, "slot_a", "1/2/3", 0x900)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	addr := testenv.KafkaProxiedBrokers(t)
	p := testenv.NewProxy(t, addr, testenv.KafkaProxiedTarget(t))
	const fetchAPI, delay = 1, 6 * time.Second
	p.DelayKafka(fetchAPI, delay)
	slow := sink.Config{Brokers: []string{addr}}
	start := time.Now()
	cp, err := sink.ReadCheckpoint(ctx, slow, checkpoints, "slot_a", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x900 {
		t.Fatalf("checkpoint through fetches delayed %s: %+v, %v; want 0/900", delay, cp, err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("read in %s: the fetches were not delayed", took)
	}

	short, cancelShort := context.WithTimeout(ctx, delay/2)
	defer cancelShort()
	cp, err = sink.ReadCheckpoint(short, slow, checkpoints, "slot_a", "1/2/3")
	var sr *sink.ShortReadError
	if !errors.As(err, &sr) || len(sr.Unread) != 1 {
		t.Fatalf("read with a deadline before the first fetch's answer: %+v, %v; want a *sink.ShortReadError of partition 0", cp, err)
	}
}

// TestTransactionalBoundaryWithoutCommit, on the real broker: a boundary
// no commit ends at (a lone message's dead-letter record) moves the
// checkpoint there, and the checkpoint goes on naming the last commit and
// where it ends, which a later start verifies before it skips.
func TestTransactionalBoundaryWithoutCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.Topic(t, "txn", 1)
	checkpoints := testenv.Name("checkpoints")
	cfg := sink.Config{Brokers: testenv.KafkaBrokers(t)}
	if err := sink.EnsureCheckpointTopic(ctx, cfg, checkpoints); err != nil {
		t.Fatal(err)
	}
	tp := newTransactional(t, testenv.Name("txid"), checkpoints)
	if err := tp.Fence(ctx); err != nil {
		t.Fatal(err)
	}
	acked := make(chan string, 10)
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			t.Errorf("record %s: %v", r.Key, err)
		}
		acked <- string(r.Key)
	}
	committedAt := time.Date(2026, 1, 2, 15, 4, 5, 123456000, time.UTC)
	tp.Produce(&kgo.Record{Topic: topic, Key: []byte("row"), Value: []byte("{}")}, promise)
	tp.Boundary(0x400, 740, committedAt)
	tp.Produce(&kgo.Record{Topic: topic, Key: []byte("dead letter"), Value: []byte("{}")}, promise)
	tp.Boundary(0x480, 0, time.Time{})

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- tp.Run(runCtx) }()
	for range 2 {
		select {
		case <-acked:
		case <-ctx.Done():
			t.Fatal("the transaction did not commit")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cp, err := sink.ReadCheckpoint(ctx, cfg, checkpoints, "slot_a", "1/2/3")
	if err != nil || !cp.Found || cp.LSN != 0x480 || cp.Commit.Named != 0x400 || cp.Commit.Xid != 740 || !cp.Commit.CommitTime.Equal(committedAt) {
		t.Fatalf("checkpoint %+v, %v; want 0/480, naming the commit of xid 740 ending at 0/400", cp, err)
	}
}
