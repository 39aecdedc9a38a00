package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// runInfo is the context a result needs to be read.
type runInfo struct {
	date         string
	pgVersion    string
	kafkaVersion string
	goVersion    string
	cores        int
	cpuModel     string
	loadStart    float64 // 1-minute load average at the start
	loadPeak     float64 // highest 1-minute load average seen during the run
	duration     time.Duration
	opts         options
}

func (in runInfo) loadText() string {
	return fmt.Sprintf("load average %.1f at start, %.1f at most during the run", in.loadStart, in.loadPeak)
}

// busyWarning says when something besides the benchmark kept the machine
// busy. The benchmark itself makes a load of a few (walsender, reader or
// streamer, broker, writers and their backends), so only well above the
// core count is it somebody else.
func (in runInfo) busyWarning() string {
	if in.cores == 0 || in.loadPeak <= 2.5*float64(in.cores) {
		return ""
	}
	return fmt.Sprintf("the load average reached %.1f on %d cores: other processes competed for the CPU, so throughput, latency and CPU per event are pessimistic", in.loadPeak, in.cores)
}

// results is everything a run measured.
type results struct {
	profiles   []profile
	info       runInfo
	drains     []drainResult
	steady     []steadyResult
	crash      *crashResult
	idle       *idleResult
	incomplete string // why the run stopped early, if it did
}

// Targets the streamer is held to.
const (
	targetDrainRatio = 0.9 // of the limit
	targetRSSMiB     = 64
	targetDrainCPU   = 8     // µs per event
	targetCrashMs    = 200   // ms worth of duplicates
	targetIdleShare  = 0.002 // of a core
	// Exactly-once delivery: its drain against at-least-once's in the same
	// run, and its p99 at 1,000 events/s against the default
	// --transaction-interval (100 ms).
	targetEODrainRatio = 0.7
	targetEOP99        = 0.2 // seconds: 2 × --transaction-interval
	targetEOP99Rate    = 1000
)

// steadyTarget is what the streamer is held to at one steady rate.
type steadyTarget struct {
	cpu float64 // µs per event
	p99 float64 // seconds, commit to ack
	// arrival bounds the part of p99 spent before events reached the
	// streamer, as a multiple of the reference's p99 (0: no bound).
	arrival float64
}

// steadyTargets are per rate: at 1,000 events/s, what most outboxes run at,
// fixed per-wake-up costs dominate; at 5,000/s the machine is busy.
var steadyTargets = map[int]steadyTarget{
	1000: {cpu: 40, p99: 0.015},
	5000: {cpu: 15, p99: 0.050, arrival: 3},
}

// latencyNote says what the latency columns are.
const latencyNote = "Latency: for the streamer, its own histogram (commit time from the Begin message to broker ack), quantiles interpolated linearly inside buckets; " +
	"for the Go reader, measured at the same rate just before with nothing else reading, commit time to the Begin message's arrival (exact quantiles): the walsender's share, the least any client can have here"

var tableHeader = []string{"workload", "reader", "events/s", "ratio to limit", "p50", "p99", "p99.9", "CPU µs/event", "CPU s/M events", "peak RSS MiB"}

