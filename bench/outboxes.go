package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The cost of many outboxes (bench -outboxes N; make bench-outboxes): N
// outbox tables under one steady total rate, streamed three ways in the
// same run, one after the other on slots made just before:
//
//   - one cdc-outbox over one slot and one publication (--table 'mo_*.outbox');
//   - N cdc-outbox processes, each over a slot and a publication of its own;
//   - the reference: one outbox table at the same total rate, one process.
//
// For each: the walsenders' CPU (their backends' utime+stime from /proc),
// the streamers' CPU and peak RSS summed, the p99 of commit→ack latency
// (the streamers' histograms merged), and the WAL the slots retain at the
// window's end, summed. Writes outboxes.md.

// outboxRun is one of the three ways.
type outboxRun struct {
	name         string
	processes    int
	achieved     float64 // committed events/s
	events       int     // acknowledged during the window
	walsenderCPU time.Duration
	streamerCPU  time.Duration
	rssMiB       float64 // peak RSS, summed
	p99          quant
	recvP99      quant // commit→arrival: PostgreSQL's share
	retained     int64 // bytes, summed over the slots
	window       time.Duration
	machine      machineLoad
}

func (r outboxRun) share(d time.Duration) float64 { return 100 * d.Seconds() / r.window.Seconds() }

// outboxTables creates n schemas mo_00.. each with an outbox table shaped
// like sql/publication.sql's, and returns their names.
func (b *bench) outboxTables(ctx context.Context, n int) ([]string, error) {
	var tables []string
	for i := range n {
		t := fmt.Sprintf("mo_%02d.outbox", i)
		_, err := b.pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA mo_%02d; CREATE TABLE %s (id bigserial PRIMARY KEY, aggregate_type text NOT NULL,
			aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`, i, t))
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return tables, nil
}

func runOutboxes(ctx context.Context, o options, b *bench, info runInfo) int {
	tables, err := b.outboxTables(ctx, o.outboxes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: create the outbox tables:", err)
		return 1
	}
	const aggType = "outboxes"
	if err := b.createTopic(ctx, aggType); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var runs []outboxRun
	var failed error
	incomplete := measured(ctx, &info, func() error {
		for _, way := range []struct {
			name   string
			tables []string
			split  bool // one process per table
		}{
			{fmt.Sprintf("1 process, 1 slot, %d outboxes", len(tables)), tables, false},
			{fmt.Sprintf("%d processes, %d slots", len(tables), len(tables)), tables, true},
			{"1 process, 1 slot, 1 outbox (reference)", []string{"public.outbox"}, false},
		} {
			r, err := b.outboxRun(ctx, way.name, way.tables, way.split, aggType, o.outboxRate, o.outboxFor)
			if err != nil {
				failed = fmt.Errorf("%s: %w", way.name, err)
				return failed
			}
			runs = append(runs, r)
		}
		return nil
	})
	text := outboxReport(info, o, runs, incomplete)
	fmt.Println()
	fmt.Print(text)
	if incomplete != "" || failed != nil {
		progress("incomplete run: %s not written", filepath.Join(o.out, "outboxes.md"))
		return 1
	}
	path := filepath.Join(o.out, "outboxes.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench: write report:", err)
		return 1
	}
	progress("wrote %s", path)
	return 0
}

// outboxRun streams tables at a total rate for d after a warm-up: with one
// process, or with one process per table (split), each on its own slot and
// publication.
func (b *bench) outboxRun(ctx context.Context, name string, tables []string, split bool, aggType string, rate int, d time.Duration) (outboxRun, error) {
	r := outboxRun{name: name}
	groups := [][]string{tables}
	if split {
		groups = nil
		for _, t := range tables {
			groups = append(groups, []string{t})
		}
	}
	tag := "one"
	if split {
		tag = "split"
	} else if len(tables) == 1 {
		tag = "ref"
	}
	type member struct {
		slot string
		s    *streamer
	}
	var members []member
	defer func() {
		for _, m := range members {
			_ = b.stopStreamer(m.s, 60*time.Second)
			_ = b.dropSlot(context.Background(), m.slot)
		}
	}()
	progress("outboxes: %s: starting %d streamer(s)", name, len(groups))
	for i, g := range groups {
		slot := b.slot(fmt.Sprintf("mo_%s_%02d", tag, i))
		if err := b.createSlot(ctx, slot); err != nil {
			return r, err
		}
		s, err := b.startStreamer(slot, "--table", strings.Join(g, ","), "--publication", slot)
		if err != nil {
			_ = b.dropSlot(context.Background(), slot)
			return r, err
		}
		members = append(members, member{slot, s})
	}
	for _, m := range members {
		if err := m.s.waitReady(ctx, 2*time.Minute); err != nil {
			return r, err
		}
	}
	r.processes = len(members)
	progress("outboxes: %s: %s warm-up, then %s measured at %d events/s in total", name, warmup, d, rate)
	if w := writeSpread(ctx, b.pool, rate, warmup, aggType, tables, nil); w.lastErr != nil && ctx.Err() == nil {
		return r, fmt.Errorf("warm-up writes: %w", w.lastErr)
	}
	var samplers []*walsenderSampler
	var wal0, cpu0 []time.Duration
	before := make([]metricSet, len(members))
	for i, m := range members {
		ws := sampleWalsender(ctx, b.pool, m.slot)
		samplers = append(samplers, ws)
		ms, err := m.s.scrape(ctx)
		if err != nil {
			return r, err
		}
		before[i] = ms
		c, err := readCPU(m.s.pid())
		if err != nil {
			return r, err
		}
		cpu0 = append(cpu0, c)
	}
	// The samplers' first reading is the walsenders' CPU at the start.
	time.Sleep(300 * time.Millisecond)
	for _, ws := range samplers {
		ws.mu.Lock()
		wal0 = append(wal0, ws.cpu)
		ws.mu.Unlock()
	}
	watch := watchMachine()
	start := time.Now()
	w := writeSpread(ctx, b.pool, rate, d, aggType, tables, nil)
	r.machine = watch()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	r.achieved = w.rate()
	// The window's last events acknowledged: every histogram holds them.
	var target float64
	for i := range members {
		target += before[i].sum("cdc_outbox_events_total")
	}
	target += float64(w.written)
	afters := make([]metricSet, len(members))
	deadline := time.Now().Add(60 * time.Second)
	for {
		var acked float64
		for i, m := range members {
			ms, err := m.s.scrape(ctx)
			if err != nil {
				acked = -1
				break
			}
			afters[i] = ms
			acked += ms.sum("cdc_outbox_events_total")
		}
		if acked >= target {
			break
		}
		for _, m := range members {
			if m.s.exited() {
				return r, m.s.failure("exited during the load")
			}
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the streamers had not acknowledged the load's events 60s after it ended (%.0f of %.0f)", acked, target)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.window = time.Since(start)
	var merged, recv []bucket
	for i, m := range members {
		c, err := readCPU(m.s.pid())
		if err != nil {
			return r, err
		}
		r.streamerCPU += c - cpu0[i]
		u, err := readUsage(m.s.pid())
		if err != nil {
			return r, err
		}
		r.rssMiB += mib(u.hwmKiB)
		wcpu, ok := samplers[i].stop()
		if !ok {
			return r, fmt.Errorf("the walsender of slot %s was never read", m.slot)
		}
		r.walsenderCPU += wcpu - wal0[i]
		r.events += int(afters[i].sum("cdc_outbox_events_total") - before[i].sum("cdc_outbox_events_total"))
		merged = addBuckets(merged, deltaBuckets(afters[i].histogram(latencyMetric), before[i].histogram(latencyMetric)))
		recv = addBuckets(recv, deltaBuckets(afters[i].histogram(receiveMetric), before[i].histogram(receiveMetric)))
		var retained int64
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(pg_current_wal_lsn() - restart_lsn, 0)::bigint FROM pg_replication_slots WHERE slot_name = $1`, m.slot).Scan(&retained); err != nil {
			return r, err
		}
		r.retained += retained
	}
	r.p99, r.recvP99 = quantileOf(0.99, merged), quantileOf(0.99, recv)
	progress("outboxes: %s: achieved %.0f/s; walsender CPU %.2fs (%.0f%% of a core), streamer CPU %.2fs (%.0f%%), peak RSS %.0f MiB, p99 %s (commit to arrival %s), WAL retained %s; %s",
		name, r.achieved, r.walsenderCPU.Seconds(), r.share(r.walsenderCPU), r.streamerCPU.Seconds(), r.share(r.streamerCPU), r.rssMiB, r.p99, r.recvP99, humanSize(r.retained), r.machine)
	return r, nil
}

