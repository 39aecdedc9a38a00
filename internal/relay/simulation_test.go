package relay

// The seeded, deterministic simulation of the recovery protocol: for a
// seed, a history of steps (transactions written, messages streamed,
// acknowledgements and Kafka commits, status updates, keepalives, lost
// connections, crashes, restarts, a hot standby's takeover, failovers with
// and without lost WAL, restores under the stream, the checkpoint topic
// away) drives the real pipeline, tracker, replication.Judge, the
// deliveries' holding and the lineage against a simulated PostgreSQL
// (sim_pg_test.go) and a simulated Kafka (sim_kafka_test.go). After every
// step the invariants of docs/architecture.md are checked
// (sim_check_test.go). No goroutine, no clock: the seed decides every
// order.
//
//	go test ./internal/relay -run TestSimulation -seed N -v   # one seed, its trace
//	go test ./internal/relay -run TestSimulation -seeds 100000

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
)

var (
	simSeed  = flag.Int64("seed", -1, "run the simulation of the recovery protocol for this seed only, printing its trace")
	simSeeds = flag.Int("seeds", 1000, "how many seeds the simulation of the recovery protocol runs")
)

// TestSimulation runs the simulation for -seeds seeds (both deliveries,
// by the seed's parity), or for the one seed -seed with its trace.
func TestSimulation(t *testing.T) {
	if *simSeed >= 0 {
		w := simulate(uint64(*simSeed))
		for _, l := range w.trace {
			t.Log(l)
		}
		if w.violation != "" {
			t.Fatalf("seed %d: %s", *simSeed, w.violation)
		}
		return
	}
	failed := 0
	steps := 0
	for seed := range uint64(*simSeeds) {
		w := simulate(seed)
		steps += w.steps
		if w.violation == "" {
			continue
		}
		failed++
		t.Logf("seed %d: %s", seed, w.violation)
		if failed == 1 {
			t.Errorf("seed %d: %s\ntrace (one step a line):\n%s\nreplay: go test ./internal/relay -run TestSimulation -seed %d -v",
				seed, w.violation, strings.Join(w.trace, "\n"), seed)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d seeds broke an invariant", failed, *simSeeds)
	}
	t.Logf("%d seeds, %d steps", *simSeeds, steps)
}

// stepError ends a seed's run at the first broken invariant.
type stepError struct{ msg string }

// world is one seed's run: the server streamed from, Kafka, the processes.
type world struct {
	rng          *rand.Rand
	exactly      bool
	tables       int
	srv          *server
	kafka        *kafka
	procs        []*process // alive, in start order
	nextProc     int
	uid          int // every event's content is unique across histories
	steps        int
	trace        []string
	violation    string
	repeatsOK    map[int]bool // uids exactly-once may publish twice: a checkpoint that names no commit (Decide: neither verify nor lost)
	restoredOnce bool
	restoredMet  bool // a process streamed from the server since its last restore
	// shard: in a third of the seeds the stream is one shard of four
	// (--shards): the simulated server sends it every message, as every
	// slot decodes them whatever the row filter, and it must pass over the
	// other shards' (event.foreign). Its rows stand for those the row
	// filter sends it.
	shard shard.Shard
	// registry: in a fifth of the seeds every outbox's values go through an
	// encoder whose schema registry goes away and comes back
	// (registryDown): the stream reads again from its confirmed position,
	// never a bad event, never a position past what Kafka holds.
	registry, registryDown bool
}

// simEncoder is a value encoder whose registry is the world's: it leaves
// the value as it is (the checks read it) or, while the registry is away,
// fails with FaultUnavailable, as package schema's does.
type simEncoder struct{ w *world }

func (simEncoder) Columns() []string { return nil }

func (e simEncoder) Encode(*kgo.Record, pipeline.EncodeEvent) error {
	if e.w.registryDown {
		return &pipeline.EncodeError{Fault: pipeline.FaultUnavailable, Err: errors.New("schema registry: no answer")}
	}
	return nil
}

// foreign reports whether the message of content uid is another shard's.
func (w *world) foreign(uid int) bool { return !w.shard.Keeps(messageAggregate(uid)) }

// unmet: the server was restored and not every process has met it since.
func (w *world) unmet() bool {
	if !w.restoredOnce {
		return false
	}
	for _, p := range w.procs {
		if p.stale {
			return true
		}
	}
	return !w.restoredMet
}

const (
	simStream = "7000/5/cdc_outbox" // the stream's identity: key and origin of its records
	dlqTopic  = "dlq"
	msgSource = "7000/5/messages"
	prefix    = "cdc_outbox"
)

func simulate(seed uint64) (w *world) {
	w = &world{rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), exactly: seed%2 == 1, repeatsOK: map[int]bool{}}
	w.tables = 1 + w.rng.IntN(3)
	if seed%3 == 0 { // from the seed, not the generator: the other seeds' histories stay as they were
		w.shard = shard.Shard{Index: int(seed/3) % 4, Count: 4}
	}
	w.registry = seed%5 == 2
	w.srv = newServer(w)
	w.kafka = newKafka()
	w.kafka.w = w
	delivery := AtLeastOnce
	if w.exactly {
		delivery = ExactlyOnce
	}
	w.logf("seed %d: %s, %d outbox tables, shard %s, value encoder %v", seed, delivery, w.tables, w.shard, w.registry)
	defer func() {
		if r := recover(); r != nil {
			se, ok := r.(stepError)
			if !ok {
				panic(r)
			}
			w.violation = se.msg
			w.logf("VIOLATION: %s", se.msg)
		}
	}()
	n := 100 + w.rng.IntN(201)
	for w.steps = 0; w.steps < n; w.steps++ {
		w.step()
		w.check()
	}
	w.drain()
	w.checkFinal()
	return w
}