// rows is the result table: per drain workload the two references and the
// streamer, then one row per steady rate.
func (r *results) rows() [][]string {
	var rows [][]string
	for _, d := range r.drains {
		limit := d.limit()
		for _, name := range []string{readerRecvlogical, readerGo, readerStreamer, readerStreamerEO} {
			rr, ok := d.reader(name)
			if !ok {
				continue
			}
			row := []string{d.name(), name, thousands(rr.rate()), "", "", "", "", "", "", ""}
			if limit > 0 {
				row[3] = fmt.Sprintf("%.2f", rr.rate()/limit)
			}
			if name == readerStreamer || name == readerStreamerEO {
				cpu := float64(rr.cpu.Microseconds()) / float64(rr.events)
				row[7], row[8] = fmt.Sprintf("%.2f", cpu), fmt.Sprintf("%.2f", cpu)
				row[9] = fmt.Sprintf("%.1f", rr.rssMiB)
			}
			rows = append(rows, row)
		}
	}
	for i, s := range r.steady {
		if s.ref.p50.ok() && (i == 0 || r.steady[i-1].rate != s.rate) { // one reference per rate
			rows = append(rows, []string{
				fmt.Sprintf("steady %s/s", thousands(float64(s.rate))), readerGo,
				thousands(s.ref.achieved), "", s.ref.p50.String(), s.ref.p99.String(), s.ref.p999.String(), "", "", "",
			})
		}
		rows = append(rows, []string{
			fmt.Sprintf("steady %s/s", thousands(float64(s.rate))), s.name(),
			thousands(s.achieved), "", s.p50.String(), s.p99.String(), s.p999.String(),
			fmt.Sprintf("%.2f", s.cpuPerEvent), fmt.Sprintf("%.2f", s.cpuPerEvent), fmt.Sprintf("%.1f", s.rssMiB),
		})
	}
	return rows
}

// target is one PASS/MISS line.
type target struct {
	name   string
	actual string
	pass   bool
}

