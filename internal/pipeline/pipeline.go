// Package pipeline joins the data path: pgoutput messages from the
// replication stream are decoded, mapped to Kafka records, produced, and
// their acknowledgements reported to the checkpoint.
//
// It owns the per-event decisions: which transaction a record belongs to,
// which relations are an outbox's and which outbox's (asking the catalog
// about each relation the stream describes that is not yet known as an
// outbox's, and keeping the answer in the registry of the stream's outboxes,
// outboxes.go, with each one's mapping and source), what happens to a
// bad event (stop, or dead-letter by explicit policy), and how much may be
// in flight before reading pauses. It must never drop an
// event silently, never let the checkpoint pass an event that went nowhere,
// and never wait on Kafka (the replication loop calls it and must stay free
// to send status updates).
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
)

// Bad-event policies.
const (
	Fail       = "fail"
	DeadLetter = "dead-letter"
)

// Config is the pipeline's share of the streamer's configuration.
type Config struct {
	// Mapping is the outbox's mapping; Outboxes, when set, are several
	// outboxes' instead, in the catalog's order of entries (decoder.Outbox
	// Entry). An empty Source is the table's identity.
	Mapping    mapping.Config
	Outboxes   []mapping.Config
	OnBadEvent string // Fail or DeadLetter
	// OnBadEvents is each outbox's own policy, by its entry's index in
	// Outboxes; a missing or empty one is OnBadEvent's. Events of no
	// outbox (messages, rows of unmapped relations) take OnBadEvent: a
	// payments outbox may stop the stream while tenants' dead-letter.
	OnBadEvents       []string
	DeadLetterTopic   string
	MaxInflightEvents int
	MaxInflightBytes  int64
	// MessagePrefix marks outbox messages (pg_logical_emit_message):
	// those are published as events, messages of other prefixes passed
	// over. Empty: every message is passed over.
	MessagePrefix string
	// MessageSource is the source header of the events that come as
	// messages, which belong to no table; they are mapped with the first
	// outbox's settings otherwise.
	MessageSource string
	// MaxRecordBytes is the largest record the broker accepts
	// (message.max.bytes); larger rows are bad events before they are sent.
	MaxRecordBytes int
	// Explain renders an error where the pipeline speaks itself (a
	// dead-letter record's error header, the log), with what to do: the
	// command's advice. nil renders err.Error().
	Explain func(error) string
	// Tracer follows each event in a span from its commit to the broker's
	// answer (internal/tracing); nil, the default, does nothing per event.
	Tracer Tracer
	// Lineage records a history epoch when the stream finds, in
	// exactly-once delivery, that the Kafka checkpoint is of a history
	// the server does not have (epoch.go); nil records none.
	Lineage Lineage
	// Encoders, when set, are each outbox's (Mapping's, or Outboxes' in
	// their order) value encoder (encode.go), nil for the payload as it
	// is; the first also encodes the outbox messages, which are mapped by
	// the first outbox's settings.
	Encoders []Encoder
	// Shard is the shard of a stream split over several slots that this
	// pipeline streams; the zero value: the stream is not split.
	Shard shard.Shard
}

// Tracer starts an event's span when its record is produced: the child of
// the trace context in rec's headers, whose context it writes back into
// them. end is called once, with the broker's first answer.
type Tracer interface {
	Start(rec *kgo.Record, eventID, source string, lsn pglogrepl.LSN, commitUnixNano int64) (end func(*kgo.Record, error))
}

// Catalog says what a relation the stream describes is; replication.Catalog
// implements it from the database's catalog. The pipeline asks it from the
// replication loop, on each Relation message of a relation not yet known to
// be the outbox, before any change of that relation is decided on. why is a
// phrase for the log, or, for RoleUnmapped, why the relation cannot be
// mapped and what to do. An error wrapping replication.ErrCatalog makes the
// stream read the transaction again on a new connection.
type Catalog interface {
	Classify(rel *decoder.Relation) (role decoder.Role, outbox decoder.Outbox, why string, err error)
}

