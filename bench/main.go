// Command bench measures cdc-outbox on this machine against the limits that
// matter for it, and writes a report (bench/results/latest.md and .svg):
//
//  1. Backlog drain: a million outbox events already in the WAL, read by
//     pg_recvlogical and by a minimal Go reader (the limit: what the
//     server's walsender can decode and send) and by the streamer (which
//     also maps, produces to Kafka and waits for the acks).
//  2. Steady load: writers at fixed rates; the streamer's commit→ack latency,
//     CPU per event and memory, after the same load read by a Go reader
//     alone (the reference: commit to arrival, the walsender's share), and
//     what each event costs: system calls, wake-ups, produce requests.
//  3. Idle: the streamer with nothing to stream, its share of a core.
//  4. Crash: SIGKILL under load, restart, and count what Kafka got twice.
//
// With -debezium it runs instead the comparison with Debezium Server
// (debezium.go; make bench-debezium) and writes debezium.md. With
// -outboxes N it measures instead the cost of N outbox tables streamed by
// one process over one slot against N processes over N slots (outboxes.go;
// make bench-outboxes) and writes outboxes.md. With -value-formats it
// measures instead the drain with schema-registry value formats against
// raw (formats.go) and writes formats.md.
//
// The drain and the steady load also run the streamer in exactly-once
// delivery (--delivery exactly-once), beside the default at-least-once in
// the same run: its drain is held to a share of at-least-once's, its p99
// to twice the transaction interval.
//
// It needs a PostgreSQL superuser URL in CDC_OUTBOX_TEST_POSTGRES_URL and a
// broker in CDC_OUTBOX_TEST_KAFKA_BROKERS; `make bench` starts local ones.
// Everything it creates (a bench_<random> database, its slots, its topics)
// is removed at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cdc-outbox/cdc-outbox/schema"
)

type options struct {
	events     int
	steady     time.Duration
	rates      []int
	out        string
	skipDrain  bool
	skipSteady bool
	skipCrash  bool
	idle       time.Duration
	crashRate  int
	crashFor   time.Duration
	// streamerFlags are added to every streamer's command line, to measure
	// a setting (say --kafka-compression=lz4) against the defaults.
	streamerFlags []string
	// bin, when set, is the streamer binary to measure instead of one built
	// from this checkout: an A/B comparison against another build.
	bin string

	// The cost of many outboxes instead of the phases above (outboxes.go):
	// outboxes tables at outboxRate events/s in total, measured for
	// outboxFor per way.
	outboxes   int
	outboxRate int
	outboxFor  time.Duration

	// The value formats against raw instead of the phases above
	// (formats.go): a backlog of formatEvents single-event transactions.
	formats      []string
	formatEvents int
	formatRate   int
	formatSteady time.Duration
	// The cost of shards instead of the phases above (shards.go): one
	// backlog of shardEvents drained with each count of shards.
	shards      []int
	shardEvents int
	shardCPUs   int // --cpus of each run; 0: K

	// The comparison with Debezium Server instead of the phases above.
	debezium     bool
	debeziumHome string // the unpacked distribution
	java         string // a Java 21+ binary
	dbzEvents    int
	dbzRate      int
	dbzSteady    time.Duration
}

