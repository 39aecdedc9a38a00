package pipeline

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
)

// registry is the outboxes of one stream: which relation's inserts are
// which outbox's, and each outbox's mapping (columns, topic template,
// source). The catalog says which table a relation belongs to; the
// registry builds that table's mapper from its configured entry the first
// time, so every outbox, found at start or created since, is mapped the
// same way. The position is the stream's, not an outbox's; the bad-event
// policy may be either (Config.OnBadEvents).
//
// The decoder reads one list of columns for every relation (wanted): the
// union of every entry's, and each outbox picks its own from it (idx).
type registry struct {
	entries  []mapping.Config
	policies []string  // by entry: its own bad-event policy, "" for the stream's
	encs     []Encoder // by entry; nil for the payload as it is
	wanted   []string
	byRel    map[uint32]*outbox // by relation id: the table and its partitions (replication goroutine only)

	mu      sync.Mutex         // guards byTable's shape and each outbox's source, read by Outboxes from any goroutine
	byTable map[uint32]*outbox // by the outbox table's OID
	epoch   int                // the history epoch the mappers' sources are of (epoch.go)
}

// outbox is one outbox table of the stream.
type outbox struct {
	decoder.Outbox
	cfg    mapping.Config // its entry's, with base as the source
	base   string         // its source in the first history: the entry's, or the table's identity
	source string         // its source in the epoch the stream is in
	mapper *mapping.Mapper
	policy string           // its own bad-event policy, "" for the stream's
	idx    []int            // for each of mapper.Columns(), its index in registry.wanted
	cols   []mapping.Column // reused for every insert (replication goroutine only)
	enc    Encoder          // its entry's; nil for the payload as it is
	encIdx []int            // for each of enc.Columns(), its index in registry.wanted
	encVal [][]byte         // reused for every insert (replication goroutine only)

	events       atomic.Uint64 // acknowledged by the broker
	deadLettered atomic.Uint64
	failed       atomic.Uint64
	last         atomic.Int64 // commit time of the last acknowledged event, unix nanoseconds
}

// newRegistry checks every entry's mapping and makes the decoder's column
// list. An entry's empty Source is the table's identity, once known. encs
// are the entries' encoders, nil or as many as entries.
func newRegistry(entries []mapping.Config, encs []Encoder) (*registry, error) {
	if encs != nil && len(encs) != len(entries) {
		return nil, fmt.Errorf("%d encoders for %d outboxes", len(encs), len(entries))
	}
	r := &registry{entries: entries, policies: make([]string, len(entries)), encs: encs, byRel: map[uint32]*outbox{}, byTable: map[uint32]*outbox{}}
	for i, e := range entries {
		if e.Source == "" {
			// The default, the table's identity, is set once the table is
			// known (table); it has this shape, which every record format
			// accepts.
			e.Source = "0/0/0"
		}
		m, err := mapping.New(e)
		if err != nil {
			return nil, fmt.Errorf("outbox %d: %w", i+1, err)
		}
		for _, c := range m.Columns() {
			if !slices.Contains(r.wanted, c) {
				r.wanted = append(r.wanted, c)
			}
		}
		if enc := r.encoder(i); enc != nil {
			for _, c := range enc.Columns() {
				if !slices.Contains(r.wanted, c) {
					r.wanted = append(r.wanted, c)
				}
			}
		}
	}
	return r, nil
}

// encoder is entry i's encoder, nil for none.
func (r *registry) encoder(i int) Encoder {
	if i < len(r.encs) {
		return r.encs[i]
	}
	return nil
}

// add makes rel's inserts o's, building the outbox the first time its table
// is seen; isNew says it was.
func (r *registry) add(rel uint32, o decoder.Outbox) (ob *outbox, isNew bool, err error) {
	if o.OID == 0 {
		o.OID = rel
	}
	if ob, isNew, err = r.table(o); err != nil {
		return nil, false, err
	}
	r.byRel[rel] = ob
	return ob, isNew, nil
}