// Producer is the sink as the pipeline sees it: franz-go's Produce. It
// hands r to the client and returns at once, without waiting on the broker;
// promise is called once with the broker's answer (nil once it has the
// record), serially and in order per partition, as franz-go calls promises.
type Producer interface {
	Produce(r *kgo.Record, promise func(*kgo.Record, error))
}

// Transactional is a Producer that writes whole PostgreSQL transactions in
// Kafka transactions (exactly-once delivery): a record's promise says nil
// once the Kafka transaction holding it committed, with a checkpoint of the
// last PostgreSQL transaction it holds. sink.Transactional is one. A
// pipeline whose producer is one tells it where each PostgreSQL
// transaction ends, drops the records of one the connection lost, and skips
// a transaction the server sends again that Kafka already holds.
type Transactional interface {
	Producer
	// Boundary: every record produced so far belongs to transactions that
	// ended at or before end; xid and commitTime are of the one that ended
	// at end, which the checkpoint names.
	Boundary(end pglogrepl.LSN, xid uint32, commitTime time.Time)
	// Discard drops the records produced since the last boundary, which
	// are in no Kafka transaction yet, and returns them; their promises
	// are never called.
	Discard() []*kgo.Record
}

// Pipeline implements replication.Handler.
type Pipeline struct {
	cfg Config
	// otherShard counts messages another shard streams (OtherShard).
	otherShard atomic.Uint64
	dec        *decoder.Decoder
	catalog    Catalog
	reg        *registry
	// mapper is the first outbox's, which names the event of a row no
	// outbox can be told for (its id column is the likeliest).
	mapper  *mapping.Mapper
	ckpt    *checkpoint.Tracker
	sink    Producer
	promise func(*kgo.Record, error) // ack, made once: a method value per record would allocate
	explain func(error) string
	log     *slog.Logger

	// unmapped says, for each relation the catalog could not map, why.
	unmapped map[uint32]string

	cols []mapping.Column // reused for every unmapped insert and message, in mapper's order
	idx  []int            // mapper's columns in the decoder's
	// lone is set while a non-transactional message's dead-letter record
	// is sent (replication goroutine only).
	lone bool
	tx   *checkpoint.Tx // the open transaction, nil between Commit and Begin
	// commitTime of the open transaction, unix nanoseconds, and its xid.
	commitTime int64
	xid        uint32

	inflight      atomic.Int64
	inflightBytes atomic.Int64
	room          chan struct{}
	failed        chan error
	sent          uint64 // records produced so far; orders them (replication goroutine only)

	// Records the broker refused in a batch are sent again one at a time
	// (refused.go). isolating is set while any is left; the rest is
	// guarded by mu.
	isolating atomic.Bool
	mu        sync.Mutex
	refusedQ  []*pending // refused in a batch, in promise order: to send alone
	alone     *pending   // sent alone, not yet acknowledged or refused
	next      *pending   // to produce next from the replication goroutine

	// d is what the delivery does with the stream's transactions
	// (delivery.go): at-least-once or exactly-once. skipping is set while
	// the open transaction is one the producer holds whole already
	// (replication goroutine only).
	d        delivery
	skipping bool

	// History epochs (epoch.go): the stream's, and the one of the open
	// transaction, whose sources the mappers have (replication goroutine
	// only; epochNow for other goroutines). msgCfg is the messages'
	// mapping in the first history.
	epochs   checkpoint.Epochs
	epoch    int
	epochNow atomic.Int64
	msgCfg   mapping.Config

	obs Observer
}

// What an event came as, for the Observer: an outbox row, or an outbox
// message (pg_logical_emit_message).
const (
	KindRow     = "row"
	KindMessage = "message"
)

// Observer is told what happens to events; metrics implement it. kind is
// KindRow or KindMessage.
type Observer interface {
	// Acked: an event reached the broker; commitUnixNano is its
	// transaction's commit time.
	Acked(topic, kind string, commitUnixNano int64)
	// Received: a transaction that committed at commitUnixNano began to
	// arrive.
	Received(commitUnixNano int64)
	// Bad: an event could not be published; action is failed or
	// dead_lettered.
	Bad(action, kind string)
	// TimestampReplaced: an event's created_at was too far ahead for the
	// broker, and the record carries the produce time instead.
	TimestampReplaced()
	// LostHistory: Kafka holds events of WAL that the server streamed
	// from no longer has (a failover past what its standby received, a
	// restore): their ids may be handed out again to other events.
	LostHistory()
}

