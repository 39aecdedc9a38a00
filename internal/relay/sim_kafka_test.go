package relay

// The simulation's Kafka: the records that landed (read_committed for
// exactly-once), the at-least-once producer's records in flight per
// partition, the exactly-once producer (sink.TxQueue, the bookkeeping
// sink.Transactional runs, committed here), and the checkpoint topic as a
// Store, which may be away.

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// landed is a record in Kafka, as the checks read it (world.add).
type landed struct {
	topic, source, id string
	uid               int
	dlq               bool
	by                string // the process
	epoch             int    // the stream's when it landed
}

type inflight struct {
	r       *kgo.Record
	promise func(*kgo.Record, error)
}

type kafka struct {
	w        *world
	away     bool
	epochs   []byte
	pub      []byte
	cps      []sink.Checkpoint // committed checkpoints, in order
	inflight map[*process]map[string][]inflight
	held     held
}

func newKafka() *kafka { return &kafka{inflight: map[*process]map[string][]inflight{}} }

var uidRe = regexp.MustCompile(`"u": ?(\d+)`)

// land adds r to what Kafka holds.
func (k *kafka) land(p *process, r *kgo.Record) {
	m := uidRe.FindSubmatch(r.Value)
	if m == nil {
		p.w.fail("a record for %s carries no event's content: %q", r.Topic, r.Value)
	}
	uid, _ := strconv.Atoi(string(m[1]))
	l := landed{topic: r.Topic, id: mapping.RecordEventID(r), uid: uid, dlq: r.Topic == dlqTopic, by: p.name, epoch: p.pipe.Epoch()}
	for _, h := range r.Headers {
		if h.Key == contract.HeaderSource {
			l.source = string(h.Value)
		}
	}
	p.w.add(l)
}

func (k *kafka) setAway(away bool) {
	if k.away != away {
		k.away = away
		if k.w != nil {
			k.w.logf("the checkpoint topic is %s", map[bool]string{true: "away", false: "back"}[away])
		}
	}
}

var errAway = errors.New("the checkpoint topic does not answer (simulated)")

// Read is the Store's: the highest committed checkpoint of origin
// (sink.Checkpoint.Supersedes, as sink.ReadCheckpoint), the epochs and
// the published record.
func (k *kafka) Read(_ context.Context, key, origin string) (sink.Checkpoint, error) {
	if k.away {
		return sink.Checkpoint{}, errAway
	}
	var cp sink.Checkpoint
	if key == simStream {
		for _, c := range k.cps {
			if c.Origin == origin && c.Supersedes(cp) {
				cp = c
			}
		}
	}
	cp.Epochs, cp.Published = k.epochs, k.pub
	return cp, nil
}

// Write is the Store's. The published record is written even while the
// topic does not answer reads: a published record that fails to be
// written leaves a gap the guarantees document, which the simulation does
// not explore.
func (k *kafka) Write(_ context.Context, key string, value []byte) error {
	switch key {
	case sink.PublishedKey(simStream):
		k.pub = value
	case sink.EpochsKey(simStream):
		if k.away {
			return errAway
		}
		k.epochs = value
		k.w.logf("epochs recorded: %s", value)
	}
	return nil
}

// simSink is the at-least-once producer: a FIFO per partition (one per
// topic here), promises called in order per partition.
type simSink struct{ p *process }

func (s *simSink) Produce(r *kgo.Record, promise func(*kgo.Record, error)) {
	k := s.p.w.kafka
	parts := k.inflight[s.p]
	if parts == nil {
		parts = map[string][]inflight{}
		k.inflight[s.p] = parts
	}
	parts[r.Topic] = append(parts[r.Topic], inflight{r, promise})
}

func (s *simSink) Ping(context.Context) error { return nil }

// partitions are p's partitions with records in flight, in a fixed order.
func (k *kafka) partitions(p *process) []string {
	var ts []string
	for t, q := range k.inflight[p] {
		if len(q) > 0 {
			ts = append(ts, t)
		}
	}
	slices.Sort(ts)
	return ts
}

// ack acknowledges the oldest record in flight of a partition the seed
// picks; false when none is in flight.
func (k *kafka) ack(p *process) bool {
	ts := k.partitions(p)
	if len(ts) == 0 || p.dead {
		return false
	}
	t := ts[p.w.rng.IntN(len(ts))]
	f := k.inflight[p][t][0]
	k.inflight[p][t] = k.inflight[p][t][1:]
	k.land(p, f.r)
	f.promise(f.r, nil)
	return true
}