func (w *world) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%4d ", w.steps)+fmt.Sprintf(format, args...))
}

func (w *world) fail(format string, args ...any) {
	panic(stepError{fmt.Sprintf("step %d: ", w.steps) + fmt.Sprintf(format, args...)})
}

// step does one thing the seed picks.
func (w *world) step() {
	type choice struct {
		weight int
		do     func()
	}
	var cs []choice
	add := func(weight int, do func()) { cs = append(cs, choice{weight, do}) }
	if !w.unmet() {
		// A restored server whose new WAL outgrows what the stream had
		// read before the stream meets it again is judged by positions
		// alone (Judge, LostPast) and cannot be seen: no transaction is
		// written until every process has met it.
		add(14, func() { w.srv.write() })
	}
	if len(w.procs) < 2 {
		add(map[bool]int{true: 30, false: 6}[len(w.procs) == 0], w.start)
	}
	holder := w.holder()
	for _, p := range w.procs {
		switch {
		case holder == nil:
			add(10, func() { p.connect() })
		case p.conn == nil:
			add(3, func() { p.connect() }) // a hot standby polls
		}
		if p.conn != nil {
			add(35, func() { p.deliver(1 + w.rng.IntN(6)) })
			add(8, func() { p.status() })
			add(5, func() { p.keepalive() })
			add(5, func() { p.lost("the connection broke") })
		}
		if w.exactly {
			add(15, func() { p.commit() })
		} else {
			add(15, func() { w.kafka.ack(p) })
		}
		add(3, func() { p.crash() })
		add(1, func() { p.stop() })
	}
	if !w.restoredOnce {
		// After a restore, which keeps the timeline's id, a failover
		// before the stream met the restored server would be judged by
		// positions alone (Judge, LostPast) and cannot be seen: left out.
		add(2, func() { w.failover() })
	}
	add(2, func() { w.restore() })
	if w.kafka.away {
		add(10, func() { w.kafka.setAway(false) })
	} else {
		add(1, func() { w.kafka.setAway(true) })
	}
	if w.registry {
		add(map[bool]int{true: 6, false: 2}[w.registryDown], func() {
			w.registryDown = !w.registryDown
			w.logf("the schema registry is %s", map[bool]string{true: "away", false: "back"}[w.registryDown])
		})
	}
	total := 0
	for _, c := range cs {
		total += c.weight
	}
	r := w.rng.IntN(total)
	for _, c := range cs {
		if r < c.weight {
			c.do()
			break
		}
		r -= c.weight
	}
	w.reap()
}