type noObserver struct{}

func (noObserver) Acked(string, string, int64) {}
func (noObserver) Received(int64)              {}
func (noObserver) Bad(string, string)          {}
func (noObserver) TimestampReplaced()          {}
func (noObserver) LostHistory()                {}

// New builds a pipeline that produces to sink; obs may be nil.
func New(cfg Config, ckpt *checkpoint.Tracker, catalog Catalog, sink Producer, obs Observer, log *slog.Logger) (*Pipeline, error) {
	entries := cfg.Outboxes
	if len(entries) == 0 {
		entries = []mapping.Config{cfg.Mapping}
	}
	reg, err := newRegistry(entries, cfg.Encoders)
	if err != nil {
		return nil, err
	}
	// mapper maps messages (and names a row no outbox can be told for):
	// the first outbox's settings, with the messages' source.
	first := entries[0]
	if cfg.MessageSource != "" {
		first.Source = cfg.MessageSource
	}
	m, err := mapping.New(first)
	if err != nil {
		return nil, err
	}
	if err := checkPolicy(cfg.OnBadEvent, cfg.DeadLetterTopic); err != nil {
		return nil, err
	}
	if len(cfg.OnBadEvents) > len(entries) {
		return nil, fmt.Errorf("%d bad-event policies for %d outboxes", len(cfg.OnBadEvents), len(entries))
	}
	for i, policy := range cfg.OnBadEvents {
		if policy == "" {
			continue
		}
		if err := checkPolicy(policy, cfg.DeadLetterTopic); err != nil {
			return nil, fmt.Errorf("outbox %d: %w", i+1, err)
		}
		reg.policies[i] = policy
	}
	if obs == nil {
		obs = noObserver{}
	}
	p := &Pipeline{
		cfg:      cfg,
		dec:      decoder.New(reg.wanted),
		catalog:  catalog,
		reg:      reg,
		mapper:   m,
		ckpt:     ckpt,
		sink:     sink,
		log:      log.With("component", "pipeline"),
		unmapped: make(map[uint32]string),
		cols:     make([]mapping.Column, len(m.Columns())),
		room:     make(chan struct{}, 1),
		failed:   make(chan error, 1),
		obs:      obs,
		msgCfg:   first,
	}
	p.promise = p.ack
	for _, c := range m.Columns() {
		p.idx = append(p.idx, slices.Index(reg.wanted, c))
	}
	if cfg.MessagePrefix != "" {
		p.dec.Messages(cfg.MessagePrefix)
	}
	if txp, ok := sink.(Transactional); ok {
		p.d = &exactlyOnce{p: p, txp: txp}
	} else {
		p.d = &atLeastOnce{p: p}
	}
	if p.explain = cfg.Explain; p.explain == nil {
		p.explain = func(err error) string { return err.Error() }
	}
	return p, nil
}

// SkipThrough sets, in exactly-once delivery, the position the Kafka
// checkpoint holds: every transaction that ended at or before it is in
// Kafka already, so one the server sends again is skipped. Call it from
// the replication goroutine, before the first message.
func (p *Pipeline) SkipThrough(lsn pglogrepl.LSN) {
	if eo, ok := p.d.(*exactlyOnce); ok {
		eo.through = max(eo.through, lsn)
	}
}

// SkippedTransactions counts, in exactly-once delivery, the transactions
// the server sent again that Kafka already held.
func (p *Pipeline) SkippedTransactions() uint64 {
	if eo, ok := p.d.(*exactlyOnce); ok {
		return eo.skippedTx.Load()
	}
	return 0
}

// Skipped counts the changes that were not published, by reason.
func (p *Pipeline) Skipped() decoder.SkipCounts { return p.dec.Skipped() }

// OtherShard counts the outbox messages passed over because another shard
// streams them.
func (p *Pipeline) OtherShard() uint64 { return p.otherShard.Load() }