// table is the outbox of table o, built from its configured entry the
// first time.
func (r *registry) table(o decoder.Outbox) (*outbox, bool, error) {
	r.mu.Lock()
	ob, ok := r.byTable[o.OID]
	r.mu.Unlock()
	if ok {
		return ob, false, nil
	}
	if o.Entry < 0 || o.Entry >= len(r.entries) {
		return nil, false, fmt.Errorf("table %s is outbox %d of %d configured", o.Table(), o.Entry+1, len(r.entries))
	}
	cfg := r.entries[o.Entry]
	if cfg.Source == "" {
		cfg.Source = o.Identity
	}
	ob = &outbox{Outbox: o, cfg: cfg, base: cfg.Source, policy: r.policies[o.Entry]}
	r.mu.Lock()
	epoch := r.epoch
	r.mu.Unlock()
	cfg.Source = checkpoint.Source(ob.base, epoch)
	m, err := mapping.New(cfg)
	if err != nil {
		return nil, false, fmt.Errorf("outbox table %s: %w", o.Table(), err)
	}
	ob.source, ob.mapper = cfg.Source, m
	for _, c := range m.Columns() {
		ob.idx = append(ob.idx, slices.Index(r.wanted, c))
	}
	ob.cols = make([]mapping.Column, len(ob.idx))
	if ob.enc = r.encoder(o.Entry); ob.enc != nil {
		for _, c := range ob.enc.Columns() {
			ob.encIdx = append(ob.encIdx, slices.Index(r.wanted, c))
		}
		ob.encVal = make([][]byte, len(ob.encIdx))
	}
	r.mu.Lock()
	r.byTable[o.OID] = ob
	r.mu.Unlock()
	return ob, true, nil
}

// required names the columns every row of outbox entry i has, and what each
// is for.
func (r *registry) required(i int) (names, roles []string) {
	c := r.entries[i]
	return []string{c.IDColumn, c.AggregateTypeColumn, c.AggregateIDColumn, c.EventTypeColumn, c.PayloadColumn},
		[]string{"event id", "aggregate type", "aggregate id", "event type", "payload"}
}

// checkContract warns when the outbox relation rel, as the stream describes
// it, lacks a required column: each of its rows is then a bad event (the
// policy applies), and the operator hears of it before the first one.
func (p *Pipeline) checkContract(rel *decoder.Relation, o *outbox) {
	names, roles := p.reg.required(o.Entry)
	var missing []string
	for i, n := range names {
		if !slices.ContainsFunc(rel.Columns, func(c decoder.Column) bool { return c.Name == n }) {
			missing = append(missing, fmt.Sprintf("%q (the %s column)", n, roles[i]))
		}
	}
	if len(missing) > 0 {
		p.log.Warn("an outbox table lacks required columns: each of its rows is a bad event until they are there",
			"table", o.Table(), "relation", rel.Namespace+"."+rel.Name, "missing", missing)
	}
}

// OutboxStats is what the stream did for one outbox table.
type OutboxStats struct {
	Table  string // schema.name when it was found
	OID    uint32
	Source string
	Events uint64 // acknowledged by the broker
	Bad    map[string]uint64
	Last   time.Time // commit time of the last acknowledged event; zero before the first
}

// Outboxes lists the outbox tables the stream has seen, by table name; safe
// from any goroutine.
func (p *Pipeline) Outboxes() []OutboxStats {
	p.reg.mu.Lock()
	obs := make([]*outbox, 0, len(p.reg.byTable))
	sources := make([]string, 0, len(p.reg.byTable))
	for _, o := range p.reg.byTable {
		obs, sources = append(obs, o), append(sources, o.source)
	}
	p.reg.mu.Unlock()
	out := make([]OutboxStats, 0, len(obs))
	for i, o := range obs {
		s := OutboxStats{Table: o.Table(), OID: o.OID, Source: sources[i], Events: o.events.Load(),
			Bad: map[string]uint64{"dead_lettered": o.deadLettered.Load(), "failed": o.failed.Load()}}
		if n := o.last.Load(); n != 0 {
			s.Last = time.Unix(0, n).UTC()
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b OutboxStats) int {
		if a.Table < b.Table {
			return -1
		}
		if a.Table > b.Table {
			return 1
		}
		return int(a.OID) - int(b.OID)
	})
	return out
}

// Known registers, before streaming, the outbox tables the catalog found at
// start, so that they are listed (and counted) before their first row. Their
// relations are mapped only once the stream describes them: the catalog
// decides each relation the stream sends.
func (p *Pipeline) Known(outboxes []decoder.Outbox) error {
	for _, o := range outboxes {
		if _, _, err := p.reg.table(o); err != nil {
			return err
		}
	}
	return nil
}