// holder is the process streaming from the slot, if any.
func (w *world) holder() *process {
	for _, p := range w.procs {
		if p.conn != nil {
			return p
		}
	}
	return nil
}

// start starts a process: it reads the slot's position (replication.Prepare)
// and assembles its parts as Relay.New does.
func (w *world) start() {
	w.nextProc++
	p := newProcess(w, fmt.Sprintf("P%d", w.nextProc), w.srv.slot)
	w.procs = append(w.procs, p)
	w.logf("%s starts at the slot's %s", p.name, w.srv.slot)
	p.connect() // Run follows New at once
}

// reap ends the processes whose stream failed (a producer's failure).
func (w *world) reap() {
	for _, p := range w.procs {
		if p.dead {
			continue
		}
		select {
		case err := <-p.pipe.Failed():
			p.exit(err)
		default:
		}
	}
	alive := w.procs[:0]
	for _, p := range w.procs {
		if !p.dead {
			alive = append(alive, p)
		}
	}
	w.procs = alive
}

// failover promotes a standby that received a prefix of the primary's WAL
// (all of it, or less: lost WAL); its timeline forks at the prefix's end.
func (w *world) failover() {
	old := w.srv
	// A standby of the primary on its timeline: it received the WAL of
	// this timeline up to a point.
	k := len(old.wal)
	if w.rng.IntN(2) == 0 {
		k = old.base + w.rng.IntN(len(old.wal)-old.base+1)
	}
	w.dropConnections("the primary went down")
	w.srv = old.promote(k)
	w.logf("failover to %s: timeline %d forks at %s (%d of %d WAL items; slot %s)", w.srv.addr, w.srv.tl, w.srv.flushed, k, len(old.wal), w.srv.slot)
}

// restore puts the server back from a copy of itself at an earlier point
// of its WAL: same system, same timeline; the slot as the copy had it, or
// made again where the WAL ends when everything before was confirmed.
func (w *world) restore() {
	old := w.srv
	k := old.base + w.rng.IntN(len(old.wal)-old.base+1) // a copy made on this timeline
	w.dropConnections("the server was put back from a copy of itself")
	w.srv = old.restored(k, w.rng.IntN(2) == 0)
	w.restoredOnce, w.restoredMet = true, false
	for _, p := range w.procs {
		p.stale = true
	}
	w.logf("restore: WAL back to %s (%d of %d items), slot %s", w.srv.flushed, k, len(old.wal), w.srv.slot)
}

func (w *world) dropConnections(why string) {
	if p := w.holder(); p != nil {
		p.lost(why)
	}
}

// drain ends the run: the checkpoint topic answers, no more faults, and
// one process streams until everything the server has is confirmed.
func (w *world) drain() {
	w.logf("drain")
	w.kafka.setAway(false)
	w.registryDown = false
	for i := 0; ; i++ {
		if i > 20000 {
			w.fail("the drain did not end: slot %s, WAL to %s", w.srv.slot, w.srv.flushed)
		}
		if len(w.procs) == 0 {
			w.start()
		}
		p := w.holder()
		if p == nil {
			p = w.procs[0]
			p.connect()
			w.reap()
			w.check()
			continue
		}
		p.deliver(10)
		for _, q := range w.procs {
			if w.exactly {
				q.commit()
			} else {
				for w.kafka.ack(q) {
				}
			}
		}
		w.reap()
		if p.dead || p.conn == nil {
			w.check()
			continue
		}
		p.keepalive()
		p.status()
		w.check()
		if p.conn != nil && p.conn.caughtUp() && p.pipe.InFlight() == 0 && w.srv.slot >= w.srv.end() {
			return
		}
	}
}