// ownMessage reports whether this pipeline's shard streams the outbox
// message ev. Every slot decodes every message whatever its publication's
// row filter, so each shard keeps those whose aggregate id hashes to it, as
// the row filter hashes a row's. A message whose aggregate id cannot be
// read is shard 0's, where it is a bad event once, not once per shard.
func (p *Pipeline) ownMessage(ev *decoder.Event) bool {
	if !p.cfg.Shard.Split() {
		return true
	}
	id, ok := mapping.MessageAggregateID(ev.Content)
	if !ok {
		return p.cfg.Shard.Index == 0
	}
	return p.cfg.Shard.Keeps(id)
}

// pending is one record on its way to the broker. The record's Context
// points back at it, so the acknowledgement finds its transaction without a
// map lookup or a closure, and record and bookkeeping are one allocation.
type pending struct {
	context.Context // Background: franz-go only reads Done, which is nil
	rec             kgo.Record
	tx              *checkpoint.Tx
	lsn             pglogrepl.LSN
	size            int64
	commitTime      int64                    // unix nanoseconds, for latency
	seq             uint64                   // production order
	rel             *decoder.Relation        // the row's relation, named in a dead-letter record; nil for a message
	outbox          *outbox                  // the row's outbox; nil for a message or when none can be told
	endSpan         func(*kgo.Record, error) // the event's span, nil when not traced
	// dead is set when the record is a dead-letter record: what it sets
	// aside, logged once the broker has it.
	dead *deadLetter
	// sent is what is remembered of the record's transaction (resend.go,
	// at-least-once only), sentSeq the record's number in it and at its
	// change's position.
	sent    *sentTx
	sentSeq uint32
	at      position
}

// kind is what the event came as, for the Observer.
func (pd *pending) kind() string {
	if pd.rel == nil {
		return KindMessage
	}
	return KindRow
}

func (p *Pipeline) newPending(lsn pglogrepl.LSN, rel *decoder.Relation) *pending {
	pd := &pending{Context: context.Background(), tx: p.tx, lsn: lsn, rel: rel}
	if rel != nil {
		pd.outbox = p.reg.byRel[rel.ID]
	}
	return pd
}

// WAL handles one pgoutput message that starts at lsn.
func (p *Pipeline) WAL(lsn pglogrepl.LSN, data []byte) error {
	ev, err := p.dec.Decode(data)
	if err != nil {
		return fmt.Errorf("decode the pgoutput message at LSN %s: %w", lsn, err)
	}
	switch ev.Kind {
	case decoder.KindBegin:
		p.tx = p.ckpt.Begin(ev.CommitTime)
		p.commitTime = ev.CommitTime.UnixNano()
		p.xid = ev.Xid
		p.obs.Received(p.commitTime)
		if p.skipping, err = p.d.begin(ev.Xid, ev.FinalLSN, p.commitTime); err != nil {
			return err
		}
		if len(p.epochs) > 0 {
			return p.epochBegin(ev.FinalLSN)
		}
	case decoder.KindRelation:
		return p.relation(ev)
	case decoder.KindInsert, decoder.KindUnmapped:
		if p.tx == nil {
			return fmt.Errorf("insert at LSN %s outside a transaction: the stream is out of order", lsn)
		}
		if p.skipping {
			return nil // Kafka has it, or its dead-letter record
		}
		if p.d.again(lsn) {
			return nil // the broker has it, from the transaction's sending before
		}
		if ev.Kind == decoder.KindUnmapped {
			return p.unmappedInsert(lsn, ev)
		}
		return p.insert(lsn, ev)
	case decoder.KindMessage:
		if !p.ownMessage(ev) {
			p.otherShard.Add(1)
			return nil
		}
		if !ev.Transactional {
			return p.loneMessage(lsn, ev)
		}
		if p.tx == nil {
			return fmt.Errorf("transactional message at LSN %s outside a transaction: the stream is out of order", lsn)
		}
		if p.skipping {
			return nil
		}
		// A change of its transaction like a row: sent again, it comes at
		// the same place.
		if p.d.again(lsn) {
			return nil // the broker has it, from the transaction's sending before
		}
		return p.message(lsn, ev)
	case decoder.KindCommit:
		if p.tx == nil {
			return fmt.Errorf("commit at LSN %s without a begin: the stream is out of order", lsn)
		}
		// Before the tracker's Commit: the records are then whole
		// transactions when the producer's promises come.
		tentative, err := p.d.commit(ev.EndLSN, p.xid, ev.CommitTime, p.skipping)
		if tentative || err != nil {
			return err
		}
		p.skipping = false
		p.ckpt.Commit(p.tx, ev.EndLSN)
		p.tx = nil
	}
	return nil
}