func (r *results) targets() []target {
	var ts []target
	for _, d := range r.drains {
		if s, ok := d.reader(readerStreamer); ok && d.limit() > 0 {
			ratio := s.rate() / d.limit()
			ts = append(ts, target{fmt.Sprintf("%s: streamer ≥ %.1f × limit", d.name(), targetDrainRatio),
				fmt.Sprintf("%.2f × (%s of %s events/s)", ratio, thousands(s.rate()), thousands(d.limit())), ratio >= targetDrainRatio})
		}
	}
	for _, d := range r.drains {
		alo, ok1 := d.reader(readerStreamer)
		eo, ok2 := d.reader(readerStreamerEO)
		if ok1 && ok2 && alo.rate() > 0 {
			ratio := eo.rate() / alo.rate()
			ts = append(ts, target{fmt.Sprintf("%s: exactly-once ≥ %.1f × at-least-once", d.name(), targetEODrainRatio),
				fmt.Sprintf("%.2f × (%s of %s events/s)", ratio, thousands(eo.rate()), thousands(alo.rate())), ratio >= targetEODrainRatio})
		}
	}
	for _, s := range r.steady {
		if s.name() == readerStreamerEO && s.rate == targetEOP99Rate {
			ts = append(ts, target{fmt.Sprintf("steady %s/s, exactly-once: p99 ≤ %.0f ms (2 × --transaction-interval)", thousands(targetEOP99Rate), targetEOP99*1000),
				s.p99.String(), s.p99.ok() && !s.p99.over && s.p99.sec <= targetEOP99})
		}
		if s.name() != readerStreamer {
			continue
		}
		tg, ok := steadyTargets[s.rate]
		if !ok {
			continue
		}
		name := fmt.Sprintf("steady %s/s", thousands(float64(s.rate)))
		actual := s.p99.String()
		if s.recvP99.ok() {
			actual += fmt.Sprintf("; of it, commit to arrival at the streamer %s", s.recvP99)
		}
		if s.ref.p99.ok() {
			actual += fmt.Sprintf("; the reference alone %s", s.ref.p99)
		}
		if s.machine.load1 > 0 {
			actual += "; " + s.machine.String()
		}
		ts = append(ts, target{fmt.Sprintf("%s: p99 ≤ %.0f ms", name, tg.p99*1000), actual, s.p99.ok() && !s.p99.over && s.p99.sec <= tg.p99})
		if tg.arrival > 0 && s.ref.p99.ok() {
			bound := tg.arrival * s.ref.p99.sec
			ts = append(ts, target{fmt.Sprintf("%s: commit to arrival p99 ≤ %.0f × the reference's", name, tg.arrival),
				fmt.Sprintf("%s against %s (bound %.1f ms)", s.recvP99, s.ref.p99, bound*1000),
				s.recvP99.ok() && !s.recvP99.over && s.recvP99.sec <= bound})
		}
		ts = append(ts, target{fmt.Sprintf("%s: CPU ≤ %.0f µs/event", name, tg.cpu), fmt.Sprintf("%.2f µs", s.cpuPerEvent), s.cpuPerEvent > 0 && s.cpuPerEvent <= tg.cpu})
	}
	// Memory: the largest peak of any streamer run.
	peak, where := 0.0, ""
	for _, d := range r.drains {
		if s, ok := d.reader(readerStreamer); ok && s.rssMiB > peak {
			peak, where = s.rssMiB, d.name()
		}
	}
	for _, s := range r.steady {
		if s.rssMiB > peak {
			peak, where = s.rssMiB, fmt.Sprintf("steady %s/s", thousands(float64(s.rate)))
		}
	}
	if where != "" {
		ts = append(ts, target{fmt.Sprintf("peak RSS ≤ %d MiB (largest of all runs)", targetRSSMiB),
			fmt.Sprintf("%.1f MiB (%s)", peak, where), peak <= targetRSSMiB})
	}
	for _, d := range r.drains {
		if s, ok := d.reader(readerStreamer); ok && s.events > 0 {
			cpu := float64(s.cpu.Microseconds()) / float64(s.events)
			ts = append(ts, target{fmt.Sprintf("%s: CPU ≤ %d µs/event", d.name(), targetDrainCPU), fmt.Sprintf("%.2f µs", cpu), cpu <= targetDrainCPU})
		}
	}
	if i := r.idle; i != nil {
		ts = append(ts, target{fmt.Sprintf("idle: CPU ≤ %.1f%% of a core", 100*targetIdleShare), i.String(), i.cpuShare <= targetIdleShare})
	}
	if c := r.crash; c != nil {
		ts = append(ts, target{fmt.Sprintf("crash: duplicates ≤ ~%d ms worth", targetCrashMs),
			fmt.Sprintf("%d duplicates = %.0f ms at %s/s", c.duplicates, c.msWorth(), thousands(float64(c.rate))), c.msWorth() <= targetCrashMs})
		ts = append(ts, target{"crash: no committed event missing", fmt.Sprintf("%d missing", c.missing), c.missing == 0})
	}
	return ts
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// text is the report for the terminal.
func (r *results) text() string {
	var b strings.Builder
	in := r.info
	fmt.Fprintf(&b, "cdc-outbox benchmark, %s\n", in.date)
	fmt.Fprintf(&b, "PostgreSQL %s, Kafka %s, %d cores (%s), %s; %s\n",
		in.pgVersion, in.kafkaVersion, in.cores, in.cpuModel, in.goVersion, in.loadText())
	if w := in.busyWarning(); w != "" {
		fmt.Fprintf(&b, "WARNING: %s\n", w)
	}
	b.WriteString("\n")
	b.WriteString(alignTable(tableHeader, r.rows()))
	if c := r.crash; c != nil {
		fmt.Fprintf(&b, "\ncrash (SIGKILL under %s/s): %d events, %d records, %d duplicates = %.0f ms worth, %d missing\n",
			thousands(float64(c.rate)), c.written, c.records, c.duplicates, c.msWorth(), c.missing)
	}
	b.WriteString("\ntargets:\n")
	for _, t := range r.targets() {
		fmt.Fprintf(&b, "  %s  %-50s %s\n", passMiss(t.pass), t.name, t.actual)
	}
	if r.crash != nil && r.crash.missing > 0 {
		fmt.Fprintf(&b, "\n!!! %d COMMITTED EVENTS NEVER REACHED KAFKA !!!\n", r.crash.missing)
	}
	if r.incomplete != "" {
		fmt.Fprintf(&b, "\nINCOMPLETE: %s\n", r.incomplete)
	}
	fmt.Fprintf(&b, "\n%s\n", latencyNote)
	fmt.Fprintf(&b, "run time %s\n", in.duration.Round(time.Second))
	return b.String()
}

// alignTable lays out rows in space-padded columns, numbers right-aligned.
func alignTable(header []string, rows [][]string) string {
	w := make([]int, len(header))
	for i, h := range header {
		w[i] = len([]rune(h))
	}
	for _, row := range rows {
		for i, c := range row {
			w[i] = max(w[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		for i, c := range cells {
			pad := strings.Repeat(" ", w[i]-len([]rune(c)))
			if i < 2 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
			if i < len(cells)-1 {
				b.WriteString("  ")
			}
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", w[i])
	}
	line(sep)
	for _, row := range rows {
		line(row)
	}
	return b.String()
}

// markdown is latest.md: the table, the targets and what the numbers mean.
func (r *results) markdown() string {
	var b strings.Builder
	in := r.info
	b.WriteString("# cdc-outbox benchmark\n\n")
	b.WriteString("Written by `make bench` (`go run ./bench`); see bench/main.go for the method.\n\n")
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| date | %s |\n| PostgreSQL | %s |\n| Kafka | %s (single local broker, KRaft) |\n", in.date, in.pgVersion, in.kafkaVersion)
	fmt.Fprintf(&b, "| machine | %d cores, %s; %s |\n| Go | %s |\n", in.cores, in.cpuModel, in.loadText(), in.goVersion)
	fmt.Fprintf(&b, "| sizes | backlogs of %s events; steady load %s per rate; crash load %s/s for %s |\n| run time | %s |\n\n",
		thousands(float64(in.opts.events)), in.opts.steady, thousands(float64(in.opts.crashRate)), in.opts.crashFor, in.duration.Round(time.Second))
	if len(in.opts.streamerFlags) > 0 {
		fmt.Fprintf(&b, "Streamer run with extra flags: `%s`.\n\n", strings.Join(in.opts.streamerFlags, " "))
	}
	if w := in.busyWarning(); w != "" {
		fmt.Fprintf(&b, "**Warning:** %s\n\n", w)
	}
	b.WriteString("![events/s and latency](latest.svg)\n\n## Results\n\n")
	b.WriteString("| " + strings.Join(tableHeader, " | ") + " |\n|")
	for i := range tableHeader {
		if i < 2 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, row := range r.rows() {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n" + latencyNote + ".\n")
	if c := r.crash; c != nil {
		fmt.Fprintf(&b, "\n**Crash** (SIGKILL half-way through %s of %s events/s, restarted at once): %s events committed, %s records in Kafka, **%d duplicates = %.0f ms worth of events**, %d missing.\n",
			c.duration, thousands(float64(c.rate)), thousands(float64(c.written)), thousands(float64(c.records)), c.duplicates, c.msWorth(), c.missing)
		if c.missing > 0 {
			fmt.Fprintf(&b, "\n**!!! %d committed events never reached Kafka: at-least-once delivery is broken. !!!**\n", c.missing)
		}
	}
	b.WriteString("\n## Targets\n\n| target | measured | |\n|---|---|---|\n")
	for _, t := range r.targets() {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.name, t.actual, passMiss(t.pass))
	}
	if len(r.drains) > 0 {
		b.WriteString("\n## Backlog drain details\n\n")
		b.WriteString("| workload | backlog written in | WAL | reader (in run order) | wall s | events/s | reader CPU s | walsender CPU s |\n|---|---:|---:|---|---:|---:|---:|---:|\n")
		for _, d := range r.drains {
			for i, rr := range d.readers {
				first := []string{"", "", ""}
				if i == 0 {
					first = []string{d.name(), fmt.Sprintf("%.1f s", d.writeTime.Seconds()), fmt.Sprintf("%.0f MiB", float64(d.walBytes)/(1<<20))}
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %s | %.2f | %s |\n", first[0], first[1], first[2],
					rr.name, rr.wall.Seconds(), thousands(rr.rate()), rr.cpu.Seconds(), strings.TrimSuffix(secondsOrNA(rr.walsenderCPU), "s"))
			}
		}
	}
	if len(r.steady) > 0 {
		b.WriteString("\n## Steady load: what each event costs\n\n")
		b.WriteString("Counted over each measured window from /proc (the streamer's read and write system calls, its threads' context switches) " +
			"and its metrics (produce requests, status updates); the machine's CPU idle share and run queue (runnable threads, mean of 200 ms samples) " +
			"over the same window, for the reference's window too.\n\n")
		b.WriteString("| rate | reads/event | writes/event | wake-ups/event | preemptions/event | produce requests/event | status updates/s | machine (streamer) | machine (reference) |\n|---|---:|---:|---:|---:|---:|---:|---|---|\n")
		for _, s := range r.steady {
			c := s.perEvent
			fmt.Fprintf(&b, "| %s/s | %.2f | %.2f | %.2f | %.2f | %.3f | %.1f | %s | %s |\n", thousands(float64(s.rate)),
				c.reads, c.writes, c.wakeups, c.preempted, c.produces, s.statusPerSec, s.machine, s.ref.machine)
		}
	}
	if len(r.profiles) > 0 {
		b.WriteString("\n## Where the streamer's CPU goes\n\nCPU profiles of the streamer (`--pprof`) taken during the run; the files are beside this report " +
			"(`go tool pprof -top <binary> <file>`).\n")
		for _, p := range r.profiles {
			fmt.Fprintf(&b, "\n### %s (`%s`)\n\n```\n%s\n```\n", p.phase, p.file, p.top)
		}
	}
	b.WriteString(notes)
	return b.String()
}

const notes = `
## How to read this

- **Backlog drain.** The outbox already holds the backlog (written server-side by a
  PL/pgSQL procedure, ~200-byte JSON payloads and a traceparent header, 10,000
  aggregates) when each reader starts; every reader has its own slot, created at
  the same point before the backlog. *pg_recvlogical* (to /dev/null, stopping at
  the end LSN) and the *Go reader* (bench/reader.go: receives and discards, status
  update every 10 s) measure what the walsender can decode and send: the **limit**
  is the faster of the two. The *streamer* is timed from process start until its
  metrics count every event as acknowledged by Kafka, so it includes start-up,
  mapping, producing and the broker. Readers run in a different order per
  workload so the page cache favours none. Topics are created beforehand, as in
  production.
- **Steady load.** Paced writers commit single-row transactions at the given rate
  (the achieved rate is shown). Latency is the **streamer's own histogram**
  ` + "`cdc_outbox_end_to_end_latency_seconds`" + `: commit time taken from the
  transaction's Begin message to the broker's acknowledgement. p50/p99/p99.9 are
  **interpolated linearly inside histogram buckets** (as Prometheus'
  histogram_quantile does) over the buckets' change during the measured window,
  after a 3 s warm-up; they are only as fine as the buckets (1, 2, 3, 4, 5, 7.5, 10,
  15, 20, 30 ms, ...).
- **CPU** is the streamer process's utime+stime from /proc (all threads) per
  acknowledged event; "CPU s/M events" is the same figure per million events (1
  µs/event = 1 s per million). Drain figures include start-up. **Peak RSS** is
  VmHWM at the end of the run. The walsender's CPU (drain details) is read from
  /proc for the slot's active_pid: it is the server-side cost every reader pays.
- **Crash.** The streamer is SIGKILLed half-way through the load and restarted at
  once on the same slot; the topic is then read back from the start and records
  are counted per ` + "`id`" + ` header. Duplicates are the events Kafka had
  acknowledged but the streamer had not yet confirmed to PostgreSQL; "ms worth" is
  duplicates / rate.
- The servers are the local development ones and may be shared; the load average
  at the start and its peak during the run are shown above. Treat differences of
  a few percent as noise.
`

// write saves latest.md and latest.svg in dir, and the CPU profiles beside
// them.
func (r *results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range r.profiles {
		b, err := os.ReadFile(p.path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, p.file), b, 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "latest.svg"), []byte(chart(r)), 0o644)
}

// thousands formats a count with thousands separators: 152345 → 152,345.
func thousands(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	n := int64(math.Round(v))
	neg := n < 0
	if neg {
		n = -n
	}
	s := fmt.Sprint(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
