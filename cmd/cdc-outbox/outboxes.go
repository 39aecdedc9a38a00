package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/cdc-outbox/cdc-outbox/internal/decoder"
	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// outboxSpec is one configured outbox of run: a table or a pattern of
// table names, and how its rows become records. Its Mapping.Source is
// empty for the default, each table's identity.
type outboxSpec struct {
	Pattern pgname.Pattern
	Mapping mapping.Config
}

// outboxes are run's outboxes, in order (a table two match is the first's):
// each item of --table with the global mapping flags, or the entries of the
// configuration file's outboxes list, each with the global flags as its
// defaults. Validation has checked that they parse.
func (c *runConfig) outboxes() []outboxSpec {
	if len(c.Outboxes) > 0 {
		specs := make([]outboxSpec, len(c.Outboxes))
		for i, e := range c.Outboxes {
			specs[i] = outboxSpec{Pattern: e.pattern, Mapping: e.mapping(c.Mapping, c.Source)}
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
		if _, err := mapping.New(m); err != nil {
			*p = append(*p, fmt.Errorf("%s: %w", e.where, err))
		}
		p.check(m.Source == "" || !e.pattern.IsGlob(), "%s: source %q for the pattern %s: each table it matches needs a source of its own; leave source out for each table's default",
			e.where, m.Source, e.pattern)
		p.check(validSource(m.Source), "%s: source %q: give 1 to 255 bytes of printable UTF-8, or leave it out for the default", e.where, m.Source)
		ce := m.Format == mapping.FormatCloudEventsBinary || m.Format == mapping.FormatCloudEventsStructured
		p.check(!ce || m.Source == "" || mapping.ValidSource(m.Source),
			"%s: source %q: record-format %s needs a URI-reference (RFC 3986: such as billing, /billing/outbox or urn:example:billing), or leave it out for the default", e.where, m.Source, m.Format)
	}
	p.check(c.Table == contract.DefaultTable, "--table %q with the configuration file's outboxes list: name the tables in one place, the list", c.Table)
	p.check(c.Source == "" || len(c.Outboxes) == 1 && !c.Outboxes[0].pattern.IsGlob(),
		"--source %q with the configuration file's outboxes list: each table needs a source of its own; give it in its entry", c.Source)
}

// catalogOutboxes are the outboxes as the catalog matches tables to them.
func catalogOutboxes(specs []outboxSpec) []replication.CatalogOutbox {
	out := make([]replication.CatalogOutbox, len(specs))
	for i, s := range specs {
		m := s.Mapping
		out[i] = replication.CatalogOutbox{Pattern: s.Pattern,
			Required: []string{m.IDColumn, m.AggregateTypeColumn, m.AggregateIDColumn, m.EventTypeColumn, m.PayloadColumn}}
	}
	return out
}

func patternsOf(specs []outboxSpec) []pgname.Pattern {
	out := make([]pgname.Pattern, len(specs))
	for i, s := range specs {
		out[i] = s.Pattern
	}
	return out
}

func mappingsOf(specs []outboxSpec) []mapping.Config {
	out := make([]mapping.Config, len(specs))
	for i, s := range specs {
		out[i] = s.Mapping
	}
	return out
}

// describeOutboxes is the outboxes for the log: "svc_a.outbox, tenant_*.outbox".
func describeOutboxes(specs []outboxSpec) string {
	var names []string
	for _, s := range specs {
		names = append(names, s.Pattern.String())
	}
	return strings.Join(names, ", ")
}

// outboxEntry is one entry of the configuration file's outboxes list: the
// table or pattern, and the settings it gives instead of the global flags.
type outboxEntry struct {
	where   string // file:line, for messages
	pattern pgname.Pattern
	values  map[string]string // by key (outboxKeys), as given
}

// outboxKeys are the keys of an entry of the outboxes list, besides table:
// the flags that shape one outbox's records.
var outboxKeys = []string{"topic", "source", "record-format", "column-id", "column-aggregate-type", "column-aggregate-id", "column-event-type",
	"column-payload", "column-headers", "column-created-at", "column-tracing-span-context"}

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

// messageSource is the source header of the events that come as outbox
// messages, which no table holds: the first outbox's source when it is
// given; for a stream of one table, that table's default (a service that
// moves from rows to messages keeps its source, and the messages' ids,
// UUIDs, never meet the table's); for a list or patterns, of no table in
// particular, "<system identifier>/<database OID>/<message prefix>".
func messageSource(ctx context.Context, c *runConfig, specs []outboxSpec, found []decoder.Outbox) (string, error) {
	if s := specs[0].Mapping.Source; s != "" {
		return s, nil
	}
	if len(specs) == 1 && !specs[0].Pattern.IsGlob() {
		for _, o := range found {
			if o.Entry == 0 {
				return o.Identity, nil
			}
		}
	}
	source, err := replication.StreamIdentity(ctx, c.PostgresURL, c.MessagePrefix)
	if err != nil {
		return "", fmt.Errorf("derive the outbox messages' source: %w", err)
	}
	return source, nil
}
