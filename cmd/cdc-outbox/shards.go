package main

import (
	"context"

	"github.com/cdc-outbox/cdc-outbox/internal/shard"
)

// validateShards checks --shards: a count the names have room for.
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
}

// statusShard is one shard in status's report.
type statusShard struct {
	Shard             string `json:"shard"`
	Slot              string `json:"slot"`
	Publication       string `json:"publication"`
	Verdict           string `json:"verdict"`
	Active            bool   `json:"active"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	WALStatus         string `json:"wal_status"`
}

// readShardsStatus is readStatus of a stream not split; of one split in
// shards, readStatus of each shard's slot and publication, the worst
// shard's report (the highest exit code, then the most lag: the stream's
// lag is its worst shard's) with every shard listed.
func readShardsStatus(ctx context.Context, c *statusConfig) *statusReport {
	if c.Shards <= 1 {
		return readStatus(ctx, c)
	}
	var worst *statusReport
	var all []statusShard
	for _, sh := range shard.All(c.Shards) {
		cs := *c
		cs.Slot, cs.Publication = sh.Name(c.Slot), sh.Name(c.Publication)
		r := readStatus(ctx, &cs)
		if r.Error != "" && r.ExitCode == 2 {
			return r // PostgreSQL cannot be reached or read: the same for every shard
		}
		all = append(all, statusShard{Shard: sh.String(), Slot: r.Slot, Publication: r.Publication, Verdict: r.Verdict, Active: r.Active,
			ConfirmedFlushLSN: r.ConfirmedFlushLSN, LagBytes: r.LagBytes, RetainedWALBytes: r.RetainedWALBytes, WALStatus: r.WALStatus})
		if worst == nil || r.ExitCode > worst.ExitCode || r.ExitCode == worst.ExitCode && r.LagBytes > worst.LagBytes {
			worst = r
		}
	}
	worst.Shards = all
	return worst
}