// relation settles the role of a relation the stream describes, before any
// change of it: pgoutput sends a Relation message ahead of the first change
// of each relation in a session, and again after the relation changed
// (altered, renamed, attached as a partition). A relation known to be the
// outbox stays so for the life of the process: renamed or moved, it is the
// same table; detached, it sends no more rows, or, in a publication that
// publishes it on its own (FOR ALL TABLES, FOR TABLES IN SCHEMA), its later
// rows are published as the outbox's until the next start, which is a
// repeat at worst, never a loss. Any other relation is looked up on each of
// its Relation messages, so a table attached as a partition since it was
// last looked up becomes the outbox's.
func (p *Pipeline) relation(ev *decoder.Event) error {
	rel, prev := ev.Relation, ev.Replaced
	if rel.Role != decoder.RoleOutbox {
		role, ob, why, err := p.catalog.Classify(rel)
		if err != nil {
			return fmt.Errorf("relation %s.%s (OID %d): %w", rel.Namespace, rel.Name, rel.ID, err)
		}
		var isNew bool
		if role == decoder.RoleOutbox {
			// Registered before the role is assigned: an insert of a
			// relation with RoleOutbox always finds its outbox.
			var o *outbox
			if o, isNew, err = p.reg.add(rel.ID, ob); err != nil {
				return fmt.Errorf("relation %s.%s (OID %d): %w", rel.Namespace, rel.Name, rel.ID, err)
			}
			if isNew && o.OID == rel.ID {
				p.log.Info("streaming a new outbox table", "table", o.Table(), "oid", o.OID, "source", o.source)
			}
		}
		was := rel.Role
		rel = p.dec.Assign(rel.ID, role)
		delete(p.unmapped, rel.ID)
		switch {
		case role == decoder.RoleUnmapped:
			p.unmapped[rel.ID] = why
		case role == was:
		case role == decoder.RoleOutbox:
			p.log.Info("streaming the inserts of a relation of the outbox", "relation", rel.Namespace+"."+rel.Name, "oid", rel.ID, "is", why)
		case role == decoder.RoleOther:
			p.log.Info("the publication sends a table that is not the outbox: its inserts are skipped (other_table)",
				"relation", rel.Namespace+"."+rel.Name, "oid", rel.ID, "is", why)
		}
	}
	if o := p.reg.byRel[rel.ID]; rel.Role == decoder.RoleOutbox && o != nil {
		p.checkContract(rel, o)
	}
	if rel.Role == decoder.RoleOutbox && prev != nil && (prev.Namespace != rel.Namespace || prev.Name != rel.Name) {
		p.log.Info("a relation of the outbox was renamed or moved; streaming goes on: cdc-outbox follows the relation, not its name",
			"oid", rel.ID, "from", prev.Namespace+"."+prev.Name, "to", rel.Namespace+"."+rel.Name)
	}
	return nil
}

// unmappedInsert is an insert the publication sent from a relation that the
// catalog cannot tie to the outbox: a bad event, never a skip, so the
// confirmed position cannot pass it unless it reached the dead-letter topic.
func (p *Pipeline) unmappedInsert(lsn pglogrepl.LSN, ev *decoder.Event) error {
	rel := ev.Relation
	fill(ev, rel, p.idx, p.cols)
	why, ok := p.unmapped[rel.ID]
	if !ok {
		why = "it was never looked up in the catalog" // cannot happen: every Relation message is
	}
	return p.bad(ev, &BadEventError{EventID: p.mapper.EventID(p.cols), LSN: lsn,
		Err: &UnmappedError{Relation: rel.Namespace + "." + rel.Name, OID: rel.ID, Why: why}})
}

