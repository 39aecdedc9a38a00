package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// publication is the one sql/publication.sql creates.
const publication = "cdc_outbox"

// bench is one run's world: its own database, and the slots and topics it
// creates, all named after prefix.
type bench struct {
	root     string
	tmp      string
	bin      string
	adminURL string
	dbURL    string
	dbName   string
	prefix   string // bench_<random>: database, slot prefix, topic prefix
	brokers  []string
	pool     *pgxpool.Pool
	kafka    *kgo.Client
	adm      *kadm.Client
	topics   map[string]bool
	running  map[*streamer]struct{}
	javas    map[*javaProcess]struct{} // Debezium Servers running
	profiles []profile                 // CPU profiles taken during the run, for the report
	// streamerFlags are added to each streamer's command line.
	streamerFlags []string
}

func buildBinary(ctx context.Context, root, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/cdc-outbox")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/cdc-outbox: %w", err)
	}
	return nil
}

func newBench(ctx context.Context, root, tmp, bin, adminURL string, brokers []string) (*bench, error) {
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	b := &bench{
		root: root, tmp: tmp, bin: bin, adminURL: adminURL, brokers: brokers,
		prefix:  "bench_" + hex.EncodeToString(rnd),
		topics:  map[string]bool{},
		running: map[*streamer]struct{}{},
		javas:   map[*javaProcess]struct{}{},
	}
	b.dbName = b.prefix
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redactURL(adminURL), err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+b.dbName)
	admin.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	if b.dbURL, err = withDatabase(adminURL, b.dbName); err != nil {
		b.dropDatabase()
		return nil, err
	}
	if err := b.setupDatabase(ctx); err != nil {
		b.close()
		return nil, err
	}
	b.kafka, err = kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.close()
		return nil, err
	}
	b.adm = kadm.NewClient(b.kafka)
	return b, nil
}

func (b *bench) setupDatabase(ctx context.Context) error {
	sql, err := os.ReadFile(filepath.Join(b.root, "sql", "publication.sql"))
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, string(sql)); err != nil {
		return fmt.Errorf("sql/publication.sql: %w", err)
	}
	if _, err := conn.Exec(ctx, backlogProcedure); err != nil {
		return fmt.Errorf("backlog procedure: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return err
	}
	// Enough connections for the steady writers to keep a few thousand
	// single-row commits per second in flight.
	cfg.MaxConns = 32
	b.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	return err
}

// withDatabase points a libpq URL or key=value string at another database.
func withDatabase(conn, db string) (string, error) {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		u, err := url.Parse(conn)
		if err != nil {
			return "", err
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	return conn + " dbname=" + db, nil
}

// redactURL hides a password in a URL for messages.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return s
}

// topic is the Kafka topic of an aggregate type under the bench's template.
func (b *bench) topic(aggType string) string { return b.prefix + "." + aggType }

// slot is the name of one of the bench's replication slots.
func (b *bench) slot(name string) string { return b.prefix + "_" + name }

// createTopic creates a phase's topic before the streamer sends to it: in
// production topics exist, and the broker's auto-creation (a metadata round
// trip or two, a second or so) would otherwise be timed as streamer work.
func (b *bench) createTopic(ctx context.Context, aggType string) error {
	t := b.topic(aggType)
	resp, err := b.adm.CreateTopics(ctx, 1, 1, nil, t)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", t, err)
	}
	b.topics[t] = true
	return nil
}

func (b *bench) deleteTopic(ctx context.Context, aggType string) {
	t := b.topic(aggType)
	if _, err := b.adm.DeleteTopics(ctx, t); err == nil {
		delete(b.topics, t)
	}
}

// createSlot creates a pgoutput slot in the bench database; it sees the
// transactions that commit after it. Creating a logical slot waits until
// every transaction running in the whole cluster has ended, so on shared
// servers one idle-in-transaction session elsewhere stalls it: say so
// rather than hang silently.
func (b *bench) createSlot(ctx context.Context, name string) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		for wait := 10 * time.Second; ; wait *= 2 {
			select {
			case <-done:
				return
			case <-time.After(wait):
			}
			progress("  still creating slot %s: a logical slot waits for every running transaction in the cluster to end; oldest: %s",
				name, b.oldestTransaction(ctx))
		}
	}()
	_, err := b.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name)
	return err
}

// oldestTransaction describes the longest-running transaction on the server.
func (b *bench) oldestTransaction(ctx context.Context) string {
	var pid int
	var db, state string
	var age float64
	err := b.pool.QueryRow(ctx, `SELECT pid, coalesce(datname, ''), coalesce(state, ''), extract(epoch FROM now() - xact_start)::float8
		FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()
		  AND query NOT LIKE '%pg_create_logical_replication_slot%'
		ORDER BY xact_start LIMIT 1`).Scan(&pid, &db, &state, &age)
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("pid %d in database %s, %s for %.0fs", pid, db, state, age)
}