func parseFlags(args []string) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.events, "events", 1000000, "events in each backlog-drain workload")
	fs.DurationVar(&o.steady, "steady", 60*time.Second, "duration of each steady-load rate")
	rates := fs.String("rates", "1000,5000", "steady-load rates in events/s, comma-separated")
	fs.StringVar(&o.out, "out", "bench/results", "folder for latest.md and latest.svg")
	fs.BoolVar(&o.skipDrain, "skip-drain", false, "skip the backlog drain")
	fs.BoolVar(&o.skipSteady, "skip-steady", false, "skip the steady load")
	fs.BoolVar(&o.skipCrash, "skip-crash", false, "skip the crash-duplicates run")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "how long to measure the streamer with nothing to stream (0 skips it)")
	fs.IntVar(&o.crashRate, "crash-rate", 2000, "events/s of the load during the crash run")
	fs.DurationVar(&o.crashFor, "crash-duration", 10*time.Second, "duration of the load during the crash run (the streamer is killed half-way)")
	fs.StringVar(&o.bin, "streamer-bin", "", "measure this cdc-outbox binary instead of building one from this checkout (to compare two builds)")
	fs.BoolVar(&o.debezium, "debezium", false, "compare with Debezium Server instead (backlog drain and a steady load, each relay alone; writes debezium.md); make bench-debezium fetches it first")
	fs.StringVar(&o.debeziumHome, "debezium-home", "", "Debezium Server's unpacked distribution (default: scripts/debezium.sh home)")
	fs.StringVar(&o.java, "java", "", "the Java 21+ binary that runs Debezium Server (default: scripts/debezium.sh java)")
	fs.IntVar(&o.dbzEvents, "debezium-events", 200000, "with -debezium: events in the backlog")
	fs.IntVar(&o.dbzRate, "debezium-rate", 1000, "with -debezium: the steady load's events/s")
	fs.DurationVar(&o.dbzSteady, "debezium-steady", 30*time.Second, "with -debezium: the steady load's measured window per relay")
	fs.IntVar(&o.outboxes, "outboxes", 0, "measure the cost of this many outbox tables instead (one process over one slot, one process per table, one table alone; writes outboxes.md); 0: the usual phases")
	fs.IntVar(&o.outboxRate, "outboxes-rate", 2000, "with -outboxes: events/s in total, spread evenly over the tables")
	fs.DurationVar(&o.outboxFor, "outboxes-duration", 30*time.Second, "with -outboxes: the measured window of each way")
	formats := fs.String("value-formats", "", "measure instead the drain with these value formats, comma-separated (avro, protobuf, json-schema), against raw in the same run, "+
		"through Apicurio Registry (scripts/apicurio.sh); writes formats.md")
	fs.IntVar(&o.formatEvents, "formats-events", 1000000, "with -value-formats: events in the backlog")
	fs.IntVar(&o.formatRate, "formats-rate", 1000, "with -value-formats: the steady load's events/s")
	fs.DurationVar(&o.formatSteady, "formats-steady", 30*time.Second, "with -value-formats: the steady load's measured window per format (0 skips it)")
	shardCounts := fs.String("shards", "", "measure shards instead: the counts, comma-separated, beginning with 1 (e.g. 1,2,4); one backlog drained by --shards K for each, "+
		"walsender CPU per shard from /proc and the streamer's CPU per event (writes shards.md)")
	fs.IntVar(&o.shardEvents, "shards-events", 300000, "with -shards: single-row transactions in the backlog")
	fs.IntVar(&o.shardCPUs, "shards-cpus", 0, "with -shards: the streamer's --cpus in every run; 0: the count of shards")
	extra := fs.String("streamer-flags", "", "extra flags for every streamer run, space-separated (e.g. \"--kafka-compression=lz4 --kafka-linger=10ms\")")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.streamerFlags = strings.Fields(*extra)
	for _, f := range strings.Split(*formats, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if _, err := schema.ParseFormat(f); err != nil {
			return o, fmt.Errorf("-value-formats: %v", err)
		}
		o.formats = append(o.formats, f)
	}
	if o.formatEvents <= 0 || o.formatRate <= 0 || o.formatSteady < 0 {
		return o, errors.New("-formats-events and -formats-rate must be positive, -formats-steady not negative")
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, r := range strings.Split(*rates, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		n, err := strconv.Atoi(r)
		if err != nil || n <= 0 {
			return o, fmt.Errorf("-rates: %q is not a positive number", r)
		}
		o.rates = append(o.rates, n)
	}
	if o.events <= 0 || o.steady <= 0 || o.crashRate <= 0 || o.crashFor <= 0 {
		return o, errors.New("-events, -steady, -crash-rate and -crash-duration must be positive")
	}
	if o.outboxes < 0 || o.outboxRate <= 0 || o.outboxFor <= 0 {
		return o, errors.New("-outboxes must not be negative, -outboxes-rate and -outboxes-duration must be positive")
	}
	for _, c := range strings.Split(*shardCounts, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > 16 || len(o.shards) == 0 && n != 1 {
			return o, fmt.Errorf("-shards: %q: give counts from 1 to 16, beginning with 1", c)
		}
		o.shards = append(o.shards, n)
	}
	if o.shardEvents <= 0 || o.shardCPUs < 0 {
		return o, errors.New("-shards-events must be positive, -shards-cpus not negative")
	}
	if o.dbzEvents <= 0 || o.dbzRate <= 0 || o.dbzSteady <= 0 {
		return o, errors.New("-debezium-events, -debezium-rate and -debezium-steady must be positive")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	// Ctrl-C cancels the run; the deferred clean-up still drops the
	// database, slots and topics.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

var startedAt = time.Now()

// progress prints one line with the time since the run started.
func progress(format string, args ...any) {
	el := time.Since(startedAt).Round(time.Second)
	fmt.Printf("[%02d:%02d] %s\n", int(el.Minutes()), int(el.Seconds())%60, fmt.Sprintf(format, args...))
}

// heartbeat prints a line every 15 s until stopped, so a long silent step
// (a reader working through a million events) visibly lives.
func heartbeat(what string) (stop func()) {
	done := make(chan struct{})
	start := time.Now()
	go func() {
		t := time.NewTicker(15 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				progress("  %s: still running after %s", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() { close(done) }
}

func run(ctx context.Context, o options) int {
	pgURL := os.Getenv("CDC_OUTBOX_TEST_POSTGRES_URL")
	brokers := os.Getenv("CDC_OUTBOX_TEST_KAFKA_BROKERS")
	if pgURL == "" || brokers == "" {
		fmt.Fprintln(os.Stderr, "bench: CDC_OUTBOX_TEST_POSTGRES_URL (a superuser URL) and CDC_OUTBOX_TEST_KAFKA_BROKERS must be set; `make bench` starts local servers and sets both")
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	tmp, err := os.MkdirTemp("", "cdc-outbox-bench")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	bin := o.bin
	if bin == "" {
		progress("building the streamer")
		bin = filepath.Join(tmp, "cdc-outbox")
		if err := buildBinary(ctx, root, bin); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}

	b, err := newBench(ctx, root, tmp, bin, pgURL, strings.Split(brokers, ","))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: setup:", err)
		return 1
	}
	defer b.close()
	b.streamerFlags = o.streamerFlags
	if o.debezium {
		if o.debeziumHome == "" {
			if o.debeziumHome, err = scriptOutput(root, "home"); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				return 2
			}
		}
		if o.java == "" {
			if o.java, err = scriptOutput(root, "java"); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				return 2
			}
		}
		res := &debeziumResults{info: b.info(ctx, o), version: debeziumVersion(o.debeziumHome), java: javaVersion(o.java)}
		progress("PostgreSQL %s, Kafka %s, Debezium Server %s (%s), %d cores; database %s",
			res.info.pgVersion, res.info.kafkaVersion, res.version, res.java, res.info.cores, b.dbName)
		return runDebeziumCompare(ctx, o, b, res)
	}
	if len(o.formats) > 0 {
		info := b.info(ctx, o)
		progress("PostgreSQL %s, Kafka %s, %d cores; database %s; value formats %s", info.pgVersion, info.kafkaVersion, info.cores, b.dbName, strings.Join(o.formats, ", "))
		return runFormats(ctx, o, b, root, info)
	}
	if len(o.shards) > 0 {
		info := b.info(ctx, o)
		progress("PostgreSQL %s, Kafka %s, %d cores; database %s; shards %v", info.pgVersion, info.kafkaVersion, info.cores, b.dbName, o.shards)
		return runShards(ctx, o, b, info)
	}
	if o.outboxes > 0 {
		info := b.info(ctx, o)
		progress("PostgreSQL %s, Kafka %s, %d cores; database %s; %d outboxes", info.pgVersion, info.kafkaVersion, info.cores, b.dbName, o.outboxes)
		return runOutboxes(ctx, o, b, info)
	}
	res := &results{info: b.info(ctx, o)}
	progress("PostgreSQL %s, Kafka %s, %d cores, %s; database %s", res.info.pgVersion, res.info.kafkaVersion, res.info.cores, res.info.goVersion, b.dbName)

	res.incomplete = measured(ctx, &res.info, func() error { return b.runPhases(ctx, o, res) })
	fmt.Println()
	fmt.Print(res.text())
	if res.incomplete != "" {
		// A partial report must not replace the last complete one.
		progress("incomplete run: %s not written", filepath.Join(o.out, "latest.md"))
		return 1
	}
	if err := res.write(o.out); err != nil {
		fmt.Fprintln(os.Stderr, "bench: write report:", err)
		return 1
	}
	progress("wrote %s and %s", filepath.Join(o.out, "latest.md"), filepath.Join(o.out, "latest.svg"))
	if res.crash != nil && res.crash.missing > 0 {
		// Losing events is a correctness bug, not a missed target.
		return 1
	}
	return 0
}

func (b *bench) runPhases(ctx context.Context, o options, res *results) error {
	if !o.skipDrain {
		rl, err := findRecvlogical()
		if err != nil {
			return err
		}
		// The readers take turns in a different order per workload, so
		// that neither a warm page cache nor a cold start favours one.
		orders := [][]string{
			{readerRecvlogical, readerStreamer, readerStreamerEO, readerGo},
			{readerGo, readerStreamerEO, readerStreamer, readerRecvlogical},
		}
		for i, perTx := range []int{1, 100} {
			d, err := b.drain(ctx, rl, o.events, perTx, orders[i])
			if err != nil {
				return fmt.Errorf("drain (%d per transaction): %w", perTx, err)
			}
			res.drains = append(res.drains, d)
		}
	}
	if !o.skipSteady {
		rs, err := b.steadyLoads(ctx, o.rates, o.steady)
		res.steady = rs
		if err != nil {
			return fmt.Errorf("steady load: %w", err)
		}
	}
	if o.idle > 0 {
		r, err := b.idle(ctx, o.idle)
		if err != nil {
			return fmt.Errorf("idle: %w", err)
		}
		res.idle = &r
	}
	if !o.skipCrash {
		c, err := b.crash(ctx, o.crashRate, o.crashFor)
		if err != nil {
			return fmt.Errorf("crash: %w", err)
		}
		res.crash = &c
	}
	res.profiles = b.profiles
	return nil
}

// repoRoot is the module root: `go run ./bench` runs from it, but the
// harness also works from a subfolder.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "cmd", "cdc-outbox")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from the cdc-outbox repository (no go.mod with cmd/cdc-outbox above the current folder)")
		}
		dir = parent
	}
}