// fill puts an insert's values of the columns idx picks from the decoder's
// into cols.
func fill(ev *decoder.Event, rel *decoder.Relation, idx []int, cols []mapping.Column) {
	for i, w := range idx {
		v := ev.Values[w]
		c := &cols[i]
		c.Data, c.Null, c.Missing, c.TypeOID = v.Data, v.Null(), v.Missing(), 0
		if j := rel.Wanted[w]; j >= 0 {
			c.TypeOID = rel.Columns[j].TypeOID
		}
	}
}

func (p *Pipeline) insert(lsn pglogrepl.LSN, ev *decoder.Event) error {
	pd := p.newPending(lsn, ev.Relation)
	o := pd.outbox
	if o == nil {
		// Cannot happen: a relation is given RoleOutbox only once its
		// outbox is registered.
		return fmt.Errorf("insert at LSN %s into relation %s.%s (OID %d), an outbox's whose outbox is not registered", lsn, ev.Relation.Namespace, ev.Relation.Name, ev.Relation.ID)
	}
	fill(ev, ev.Relation, o.idx, o.cols)
	if err := o.mapper.Map(o.cols, &pd.rec); err != nil {
		var me *mapping.BadEventError
		if !errors.As(err, &me) {
			return fmt.Errorf("map the row at LSN %s: %w", lsn, err)
		}
		return p.bad(ev, &BadEventError{EventID: me.EventID, LSN: lsn, Err: me})
	}
	if o.enc != nil {
		for i, w := range o.encIdx {
			o.encVal[i] = nil
			if v := ev.Values[w]; !v.Null() && !v.Missing() {
				o.encVal[i] = v.Data
			}
		}
		if done, err := p.encode(lsn, ev, pd, o.enc, EncodeEvent{EventType: o.mapper.EventType(o.cols), Columns: o.encVal}); done {
			return err
		}
	}
	return p.publish(lsn, ev, pd)
}

// message is an outbox message inside a transaction: the record a row of
// its values would be, in its place among the transaction's rows.
func (p *Pipeline) message(lsn pglogrepl.LSN, ev *decoder.Event) error {
	pd := p.newPending(lsn, nil)
	if err := p.mapper.MapMessage(ev.Content, p.cols, &pd.rec); err != nil {
		var me *mapping.BadEventError
		if !errors.As(err, &me) {
			return fmt.Errorf("map the message at LSN %s: %w", lsn, err)
		}
		return p.bad(ev, &BadEventError{EventID: me.EventID, LSN: lsn, Err: me})
	}
	if enc := p.reg.encoder(0); enc != nil {
		if done, err := p.encode(lsn, ev, pd, enc, EncodeEvent{EventType: p.mapper.EventType(p.cols)}); done {
			return err
		}
	}
	return p.publish(lsn, ev, pd)
}

// loneMessage is an outbox message emitted non-transactionally: PostgreSQL
// writes it at once and sends it even if its transaction rolls back, so it
// is no outbox event, whatever it says, and is a bad event. It comes
// outside any transaction, at the end of its WAL record: under dead-letter
// its dead-letter record makes a transaction of its own there, which the
// checkpoint confirms once the broker has it; a restart from there does
// not send the message again.
func (p *Pipeline) loneMessage(lsn pglogrepl.LSN, ev *decoder.Event) error {
	if p.tx != nil {
		return fmt.Errorf("non-transactional message at LSN %s inside a transaction: the stream is out of order", lsn)
	}
	at := max(lsn, ev.MessageLSN)
	if skip, err := p.d.lone(at); skip || err != nil {
		return err // nil: Kafka holds its dead-letter record, or may
	}
	be := &BadEventError{EventID: mapping.MessageEventID(ev.Content), LSN: at, Err: &NonTransactionalError{Prefix: p.cfg.MessagePrefix}}
	if p.policy(nil) == Fail {
		return p.bad(ev, be)
	}
	now := time.Now()
	p.tx = p.ckpt.Begin(now)
	p.commitTime = now.UnixNano()
	// No transaction of the server's: nothing to remember for a sending
	// again (resend.go); sent again, it is set aside again.
	p.lone = true
	_ = p.bad(ev, be) // under dead-letter: the record is sent, nil returned
	p.lone = false
	p.d.loneEnded(at)
	p.ckpt.Commit(p.tx, at)
	p.tx = nil
	return nil
}

