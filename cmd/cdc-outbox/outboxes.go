package main

import (
	"fmt"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/relay"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// outboxSpec is one configured outbox of run: a table or a pattern of
// table names, and how its rows become records. Its Mapping.Source is
// empty for the default, each table's identity.
type outboxSpec = relay.Outbox

// outboxes are run's outboxes, in order (a table two match is the first's):
// each item of --table with the global mapping flags, or the entries of the
// configuration file's outboxes list, each with the global flags as its
// defaults. Validation has checked that they parse.
func (c *runConfig) outboxes() []outboxSpec {
	if len(c.Outboxes) > 0 {
		specs := make([]outboxSpec, len(c.Outboxes))
		for i, e := range c.Outboxes {
			specs[i] = outboxSpec{Pattern: e.pattern, Mapping: e.mapping(c.Mapping, c.Source), OnBadEvent: e.values[onBadEventKey]}
		}
		return specs
	}
	ps, _ := pgname.ParseList(c.Table)
	specs := make([]outboxSpec, len(ps))
	for i, p := range ps {
		m := c.Mapping
		m.Source = c.Source
		specs[i] = outboxSpec{Pattern: p, Mapping: m}
	}
	return specs
}

// validateOutboxes checks --table as run reads it, a list of tables and
// patterns, and each outbox's mapping.
func (c *runConfig) validateOutboxes(p *problems) {
	if len(c.Outboxes) == 0 {
		ps, err := pgname.ParseList(c.Table)
		p.check(err == nil, "--table %q: %v", c.Table, err)
		if err == nil && (len(ps) > 1 || ps[0].IsGlob()) {
			// Event ids are unique per table: one source for several
			// tables would make their ids collide for consumers.
			p.check(c.Source == "", "--source %q with several tables in --table %q: each table needs a source of its own; "+
				"leave --source empty for each table's default, or give each its own in the configuration file's outboxes list", c.Source, c.Table)
		}
		return
	}
	for _, e := range c.Outboxes {
		m := e.mapping(c.Mapping, c.Source)
		checked := m
		if checked.Source == "" {
			// The default, each table's identity, is resolved at start and
			// is a URI-reference of this shape, which every record format
			// accepts (as validateOutput assumes for --source).
			checked.Source = "0/0/0"
		}
		if _, err := mapping.New(checked); err != nil {
			*p = append(*p, fmt.Errorf("%s: %w", e.where, err))
		}
		p.check(m.Source == "" || !e.pattern.IsGlob(), "%s: source %q for the pattern %s: each table it matches needs a source of its own; leave source out for each table's default",
			e.where, m.Source, e.pattern)
		p.check(validSource(m.Source), "%s: source %q: give 1 to 255 bytes of printable UTF-8, or leave it out for the default", e.where, m.Source)
		if policy, ok := e.values[onBadEventKey]; ok {
			p.check(policy == pipeline.Fail || policy == pipeline.DeadLetter, "%s: on-bad-event %q: use fail or dead-letter", e.where, policy)
			p.check(policy != pipeline.DeadLetter || c.DeadLetterTopic != "", "%s: on-bad-event dead-letter needs --dead-letter-topic (dead-letter-topic in the file)", e.where)
		}
		ce := m.Format == mapping.FormatCloudEventsBinary || m.Format == mapping.FormatCloudEventsStructured
		p.check(!ce || m.Source == "" || mapping.ValidSource(m.Source),
			"%s: source %q: record-format %s needs a URI-reference (RFC 3986: such as billing, /billing/outbox or urn:example:billing), or leave it out for the default", e.where, m.Source, m.Format)
	}
	p.check(c.Table == contract.DefaultTable, "--table %q with the configuration file's outboxes list: name the tables in one place, the list", c.Table)
	p.check(c.Source == "" || len(c.Outboxes) == 1 && !c.Outboxes[0].pattern.IsGlob(),
		"--source %q with the configuration file's outboxes list: each table needs a source of its own; give it in its entry", c.Source)
}

// describeOutboxes is the outboxes for the log: "svc_a.outbox, tenant_*.outbox".
func describeOutboxes(specs []outboxSpec) string { return relay.Describe(specs) }

// outboxEntry is one entry of the configuration file's outboxes list: the
// table or pattern, and the settings it gives instead of the global flags.
type outboxEntry struct {
	where   string // file:line, for messages
	pattern pgname.Pattern
	values  map[string]string // by key (outboxKeys), as given
}

// outboxKeys are the keys of an entry of the outboxes list, besides table:
// the flags that shape one outbox's records.
var outboxKeys = append([]string{"topic", "source", "record-format", "column-id", "column-aggregate-type", "column-aggregate-id", "column-event-type",
	"column-payload", "column-headers", "column-created-at", "column-tracing-span-context", onBadEventKey}, valueKeys...)

// onBadEventKey is the entry's bad-event policy, instead of --on-bad-event:
// a payments outbox may stop the stream while tenants' dead-letter, so one
// tenant's bad rows never stop the others.
const onBadEventKey = "on-bad-event"

// mapping is the entry's mapping: def, the global flags', with what the
// entry sets instead; source is --source.
func (e outboxEntry) mapping(def mapping.Config, source string) mapping.Config {
	m := def
	m.Source = source
	fields := map[string]*string{"topic": &m.Topic, "source": &m.Source, "column-id": &m.IDColumn, "column-aggregate-type": &m.AggregateTypeColumn,
		"column-aggregate-id": &m.AggregateIDColumn, "column-event-type": &m.EventTypeColumn, "column-payload": &m.PayloadColumn,
		"column-headers": &m.HeadersColumn, "column-created-at": &m.CreatedAtColumn, "record-format": (*string)(&m.Format),
		"column-tracing-span-context": &m.TracingSpanContextColumn}
	for k, v := range e.values {
		if f := fields[k]; f != nil {
			*f = v
		}
	}
	return m
}