// process is one cdc-outbox process: its tracker, pipeline, lineage and
// delivery, made as Relay.New makes them, and its replication connection.
type process struct {
	w        *world
	name     string
	tracker  *checkpoint.Tracker
	pipe     *pipeline.Pipeline
	lineage  *lineage
	delivery delivery
	sink     *simSink // at-least-once
	txp      *simTx   // exactly-once
	// What replication.Stream keeps: the server streamed from (Was), its
	// history, the last position sent in a status update.
	was       replication.Server
	history   replication.History
	lastSent  pglogrepl.LSN
	conn      *walsender
	published checkpoint.Published // the last published record written
	confirmed pglogrepl.LSN        // the tracker's position after the last step
	dead      bool
	stale     bool // started before the server's last restore and has not met it
}

type silent struct{}

func (silent) LostHistory() {}

func newProcess(w *world, name string, start pglogrepl.LSN) *process {
	p := &process{w: w, name: name, tracker: checkpoint.New(start), confirmed: start}
	log := slog.New(slog.DiscardHandler)
	p.lineage = &lineage{store: w.kafka, topic: "cdc_outbox_checkpoints", stream: simStream,
		timeline: func() int32 { return p.history.Timeline }, lost: silent{}, log: log}
	var prod pipeline.Producer
	if w.exactly {
		p.txp = &simTx{p: p}
		prod = p.txp
	} else {
		p.sink = &simSink{p: p}
		prod = p.sink
	}
	entries := make([]mapping.Config, w.tables)
	var encoders []pipeline.Encoder
	for i := range entries {
		entries[i] = mapping.DefaultConfig()
		if w.registry {
			encoders = append(encoders, simEncoder{w})
		}
	}
	pipe, err := pipeline.New(pipeline.Config{
		Outboxes:          entries,
		OnBadEvent:        pipeline.DeadLetter,
		DeadLetterTopic:   dlqTopic,
		MessagePrefix:     prefix,
		MessageSource:     msgSource,
		MaxInflightEvents: 16,
		MaxInflightBytes:  1 << 30,
		MaxRecordBytes:    1 << 20,
		Lineage:           p.lineage,
		Shard:             w.shard,
		Encoders:          encoders,
	}, p.tracker, simCatalog{}, prod, nil, log)
	if err != nil {
		w.fail("pipeline.New: %v", err)
	}
	p.pipe = pipe
	if w.exactly {
		p.delivery = &exactlyOnce{txp: p.txp, store: w.kafka, lineage: p.lineage, pipe: pipe, obs: silent{}, fail: pipe.Fail, log: log,
			topic: "cdc_outbox_checkpoints", stream: simStream, id: "cdc-outbox-sim"}
	} else {
		p.delivery = &atLeastOnce{sink: p.sink, lineage: p.lineage, pipe: pipe}
	}
	return p
}

// Timeline and Connected are what the published record is read with
// (streamState).
func (p *process) Timeline() int32 { return p.history.Timeline }
func (p *process) Connected() bool { return p.conn != nil }

// connect is one session's start as replication.Stream runs it: follow
// (Judge), START_REPLICATION at the confirmed position, tookOver with the
// slot's position, then the delivery's holding.
func (p *process) connect() {
	w, s := p.w, p.w.srv
	now := replication.Server{SystemID: s.sys, Timeline: s.tl, Addr: s.addr}
	h := replication.History{Timeline: s.tl, Ends: s.endsCopy(), Flushed: s.flushed}
	v := replication.Judge(replication.Reconnection{Was: p.was, Now: now, History: h, Confirmed: p.tracker.Confirmed(), LastSent: p.lastSent, Newest: p.pipe.Newest()})
	p.stale = false
	if v.Err != nil {
		w.logf("%s connects to %s: %v", p.name, s.addr, short(v.Err))
		p.exit(v.Err)
		return
	}
	p.history, p.was = h, now
	if o := w.holder(); o != nil {
		// START_REPLICATION fails: the slot is active for another
		// process's walsender. Run calls Lost and polls again.
		p.pipe.Lost()
		return
	}
	start := p.tracker.Confirmed()
	held := s.slot
	p.lastSent = max(p.lastSent, held)
	p.tracker.Idle(held)
	first := w.exactly && !p.delivery.(*exactlyOnce).held
	if err := p.delivery.holding(context.Background(), h); err != nil {
		var later interface{ Retry() bool }
		if errors.As(err, &later) && later.Retry() {
			w.logf("%s connects at %s (slot %s): gives the connection up: %v", p.name, start, held, short(err))
			p.pipe.Lost()
			return
		}
		w.logf("%s connects at %s (slot %s): %v", p.name, start, held, short(err))
		p.exit(err)
		return
	}
	if first {
		w.noteRepeats(h) // what holding read, after its Fence
	}
	p.conn = s.startReplication(max(start, held))
	w.restoredMet = true
	w.logf("%s streams from %s on timeline %d at %s (asked %s, slot %s, epoch %d)", p.name, s.addr, s.tl, p.conn.start, start, held, p.pipe.Epoch())
}