// dropSlot drops a slot once its walsender has gone (it outlives its client
// by a moment), terminating it if it lingers.
func (b *bench) dropSlot(ctx context.Context, name string) error {
	var err error
	for i := 0; i < 100; i++ {
		if i == 50 {
			_, _ = b.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", name)
		}
		_, err = b.pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", name)
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("drop slot %s: %w", name, err)
}

// close stops whatever still runs and removes the database, its slots and
// the topics. It uses a fresh context: it also runs after Ctrl-C.
func (b *bench) close() {
	for s := range b.running {
		b.killStreamer(s)
	}
	for j := range b.javas {
		_ = j.cmd.Process.Kill()
		<-j.done
	}
	if b.adm != nil && len(b.topics) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var ts []string
		for t := range b.topics {
			ts = append(ts, t)
		}
		_, _ = b.adm.DeleteTopics(ctx, ts...)
		cancel()
	}
	if b.kafka != nil {
		b.kafka.Close()
	}
	if b.pool != nil {
		b.pool.Close()
	}
	b.dropDatabase()
}

func (b *bench) dropDatabase() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.adminURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: clean-up: %v (database %s is left behind)\n", err, b.dbName)
		return
	}
	defer conn.Close(context.Background())
	// A slot pins its database and a walsender pins its slot: stop both,
	// then drop.
	_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE database = $1 AND active_pid IS NOT NULL`, b.dbName)
	for i := 0; i < 50; i++ {
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = $1 AND NOT active`, b.dbName)
		var left int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, b.dbName).Scan(&left)
		if err == nil && left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+b.dbName+" WITH (FORCE)"); err != nil {
		fmt.Fprintf(os.Stderr, "bench: clean-up: drop database %s: %v\n", b.dbName, err)
	}
}

// info gathers what the report says about the machine and the servers.
func (b *bench) info(ctx context.Context, o options) runInfo {
	in := runInfo{
		date:      time.Now().UTC().Format("2006-01-02 15:04 MST"),
		cores:     runtime.NumCPU(),
		goVersion: runtime.Version(),
		cpuModel:  cpuModel(),
		loadStart: loadAverage(),
		opts:      o,
	}
	if err := b.pool.QueryRow(ctx, "SHOW server_version").Scan(&in.pgVersion); err != nil {
		in.pgVersion = "unknown (" + err.Error() + ")"
	}
	in.kafkaVersion = b.kafkaVersion(ctx)
	return in
}

// kafkaVersion is the broker's release: from the jar name in the local
// servers' cache when scripts/kafka.sh runs the broker, else franz-go's
// guess from the broker's ApiVersions ("v4.1" or "at least v3.9").
func (b *bench) kafkaVersion(ctx context.Context) string {
	state := filepath.Join(b.root, ".local")
	if d := os.Getenv("CDC_OUTBOX_LOCAL"); d != "" {
		state = d
	}
	// The cached jars are what runs only when the broker is a local one.
	jars, _ := filepath.Glob(filepath.Join(state, "kafka", "libs", "kafka_2.13-*.jar"))
	if len(jars) == 1 && len(b.brokers) == 1 && strings.HasPrefix(b.brokers[0], "127.") {
		return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(jars[0]), "kafka_2.13-"), ".jar")
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	vs, err := b.adm.ApiVersions(vctx)
	if err != nil {
		return "unknown"
	}
	for _, v := range vs {
		if v.Err == nil {
			return v.VersionGuess()
		}
	}
	return "unknown"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAverage is the 1-minute load average (0 when unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscanf(string(b), "%f", &l)
	return l
}

// measured runs the run's phases, recording in info the highest load
// average while they ran and the bench's duration; it returns why the run
// stopped early, or "" when it did not.
func measured(ctx context.Context, info *runInfo, phases func() error) (incomplete string) {
	var peak atomic.Uint64
	loadCtx, stopLoad := context.WithCancel(ctx)
	go watchLoad(loadCtx, &peak)
	err := phases()
	stopLoad()
	info.loadPeak = max(math.Float64frombits(peak.Load()), loadAverage())
	info.duration = time.Since(startedAt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: stopped early:", err)
		return err.Error()
	}
	return ""
}

// watchLoad records the highest 1-minute load average until ctx ends; the
// servers may be shared, and a busy machine explains odd numbers.
func watchLoad(ctx context.Context, peak *atomic.Uint64) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		l := math.Float64bits(loadAverage())
		for {
			old := peak.Load()
			if math.Float64frombits(old) >= math.Float64frombits(l) || peak.CompareAndSwap(old, l) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