// crash: of each partition's records in flight, a prefix the seed picks
// lands unacknowledged (the idempotent producer keeps their order).
func (k *kafka) crash(p *process) {
	for _, t := range k.partitions(p) {
		q := k.inflight[p][t]
		n := p.w.rng.IntN(len(q) + 1)
		for _, f := range q[:n] {
			k.land(p, f.r)
		}
		if n > 0 {
			p.w.logf("%d unacknowledged records for %s landed", n, t)
		}
	}
	delete(k.inflight, p)
}

// simTx is the exactly-once producer: sink.TxQueue, committed to the
// in-memory Kafka with its checkpoint in one step; a commit's outcome may
// be unknown for a while (pending).
type simTx struct {
	p         *process
	q         sink.TxQueue
	committed pglogrepl.LSN
	pending   *txCommit
	fenced    bool
}

type txCommit struct {
	batch   []sink.Queued
	through sink.Commit
}

func (t *simTx) Produce(r *kgo.Record, promise func(*kgo.Record, error)) { t.q.Add(r, promise) }

// Boundary is sink.Transactional's, with the timeline and epoch it reads.
func (t *simTx) Boundary(end pglogrepl.LSN, xid uint32, commitTime time.Time) {
	t.q.Boundary(end, xid, commitTime, t.p.history.Timeline, t.p.pipe.Epoch())
}

func (t *simTx) Discard() []*kgo.Record { return t.q.Discard() }

// Fence fences every other process's producer: a commit of theirs whose
// outcome is unknown committed or not, as the seed says.
func (t *simTx) Fence(context.Context) error {
	w := t.p.w
	if w.kafka.away {
		return errAway
	}
	for _, o := range w.procs {
		if o == t.p || o.txp == nil || o.dead {
			continue
		}
		o.txp.resolve(w.rng.IntN(2) == 0)
		o.txp.fenced = true
	}
	return nil
}

func (t *simTx) Checkpoint() pglogrepl.LSN       { return t.committed }
func (t *simTx) SetCheckpoint(lsn pglogrepl.LSN) { t.committed = lsn }
func (t *simTx) Run(context.Context) error       { return nil }
func (t *simTx) CommitNow()                      {}
func (t *simTx) Ping(context.Context) error      { return nil }

// commit is the committer's turn: a commit whose outcome was unknown is
// settled (committed, or written again: either way once); otherwise what
// is queued up to the last boundary commits, or its outcome stays unknown.
// A fenced producer fails, which stops the stream.
func (t *simTx) commit() {
	w := t.p.w
	if t.p.dead {
		return
	}
	if t.fenced {
		t.p.pipe.Fail(&sink.TxError{TransactionalID: "cdc-outbox-sim", Op: "commit", Err: errors.New("fenced (simulated)")})
		return
	}
	if t.pending != nil {
		t.resolve(true)
		return
	}
	batch, through := t.q.Take()
	if len(batch) == 0 {
		return
	}
	t.pending = &txCommit{batch, through}
	if w.rng.IntN(5) == 0 {
		w.logf("%s: the commit of %d records through %s has an unknown outcome", t.p.name, len(batch), through.End)
		return
	}
	t.resolve(true)
}

// resolve ends the pending commit: committed (its records, its checkpoint,
// then the promises) or not (nothing of it in Kafka).
func (t *simTx) resolve(committed bool) {
	c := t.pending
	if c == nil {
		return
	}
	t.pending = nil
	w := t.p.w
	if !committed {
		w.logf("%s: the commit through %s did not happen", t.p.name, c.through.End)
		return
	}
	for _, q := range c.batch {
		w.kafka.land(t.p, q.R)
	}
	w.kafka.cps = append(w.kafka.cps, sink.Checkpoint{LSN: c.through.End, Found: true, Origin: simStream, Commit: c.through})
	t.committed = c.through.End
	w.logf("%s: committed %d records, checkpoint %s (xid %d, timeline %d, epoch %d, named %s)", t.p.name, len(c.batch), c.through.End,
		c.through.Xid, c.through.Timeline, c.through.Epoch, c.through.Named)
	if t.p.dead {
		return
	}
	for _, q := range c.batch {
		q.Promise(q.R, nil)
	}
}

// crash: a commit whose outcome is unknown committed or not; what is
// queued is gone.
func (t *simTx) crash() {
	if t.pending != nil {
		t.resolve(t.p.w.rng.IntN(2) == 0)
	}
}