// publish sends pd, mapped from ev, after the checks every record passes.
func (p *Pipeline) publish(lsn pglogrepl.LSN, ev *decoder.Event, pd *pending) error {
	if ts := pd.rec.Timestamp; ts.After(time.Now().Add(MaxTimestampAhead)) {
		p.obs.TimestampReplaced()
		p.log.Warn("created_at is too far ahead for Kafka, which refuses timestamps more than an hour ahead by default: the record carries the produce time instead. Check the writer's clock, or whether the column is timestamp without time zone written in local time",
			"event_id", eventID(&pd.rec), "lsn", lsn, "created_at", ts, "max_ahead", MaxTimestampAhead.String())
		pd.rec.Timestamp = time.Time{}
	}
	pd.size = RecordSize(&pd.rec)
	if int(pd.size) > p.cfg.MaxRecordBytes {
		return p.bad(ev, &BadEventError{EventID: eventID(&pd.rec), LSN: lsn,
			Err: &TooLargeError{Size: pd.size, Limit: p.cfg.MaxRecordBytes}})
	}
	if p.cfg.Tracer != nil {
		// After the size check: the traceparent it writes replaces the
		// row's, or adds one that recordOverhead leaves room for.
		source := p.mapper.Source() // a message's
		if pd.outbox != nil {
			source = pd.outbox.mapper.Source()
		}
		pd.endSpan = p.cfg.Tracer.Start(&pd.rec, eventID(&pd.rec), string(source), lsn, p.commitTime)
	}
	p.send(pd)
	return nil
}

// MaxTimestampAhead is how far ahead of the streamer's clock a created_at
// may be and still become the record's timestamp. Kafka refuses a record
// more than message.timestamp.after.max.ms ahead of the broker's clock (one
// hour by default since Kafka 3.6) with INVALID_TIMESTAMP; five minutes of
// margin cover a broker clock somewhat behind this one. A later timestamp
// is replaced by the produce time, so a wrong clock never stops the stream;
// a broker set stricter refuses the record, and the bad-event policy
// applies.
const MaxTimestampAhead = time.Hour - 5*time.Minute

// recordOverhead is a generous bound on a record's framing in a batch, so
// the size check errs on the side of "too big" rather than a broker refusal.
const recordOverhead = 512

// RecordSize is that bound for r: what the record size limit is compared with.
func RecordSize(r *kgo.Record) int64 {
	n := len(r.Key) + len(r.Value) + len(r.Topic) + recordOverhead
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return int64(n)
}

func (p *Pipeline) send(pd *pending) {
	pd.commitTime = p.commitTime
	pd.seq = p.sent
	p.sent++
	if pd.size == 0 {
		pd.size = RecordSize(&pd.rec)
	}
	// Set last: the mapping fills the record whole.
	pd.rec.Context = pd
	// Add before Produce: the ack may arrive before Produce returns.
	p.ckpt.Add(pd.tx, 1)
	p.inflight.Add(1)
	p.inflightBytes.Add(pd.size)
	p.d.produced(pd, p.lone)
	p.sink.Produce(&pd.rec, p.promise)
}

// ack is the promise of every record: the broker's answer.
func (p *Pipeline) ack(r *kgo.Record, err error) {
	pd := r.Context.(*pending)
	if pd.endSpan != nil {
		// The span ends with the broker's first answer; a refused record
		// sent again alone is not traced again.
		pd.endSpan(r, err)
		pd.endSpan = nil
	}
	switch {
	case err == nil:
		p.acked(pd)
	case errors.Is(err, kgo.ErrClientClosed):
		// The producer was closed on shutdown, after the shutdown timeout,
		// with the record unacknowledged. Its position was never
		// confirmed, so the next start sends it again: not a bad event.
	case pd.dead != nil:
		// Nowhere left to put the event.
		p.obs.Bad("failed", pd.kind())
		pd.countFailed()
		p.fail(&DeadLetterError{EventID: pd.dead.id, LSN: pd.lsn, Err: &RefusedError{Topic: r.Topic, DeadLetter: true, Err: err}})
	case recordRefused(err):
		p.refused(pd, err)
	default:
		// The cluster refuses (authorization, a topic that does not
		// exist): every record would fail alike. The transaction never
		// completes, so the confirmed position stays before it; stop.
		p.obs.Bad("failed", pd.kind())
		pd.countFailed()
		p.fail(&ProduceError{EventID: eventID(r), LSN: pd.lsn, Err: &RefusedError{Topic: r.Topic, Err: err}})
	}
}