// lost is a lost connection: the stream calls Lost and tries again.
func (p *process) lost(why string) {
	if p.conn == nil {
		return
	}
	p.w.logf("%s loses its connection: %s", p.name, why)
	p.conn = nil
	p.pipe.Lost()
}

// deliver hands the pipeline up to n messages, as the receive loop does:
// not while it is full.
func (p *process) deliver(n int) {
	for range n {
		if p.conn == nil || p.dead || p.pipe.Full() || p.conn.caughtUp() {
			return
		}
		m := p.conn.next()
		if err := p.pipe.WAL(m.lsn, m.data); err != nil {
			var again interface{ Resend() bool }
			if errors.As(err, &again) && again.Resend() {
				p.w.logf("%s: %s at %s: reads again: %v", p.name, m.what, m.lsn, short(err))
				p.lost("read again")
				return
			}
			p.w.logf("%s: %s at %s: %v", p.name, m.what, m.lsn, short(err))
			p.exit(err)
			return
		}
		if !p.w.exactly {
			// The published record, written here after every message
			// rather than every second: the simulation leaves out the
			// documented lag of up to a second (checkpoint.Published).
			at := func() checkpoint.Published {
				return checkpoint.Published{End: p.pipe.HandedOn(), Epoch: p.pipe.Epoch()}
			}
			if pub, err := p.lineage.publish(context.Background(), p, at, p.published); err == nil {
				p.published = pub
			}
		}
	}
	p.w.logf("%s: read to %s (confirmed %s, in flight %d)", p.name, p.conn.sentTo(), p.tracker.Confirmed(), p.pipe.InFlight())
}

// status is a standby status update: the confirmed position, never below
// the one sent before (replication.nextStatus), into the slot.
func (p *process) status() {
	if p.conn == nil {
		return
	}
	pos := max(p.tracker.Confirmed(), p.lastSent)
	p.lastSent = pos
	if pos > p.w.srv.slot {
		p.w.logf("%s: status update %s", p.name, pos)
		p.w.srv.slot = pos
	}
}

// keepalive is the walsender's keepalive with how far it has read.
func (p *process) keepalive() {
	if p.conn == nil {
		return
	}
	end := p.conn.walEnd(p.w.rng)
	if p.tracker.Idle(end) {
		p.w.logf("%s: keepalive %s moves the confirmed position", p.name, end)
	}
}

// commit is the exactly-once committer's turn.
func (p *process) commit() {
	if p.txp != nil {
		p.txp.commit()
	}
}

// crash is SIGKILL: everything in memory is gone; of what was on its way
// to Kafka, the seed decides what landed.
func (p *process) crash() {
	p.w.logf("%s is killed", p.name)
	if p.sink != nil {
		p.w.kafka.crash(p)
	}
	if p.txp != nil {
		p.txp.crash()
	}
	p.conn = nil
	p.dead = true
}

// stop is a clean stop: the stream drains (acknowledgements, the queued
// Kafka transactions), sends its final status update and exits.
func (p *process) stop() {
	p.w.logf("%s stops", p.name)
	if p.sink != nil {
		for p.w.kafka.ack(p) {
		}
	}
	for range 3 { // a commit of unknown outcome settled, what is queued, settled again
		p.commit()
	}
	if p.dead {
		return
	}
	p.status()
	p.conn = nil
	p.dead = true
}