// addBuckets sums two cumulative histograms of the same bounds.
func addBuckets(a, b []bucket) []bucket {
	if a == nil {
		return append([]bucket(nil), b...)
	}
	sum := map[float64]float64{}
	for _, x := range b {
		sum[x.le] = x.count
	}
	for i := range a {
		a[i].count += sum[a[i].le]
	}
	return a
}

// writeSpread is writePaced over several tables: each event goes to the
// next table in turn, so every table gets rate/len(tables) events/s.
func writeSpread(ctx context.Context, pool *pgxpool.Pool, rate int, d time.Duration, aggType string, tables []string, written *atomic.Int64) pacedResult {
	var next atomic.Uint64
	return writePacedWith(ctx, pool, rate, d, written, func(ctx context.Context, rng *rand.Rand) error {
		t := tables[int(next.Add(1)%uint64(len(tables)))]
		aggID := "agg-" + pad(rng.IntN(aggregates), 5)
		payload := fmt.Sprintf(`{"order": "%s", "seq": %d, "note": "%s"}`, aggID, rng.Int64N(1<<40), padding)
		_, err := pool.Exec(ctx, `INSERT INTO `+t+` (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'OrderUpdated', $3)`,
			aggType, aggID, payload)
		return err
	})
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// outboxReport is outboxes.md: the three ways, and the targets.
func outboxReport(info runInfo, o options, runs []outboxRun, incomplete string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Many outboxes: one slot against one slot each\n\n")
	fmt.Fprintf(&sb, "%s; PostgreSQL %s, Kafka %s, %d cores (%s), %s. %d outbox tables, %d events/s in total (single-row transactions, spread evenly), "+
		"%s warm-up, %s measured. `go run ./bench -outboxes %d -outboxes-rate %d -outboxes-duration %s`.\n\n",
		info.date, info.pgVersion, info.kafkaVersion, info.cores, info.cpuModel, info.goVersion, o.outboxes, o.outboxRate, warmup, o.outboxFor,
		o.outboxes, o.outboxRate, o.outboxFor)
	if incomplete != "" {
		fmt.Fprintf(&sb, "**Incomplete run:** %s\n\n", incomplete)
	}
	fmt.Fprintf(&sb, "| | processes | achieved/s | walsender CPU | streamer CPU | peak RSS | p99 commit→ack | p99 commit→arrival | WAL retained | machine |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&sb, "| %s | %d | %.0f | %.2f s (%.0f%% of a core) | %.2f s (%.0f%%) | %.0f MiB | %s | %s | %s | %s |\n",
			r.name, r.processes, r.achieved, r.walsenderCPU.Seconds(), r.share(r.walsenderCPU), r.streamerCPU.Seconds(), r.share(r.streamerCPU),
			r.rssMiB, r.p99, r.recvP99, humanSize(r.retained), r.machine)
	}
	if len(runs) == 3 {
		one, split, ref := runs[0], runs[1], runs[2]
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "**missed**"
		}
		pg := one.walsenderCPU.Seconds() / split.walsenderCPU.Seconds()
		st := one.streamerCPU.Seconds() / split.streamerCPU.Seconds()
		p := one.p99.sec / ref.p99.sec
		fmt.Fprintf(&sb, "\nTargets:\n\n")
		fmt.Fprintf(&sb, "- PostgreSQL-side CPU with one slot ≤ 1/5 of %d slots: %.2f of it, %s.\n", o.outboxes, pg, verdict(pg <= 0.2))
		fmt.Fprintf(&sb, "- Streamer CPU ≤ 1/3: %.2f, %s.\n", st, verdict(st <= 1.0/3))
		fmt.Fprintf(&sb, "- p99 ≤ 2 × the single outbox's at the same total rate: %.2f ×, %s.\n", p, verdict(p <= 2))
	}
	return sb.String()
}
