package main

import (
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// validateShards checks --shards: a count the names have room for, and
// named tables only. A table a pattern matches later joins the publication
// through the membership trigger, which adds it without a shard's row
// filter.
func (c *runConfig) validateShards(p *problems) {
	check := p.check
	check(c.Shards >= 1 && c.Shards <= shard.Max, "--shards %d: give 1 (one slot) to %d", c.Shards, shard.Max)
	if c.Shards <= 1 || c.Shards > shard.Max {
		return
	}
	last := shard.Shard{Index: c.Shards - 1, Count: c.Shards}
	check(slotName.MatchString(last.Name(c.Slot)), "--slot %q with --shards %d: the shards' slots (%s) must be 1-63 characters; shorten --slot", c.Slot, c.Shards, last.Name(c.Slot))
	check(len(last.Name(c.Publication)) <= 63, "--publication %q with --shards %d: the shards' publications (%s) must be at most 63 bytes; shorten --publication",
		c.Publication, c.Shards, last.Name(c.Publication))
	var patterns []pgname.Pattern
	if len(c.Outboxes) == 0 {
		patterns, _ = pgname.ParseList(c.Table) // checked by validateOutboxes
	}
	for _, e := range c.Outboxes {
		patterns = append(patterns, e.pattern)
	}
	for _, pt := range patterns {
		check(!pt.IsGlob(), "--shards %d with the table pattern %s: shards stream named tables only (a table created later would join their publications without a row filter); "+
			"name the tables, or leave --shards at 1", c.Shards, pt)
	}
}