// acked settles a record the broker has.
func (p *Pipeline) acked(pd *pending) {
	if p.isolating.Load() {
		p.ackedWhileIsolating(pd)
	}
	if o := pd.outbox; o != nil && pd.dead != nil {
		o.deadLettered.Add(1)
	} else if o != nil {
		o.events.Add(1)
		o.last.Store(pd.commitTime)
	}
	if pd.dead != nil {
		p.obs.Bad("dead_lettered", pd.kind())
		p.log.Warn("bad event sent to the dead-letter topic", "event_id", pd.dead.id, "lsn", pd.lsn, "topic", pd.rec.Topic, "error", pd.dead.reason)
	}
	p.obs.Acked(pd.rec.Topic, pd.kind(), pd.commitTime)
	if pd.sent != nil {
		pd.sent.acked(pd.sentSeq, pd.at)
	}
	p.ckpt.Ack(pd.tx)
	p.inflight.Add(-1)
	p.inflightBytes.Add(-pd.size)
	p.wake()
}

// countFailed counts a record that stopped the stream as its outbox's.
func (pd *pending) countFailed() {
	if pd.outbox != nil {
		pd.outbox.failed.Add(1)
	}
}

// wake tells a paused stream to ask Full again.
func (p *Pipeline) wake() {
	select {
	case p.room <- struct{}{}:
	default:
	}
}

// Fail stops the stream with err, as a failure of the producer does: the
// exactly-once producer's failures come this way, not through promises.
func (p *Pipeline) Fail(err error) { p.fail(err) }

func (p *Pipeline) fail(err error) {
	select {
	case p.failed <- err:
	default: // the first failure is the one that stops the stream
	}
}

// eventID reads the event id of a record the mapping made, in any record
// format, or of a dead-letter record.
func eventID(r *kgo.Record) string {
	if id := mapping.RecordEventID(r); id != "" {
		return id
	}
	return "?"
}

// Full reports whether reading must pause. The replication goroutine asks
// it before every message, so while refused records are sent again one at
// a time it also produces the next of them (refused.go): all producing
// stays on that goroutine, in one order.
func (p *Pipeline) Full() bool {
	if p.isolating.Load() {
		return p.isolate()
	}
	// The open transaction's records wait for its commit before any Kafka
	// transaction takes them (exactly-once): counting them could pause
	// reading before the commit that lets them go.
	return p.InFlight() >= p.cfg.MaxInflightEvents || p.InFlightBytes() >= p.cfg.MaxInflightBytes
}

// Room receives after acknowledgements.
func (p *Pipeline) Room() <-chan struct{} { return p.room }

// Failed receives the first asynchronous failure.
func (p *Pipeline) Failed() <-chan error { return p.failed }

// InFlight is the number of records not yet acknowledged, but for those of
// the open transaction in exactly-once delivery, which wait for its commit.
// (A drain waits for it to reach 0: they would never come.)
func (p *Pipeline) InFlight() int {
	open, _ := p.d.waiting()
	return int(p.inflight.Load() - open)
}

// InFlightBytes is the estimated size of the records InFlight counts.
func (p *Pipeline) InFlightBytes() int64 {
	_, open := p.d.waiting()
	return p.inflightBytes.Load() - open
}

// Lost forgets the open transaction: the server sends it again whole.
// Records of it already produced stay in Kafka (at-least-once), and their
// acknowledgements are ignored by the checkpoint; what the broker
// acknowledged of it, and of the transactions before it not yet confirmed,
// is not published again when the server sends them again (resend.go).
func (p *Pipeline) Lost() {
	p.d.lost()
	p.skipping = false
	if p.tx != nil {
		p.ckpt.Discard(p.tx)
		p.tx = nil
	}
}