// exit ends a process on err, as Relay.Run does: the lost history it
// stopped on is recorded first. Only the errors the protocol expects may
// stop a process.
func (p *process) exit(err error) {
	if p.dead {
		return
	}
	w := p.w
	if lerr := p.lineage.stopped(err, p.pipe.Epoch()); lerr != nil {
		w.logf("%s: recording the lost history failed: %v", p.name, short(lerr))
	}
	p.conn = nil
	p.dead = true
	w.logf("%s exits: %v", p.name, short(err))
	var (
		fe *replication.ForkError
		re *replication.RestoreError
		te *sink.TxError
	)
	switch {
	case errors.As(err, &fe), errors.As(err, &re), errors.As(err, &te):
	case w.kafka.away:
		// The checkpoint topic did not answer: the start's reads or an
		// epoch's write failed, and the restart tries again.
	default:
		w.fail("%s stopped on an error the protocol does not expect: %v", p.name, err)
	}
}

// noteRepeats: a checkpoint that names no commit (at a lone message) lets
// the start skip nothing, a repeat the guarantees document: the events up
// to it, or up to the fork when it is found lost past one, may be
// published twice.
func (w *world) noteRepeats(h replication.History) {
	cp, err := w.kafka.Read(context.Background(), simStream, simStream)
	if err != nil || !cp.Found {
		return
	}
	mark := checkpoint.Mark{End: cp.LSN, Timeline: cp.Commit.Timeline, Xid: cp.Commit.Xid, CommitTime: cp.Commit.CommitTime, Epoch: cp.Commit.Epoch, Named: cp.Commit.Named}
	trust := checkpoint.Decide(mark, h.Timeline, h.Ends, h.Flushed)
	limit := cp.LSN // not verified: nothing skipped
	switch {
	case trust.Verify:
		return
	case trust.Lost && trust.Skip < trust.LostFrom:
		limit = trust.LostFrom // lost past a fork, nothing skipped up to it
	case trust.Lost:
		return // the rest is a new epoch's
	}
	for _, it := range w.srv.wal {
		if it.end <= limit {
			for _, e := range it.events {
				w.repeatsOK[e.uid] = true
			}
		}
	}
	w.logf("the checkpoint at %s names no commit (%s): what is before it may be repeated", cp.LSN, trust.Why)
}

// simCatalog: relations 1 to 3 are the outbox tables, 100 another table.
type simCatalog struct{}

func (simCatalog) Classify(rel *decoder.Relation) (decoder.Role, decoder.Outbox, string, error) {
	if rel.ID >= 1 && rel.ID <= 3 {
		return decoder.RoleOutbox, decoder.Outbox{Entry: int(rel.ID) - 1, OID: rel.ID, Schema: "public", Name: rel.Name,
			Identity: fmt.Sprintf("7000/5/%d", rel.ID)}, "an outbox table", nil
	}
	return decoder.RoleOther, decoder.Outbox{}, "another table", nil
}

// short is an error's first clause, for the trace.
func short(err error) string {
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// TestSimulationIsDeterministic: a seed replays the same history, so that
// a failing seed's trace is the failure's (but for when an epoch was
// found, which the lineage stamps with the clock).
func TestSimulationIsDeterministic(t *testing.T) {
	stamp := regexp.MustCompile(`"found_at":"[^"]*"`)
	for _, seed := range []uint64{5, 8} { // both deliveries, each with epochs found
		a, b := simulate(seed), simulate(seed)
		ta := stamp.ReplaceAllString(strings.Join(a.trace, "\n"), "")
		tb := stamp.ReplaceAllString(strings.Join(b.trace, "\n"), "")
		if ta != tb || a.steps == 0 {
			t.Fatalf("seed %d ran two histories (%d and %d lines)", seed, len(a.trace), len(b.trace))
		}
	}
}
