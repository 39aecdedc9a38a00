package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cdc-outbox/cdc-outbox/internal/shard"
)

// The cost of shards (bench -shards 1,2,4): one backlog of single-row
// transactions, written once after every count's slots exist, drained by
// one cdc-outbox per count in turn (--shards K, --cpus K). For each: the
// wall time, the streamer's CPU per event, and each shard's walsender CPU
// from /proc. The walsenders' total CPU fits the model of
// docs/sharding.md, total(K) = K × decode + output: decode and output from
// K = 1 and the largest K, checked against the counts in between. Writes
// shards.md.

// shardRun is one count's drain.
type shardRun struct {
	shards, cpus int
	wall         time.Duration
	events       int
	streamerCPU  time.Duration
	walsenderCPU []time.Duration // per shard
}

func (r shardRun) walsenderTotal() time.Duration {
	var t time.Duration
	for _, c := range r.walsenderCPU {
		t += c
	}
	return t
}

// shardBase is the stream slot of count k's run.
func (b *bench) shardBase(k int) string { return b.slot(fmt.Sprintf("sh%d", k)) }

func runShards(ctx context.Context, o options, b *bench, info runInfo) int {
	const aggType = "shards"
	if err := b.createTopic(ctx, aggType); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var runs []shardRun
	var failed error
	incomplete := measured(ctx, &info, func() error {
		// Every count's publications and slots before the backlog: each
		// finds the same WAL, and a publication must exist before what its
		// slot decodes.
		var slots []string
		defer func() {
			for _, s := range slots {
				_ = b.dropSlot(context.Background(), s)
			}
		}()
		for _, k := range o.shards {
			for _, sh := range shard.All(k) {
				if sh.Split() {
					_, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE outbox WHERE (%s) WITH (publish = 'insert')`,
						sh.Name(publication), sh.Filter("aggregate_id")))
					if err != nil {
						failed = fmt.Errorf("create the publication of shard %s: %w", sh, err)
						return failed
					}
				}
				slot := sh.Name(b.shardBase(k))
				if k == 1 {
					slot = b.shardBase(1)
				}
				if err := b.createSlot(ctx, slot); err != nil {
					failed = err
					return failed
				}
				slots = append(slots, slot)
			}
		}
		progress("shards: writing %d single-row transactions", o.shardEvents)
		stop := heartbeat("writing the backlog")
		err := writeBacklog(ctx, b.dbURL, o.shardEvents, 1, aggType)
		stop()
		if err != nil {
			failed = fmt.Errorf("write backlog: %w", err)
			return failed
		}
		for _, k := range o.shards {
			cpus := o.shardCPUs
			if cpus == 0 {
				cpus = k
			}
			r, err := b.shardDrain(ctx, k, o.shardEvents, cpus)
			if err != nil {
				failed = fmt.Errorf("%d shards: %w", k, err)
				return failed
			}
			runs = append(runs, r)
		}
		return nil
	})
	text := shardReport(info, o, runs, incomplete)
	fmt.Println()
	fmt.Print(text)
	if incomplete != "" || failed != nil {
		progress("incomplete run: %s not written", filepath.Join(o.out, "shards.md"))
		return 1
	}
	path := filepath.Join(o.out, "shards.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench: write report:", err)
		return 1
	}
	progress("wrote %s", path)
	return 0
}

// shardDrain runs cdc-outbox with k shards over the backlog until Kafka
// acknowledged n events, sampling each shard's walsender.
func (b *bench) shardDrain(ctx context.Context, k, n, cpus int) (shardRun, error) {
	r := shardRun{shards: k, cpus: cpus}
	var samplers []*walsenderSampler
	for _, sh := range shard.All(k) {
		slot := sh.Name(b.shardBase(k))
		samplers = append(samplers, sampleWalsender(ctx, b.pool, slot))
	}
	defer func() {
		for _, ws := range samplers {
			ws.stop()
		}
	}()
	progress("shards: %d shard(s) draining %d events", k, n)
	s, err := b.startStreamer(b.shardBase(k), "--shards", fmt.Sprint(k), "--cpus", fmt.Sprint(cpus))
	if err != nil {
		return r, err
	}
	defer func() { _ = b.stopStreamer(s, 60*time.Second) }()
	ms, wall, err := s.waitDrained(ctx, n, 0)
	if err != nil {
		return r, err
	}
	r.wall, r.events = wall, int(ms.sum("cdc_outbox_events_total"))
	u, err := readUsage(s.pid())
	if err != nil {
		return r, err
	}
	r.streamerCPU = u.cpu
	for i, ws := range samplers {
		c, ok := ws.stop()
		if !ok {
			return r, fmt.Errorf("the walsender of shard %d was never read", i)
		}
		r.walsenderCPU = append(r.walsenderCPU, c)
	}
	progress("shards: %d shard(s): %.2fs, %.0f events/s; streamer CPU %.2fs; walsender CPU %.2fs in total %s",
		k, r.wall.Seconds(), float64(r.events)/r.wall.Seconds(), r.streamerCPU.Seconds(), r.walsenderTotal().Seconds(), perShard(r.walsenderCPU))
	return r, b.stopStreamer(s, 60*time.Second)
}

func perShard(cpu []time.Duration) string {
	var parts []string
	for _, c := range cpu {
		parts = append(parts, fmt.Sprintf("%.2f", c.Seconds()))
	}
	return "(" + strings.Join(parts, " + ") + ")"
}

// shardReport is shards.md: each count's drain, and the model fitted.
func shardReport(info runInfo, o options, runs []shardRun, incomplete string) string {
	var sb strings.Builder
	counts := make([]string, len(o.shards))
	for i, k := range o.shards {
		counts[i] = fmt.Sprint(k)
	}
	fmt.Fprintf(&sb, "# Shards: one outbox over K slots\n\n")
	fmt.Fprintf(&sb, "%s; PostgreSQL %s, Kafka %s, %d cores (%s), %s. One backlog of %d single-row transactions, written after every count's slots existed, "+
		"drained by `cdc-outbox run --shards K` for each K in turn. `go run ./bench -shards %s -shards-events %d -shards-cpus %d`.\n\n",
		info.date, info.pgVersion, info.kafkaVersion, info.cores, info.cpuModel, info.goVersion, o.shardEvents, strings.Join(counts, ","), o.shardEvents, o.shardCPUs)
	if incomplete != "" {
		fmt.Fprintf(&sb, "**Incomplete run:** %s\n\n", incomplete)
	}
	fmt.Fprintf(&sb, "| K | --cpus | drain | events/s | streamer CPU | streamer CPU per event | walsender CPU, total | per shard |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&sb, "| %d | %d | %.2f s | %.0f | %.2f s | %.1f µs | %.2f s | %s |\n", r.shards, r.cpus, r.wall.Seconds(), float64(r.events)/r.wall.Seconds(),
			r.streamerCPU.Seconds(), 1e6*r.streamerCPU.Seconds()/float64(r.events), r.walsenderTotal().Seconds(), perShard(r.walsenderCPU))
	}
	if len(runs) >= 2 && runs[0].shards == 1 {
		one, last := runs[0], runs[len(runs)-1]
		k := float64(last.shards)
		// total(K) = K·d + o: two counts give d and o.
		d := (last.walsenderTotal().Seconds() - one.walsenderTotal().Seconds()) / (k - 1)
		out := one.walsenderTotal().Seconds() - d
		fmt.Fprintf(&sb, "\nThe model (docs/sharding.md), from K = 1 and K = %d: each walsender decodes the whole WAL, **decode %.2f s**, "+
			"and the output of %d events is shared by the shards, **output %.2f s**.\n\n", last.shards, d, one.events, out)
		for _, r := range runs {
			kk := float64(r.shards)
			fmt.Fprintf(&sb, "- K = %d: walsender total %.2f s, the model %.2f s; one walsender's share %.2f s, so one slot's drain could be %.2f × faster where each walsender has a core.\n",
				r.shards, r.walsenderTotal().Seconds(), kk*d+out, d+out/kk, (d+out)/(d+out/kk))
		}
	}
	return sb.String()
}
