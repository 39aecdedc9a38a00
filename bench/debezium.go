package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The side-by-side comparison with Debezium Server (go run ./bench
// -debezium, make bench-debezium): the same PostgreSQL, the same broker,
// the same backlog and the same steady load, each relay run alone.
// Debezium Server runs its PostgreSQL connector and the outbox EventRouter
// configured as the closest equivalent of cdc-outbox's defaults, once with
// Debezium's defaults and once tuned for latency.

// relay is one contestant.
type relay struct {
	name  string
	short string // in topic and aggregate names: cdc, dbz, dbzt
	// debezium: Debezium Server; tuned: with the latency settings.
	debezium, tuned bool
}

var relays = []relay{
	{name: "cdc-outbox", short: "cdc"},
	{name: "Debezium Server", short: "dbz", debezium: true},
	{name: "Debezium Server, tuned for latency", short: "dbzt", debezium: true, tuned: true},
}

// debeziumTuning is what the latency-tuned run adds to Debezium's defaults
// (poll.interval.ms 500, max.batch.size 2048, max.queue.size 8192, the Kafka
// producer's linger.ms 5 in Kafka 4).
var debeziumTuning = []string{
	"debezium.source.poll.interval.ms=5",
	"debezium.source.max.batch.size=8192",
	"debezium.source.max.queue.size=32768",
	"debezium.sink.kafka.producer.linger.ms=5",
}

// relayProcess is a running relay.
type relayProcess interface {
	pid() int
	exited() bool
	failure(what string) error
}

// javaProcess is a running Debezium Server.
type javaProcess struct {
	cmd     *exec.Cmd
	logPath string
	health  string // its readiness URL
	done    chan struct{}
	waitErr error
}

func (j *javaProcess) pid() int { return j.cmd.Process.Pid }

func (j *javaProcess) exited() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

func (j *javaProcess) failure(what string) error {
	b, _ := os.ReadFile(j.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	return fmt.Errorf("debezium server %s (exit: %v); last log lines (%s):\n  %s", what, j.waitErr, j.logPath, strings.Join(lines, "\n  "))
}

// debeziumConfig is Debezium Server's application.properties for one run.
func (b *bench) debeziumConfig(slot, topicPrefix, offsets string, httpPort int, tuned bool) (string, error) {
	pg, err := pgconn.ParseConfig(b.dbURL)
	if err != nil {
		return "", err
	}
	lines := []string{
		"# Written by go run ./bench -debezium for one run.",
		"debezium.sink.type=kafka",
		"debezium.sink.kafka.producer.bootstrap.servers=" + strings.Join(b.brokers, ","),
		"debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer",
		"debezium.sink.kafka.producer.value.serializer=org.apache.kafka.common.serialization.StringSerializer",
		// cdc-outbox's producer: acks=all, idempotent.
		"debezium.sink.kafka.producer.acks=all",
		"debezium.sink.kafka.producer.enable.idempotence=true",
		"debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector",
		"debezium.source.offset.storage.file.filename=" + offsets,
		"debezium.source.offset.flush.interval.ms=0",
		"debezium.source.database.hostname=" + pg.Host,
		fmt.Sprintf("debezium.source.database.port=%d", pg.Port),
		"debezium.source.database.user=" + pg.User,
		"debezium.source.database.password=" + pg.Password,
		"debezium.source.database.dbname=" + pg.Database,
		"debezium.source.topic.prefix=" + b.prefix,
		// The slot and publication cdc-outbox uses, made beforehand.
		"debezium.source.plugin.name=pgoutput",
		"debezium.source.slot.name=" + slot,
		"debezium.source.publication.name=" + publication,
		"debezium.source.publication.autocreate.mode=disabled",
		"debezium.source.table.include.list=public.outbox",
		"debezium.source.snapshot.mode=no_data",
		"debezium.source.tombstones.on.delete=false",
		// The outbox EventRouter: topic by aggregate type, key aggregate
		// id, the payload expanded as the record's JSON value, the event id
		// (header id, the router's own), type and aggregate type as headers.
		"debezium.transforms=outbox",
		"debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
		"debezium.transforms.outbox.table.field.event.id=id",
		"debezium.transforms.outbox.table.field.event.key=aggregate_id",
		"debezium.transforms.outbox.table.field.event.payload=payload",
		"debezium.transforms.outbox.route.by.field=aggregate_type",
		// Quarkus expands ${...} in its properties: $$ leaves the router
		// its own placeholder.
		"debezium.transforms.outbox.route.topic.replacement=" + topicPrefix + ".$${routedByValue}",
		"debezium.transforms.outbox.table.expand.json.payload=true",
		"debezium.transforms.outbox.table.fields.additional.placement=event_type:header:event_type,aggregate_type:header:aggregate_type",
		"debezium.format.key=simplestring",
		"debezium.format.value=json",
		"debezium.format.value.schemas.enable=false",
		"debezium.format.header.schemas.enable=false",
		fmt.Sprintf("quarkus.http.port=%d", httpPort),
		"quarkus.log.console.json=false",
	}
	if tuned {
		lines = append(lines, debeziumTuning...)
	}
	return strings.Join(lines, "\n") + "\n", nil
}

// startDebezium starts Debezium Server on slot, writing to
// <topicPrefix>.<aggregate type>.
func (b *bench) startDebezium(o options, slot, topicPrefix string, tuned bool) (*javaProcess, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(b.tmp, "debezium-"+slot+"-")
	if err != nil {
		return nil, err
	}
	conf, err := b.debeziumConfig(slot, topicPrefix, filepath.Join(dir, "offsets.dat"), port, tuned)
	if err != nil {
		return nil, err
	}
	// Debezium Server reads config/application.properties under its
	// working folder: each run gets a folder with its own, and the
	// distribution's jars by absolute path.
	if err := os.MkdirAll(filepath.Join(dir, "config"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config", "application.properties"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	runners, _ := filepath.Glob(filepath.Join(o.debeziumHome, "debezium-server-*runner.jar"))
	if len(runners) != 1 {
		return nil, fmt.Errorf("no debezium-server-*runner.jar in %s: run scripts/debezium.sh fetch", o.debeziumHome)
	}
	cp := strings.Join([]string{runners[0], filepath.Join(o.debeziumHome, "config", "lib"), filepath.Join(o.debeziumHome, "lib", "*")}, ":")
	logPath := filepath.Join(dir, "debezium.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	j := &javaProcess{logPath: logPath, health: fmt.Sprintf("http://127.0.0.1:%d/q/health/ready", port), done: make(chan struct{})}
	j.cmd = exec.Command(o.java, "-cp", cp, "io.debezium.server.Main")
	j.cmd.Dir = dir
	j.cmd.Stdout, j.cmd.Stderr = logf, logf
	if err := j.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	b.javas[j] = struct{}{}
	go func() {
		j.waitErr = j.cmd.Wait()
		logf.Close()
		close(j.done)
	}()
	return j, nil
}

// stopJava sends SIGTERM and waits; after 60 s it kills.
func (b *bench) stopJava(j *javaProcess) {
	defer delete(b.javas, j)
	if j.exited() {
		return
	}
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(60 * time.Second):
		_ = j.cmd.Process.Kill()
		<-j.done
	}
}

// waitDebeziumReady waits until Debezium Server's readiness check passes:
// the connector runs and streams.
func waitDebeziumReady(ctx context.Context, j *javaProcess, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cl := &http.Client{Timeout: 2 * time.Second}
	for {
		if j.exited() {
			return j.failure("exited before it was ready")
		}
		if resp, err := cl.Get(j.health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return j.failure(fmt.Sprintf("not ready after %s", timeout))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startRelay starts one relay on slot, writing to <prefix>.<short>.<aggregate type>.
func (b *bench) startRelay(o options, r relay, slot string) (relayProcess, func(), error) {
	topicPrefix := b.prefix + "." + r.short
	if r.debezium {
		j, err := b.startDebezium(o, slot, topicPrefix, r.tuned)
		if err != nil {
			return nil, nil, err
		}
		return j, func() { b.stopJava(j) }, nil
	}
	s, err := b.startStreamerTo(slot, topicPrefix+".{aggregate_type}")
	if err != nil {
		return nil, nil, err
	}
	return s, func() { _ = b.stopStreamer(s, 60*time.Second) }, nil
}

func (b *bench) waitRelayReady(ctx context.Context, p relayProcess) error {
	switch p := p.(type) {
	case *streamer:
		return p.waitReady(ctx, 60*time.Second)
	case *javaProcess:
		return waitDebeziumReady(ctx, p, 3*time.Minute)
	}
	return nil
}

// createLogAppendTopic creates a topic whose records carry the broker's
// append time: latency is then append time minus the row's created_at for
// every relay alike.
func (b *bench) createLogAppendTopic(ctx context.Context, topic string) error {
	logAppend := "LogAppendTime"
	resp, err := b.adm.CreateTopics(ctx, 1, 1, map[string]*string{"message.timestamp.type": &logAppend}, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	b.topics[topic] = true
	return nil
}

// endOffset is the sum of a topic's end offsets: records written so far.
func (b *bench) endOffset(ctx context.Context, topic string) (int64, error) {
	lo, err := b.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	lo.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, lo.Error()
}

// relayDrain is one relay taking the backlog.
type relayDrain struct {
	relay      relay
	startup    time.Duration // process start to the first record in Kafka
	startupCPU time.Duration
	drain      time.Duration // first record to the last
	drainCPU   time.Duration
	events     int
	rssMiB     float64
	check      verdict
}

func (d relayDrain) rate() float64 { return float64(d.events) / d.drain.Seconds() }
func (d relayDrain) cpuPerEvent() float64 {
	return float64(d.drainCPU.Microseconds()) / float64(d.events)
}

// relaySteady is one relay at a steady rate.
type relaySteady struct {
	relay          relay
	achieved       float64
	events         int
	p50, p99, p999 quant
	cpuPerEvent    float64
	rssMiB         float64
	machine        machineLoad
	check          verdict
}

// verdict is what the verifier found in a relay's topic.
type verdict struct {
	expected, records, missing, duplicates, outOfOrder int
	unreadable                                         int // records without a numeric id header
}

func (v verdict) ok() bool { return v.missing == 0 && v.outOfOrder == 0 }

func (v verdict) String() string {
	return fmt.Sprintf("%s of %s ids, %d missing, %d duplicates, %d out of order",
		thousands(float64(v.expected-v.missing)), thousands(float64(v.expected)), v.missing, v.duplicates, v.outOfOrder)
}

// debeziumResults is the comparison's outcome.
type debeziumResults struct {
	info       runInfo
	version    string
	java       string
	drains     []relayDrain
	steady     []relaySteady
	rate       int
	config     string // Debezium's properties, the tuned run's additions after
	incomplete string
}

// runDebezium runs the comparison.
func (b *bench) runDebezium(ctx context.Context, o options, res *debeziumResults) error {
	conf, err := b.debeziumConfig("<slot>", b.prefix+".dbz", "<offsets file>", 0, false)
	if err != nil {
		return err
	}
	res.config = conf + "\n# tuned for latency, in addition:\n" + strings.Join(debeziumTuning, "\n") + "\n"
	res.rate = o.dbzRate
	if err := b.relayDrains(ctx, o, res); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	// The other order for the steady load, so that no relay always runs
	// first.
	for i := len(relays) - 1; i >= 0; i-- {
		s, err := b.relaySteady(ctx, o, relays[i])
		if err != nil {
			return fmt.Errorf("steady %d/s, %s: %w", o.dbzRate, relays[i].name, err)
		}
		res.steady = append(res.steady, s)
	}
	return nil
}

// relayDrains writes one backlog of single-row transactions that every
// relay's slot holds (all slots are created first) and lets each relay
// take it alone, timing from process start to the last record in Kafka.
func (b *bench) relayDrains(ctx context.Context, o options, res *debeziumResults) error {
	const aggType = "drain"
	if _, err := b.pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return err
	}
	slots := map[string]string{}
	for _, r := range relays {
		if err := b.createLogAppendTopic(ctx, b.prefix+"."+r.short+"."+aggType); err != nil {
			return err
		}
		slots[r.short] = b.slot("cmp_drain_" + r.short)
		if err := b.createSlot(ctx, slots[r.short]); err != nil {
			return err
		}
		defer func() { _ = b.dropSlot(context.Background(), slots[r.short]) }()
	}
	progress("drain: writing %d events, one per transaction", o.dbzEvents)
	stop := heartbeat("writing the backlog")
	err := writeBacklog(ctx, b.dbURL, o.dbzEvents, 1, aggType)
	stop()
	if err != nil {
		return fmt.Errorf("write backlog: %w", err)
	}
	want, err := b.expectedEvents(ctx, aggType)
	if err != nil {
		return err
	}
	for _, r := range relays {
		d, err := b.relayDrain(ctx, o, r, slots[r.short], b.prefix+"."+r.short+"."+aggType, int64(o.dbzEvents))
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		d.check, _, err = b.verify(ctx, b.prefix+"."+r.short+"."+aggType, want)
		if err != nil {
			return err
		}
		progress("drain: %s: start-up %.1fs (%.1fs CPU), then %.0f events/s, %.1f µs CPU/event, peak RSS %.0f MiB; %s",
			r.name, d.startup.Seconds(), d.startupCPU.Seconds(), d.rate(), d.cpuPerEvent(), d.rssMiB, d.check)
		res.drains = append(res.drains, d)
	}
	return nil
}

func (b *bench) relayDrain(ctx context.Context, o options, r relay, slot, topic string, n int64) (relayDrain, error) {
	d := relayDrain{relay: r, events: int(n)}
	progress("drain: %s taking the backlog", r.name)
	t0 := time.Now()
	p, stop, err := b.startRelay(o, r, slot)
	if err != nil {
		return d, err
	}
	defer stop()
	hb := heartbeat(r.name)
	defer hb()
	var firstAt time.Time
	var cpuFirst time.Duration
	for {
		if p.exited() {
			return d, p.failure("exited during the drain")
		}
		got, err := b.endOffset(ctx, topic)
		now := time.Now()
		if err == nil && got > 0 && firstAt.IsZero() {
			firstAt = now
			cpuFirst, _ = readCPU(p.pid())
		}
		if err == nil && got >= n {
			u, err := readUsage(p.pid())
			if err != nil {
				return d, err
			}
			d.startup, d.startupCPU = firstAt.Sub(t0), cpuFirst
			d.drain, d.drainCPU = now.Sub(firstAt), u.cpu-cpuFirst
			d.rssMiB = mib(u.hwmKiB)
			return d, nil
		}
		if now.Sub(t0) > 20*time.Minute {
			return d, p.failure("had not drained the backlog after 20 minutes")
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// relaySteady runs the steady load with one relay: its own slot, made just
// before, its own aggregate type and topic.
func (b *bench) relaySteady(ctx context.Context, o options, r relay) (relaySteady, error) {
	s := relaySteady{relay: r}
	aggType := "steady_" + r.short
	topic := b.prefix + "." + r.short + "." + aggType
	if err := b.createLogAppendTopic(ctx, topic); err != nil {
		return s, err
	}
	slot := b.slot("cmp_steady_" + r.short)
	if err := b.createSlot(ctx, slot); err != nil {
		return s, err
	}
	defer func() { _ = b.dropSlot(context.Background(), slot) }()
	progress("steady %d/s: %s: starting", o.dbzRate, r.name)
	p, stop, err := b.startRelay(o, r, slot)
	if err != nil {
		return s, err
	}
	defer stop()
	if err := b.waitRelayReady(ctx, p); err != nil {
		return s, err
	}
	// A longer warm-up than the streamer's own benchmark: the JVM compiles
	// its hot paths in the first seconds of load.
	const relayWarmup = 10 * time.Second
	progress("steady %d/s: %s: %s warm-up, then %s measured", o.dbzRate, r.name, relayWarmup, o.dbzSteady)
	w := writePaced(ctx, b.pool, o.dbzRate, relayWarmup, aggType, nil)
	if w.lastErr != nil && ctx.Err() == nil {
		return s, fmt.Errorf("warm-up writes: %w", w.lastErr)
	}
	if err := b.waitTopic(ctx, p, topic, w.written, time.Minute); err != nil {
		return s, err
	}
	var firstID int64
	if err := b.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM outbox").Scan(&firstID); err != nil {
		return s, err
	}
	cpu0, err := readCPU(p.pid())
	if err != nil {
		return s, err
	}
	watch := watchMachine()
	w2 := writePaced(ctx, b.pool, o.dbzRate, o.dbzSteady, aggType, nil)
	s.machine = watch()
	if w2.lastErr != nil {
		progress("  %d writes failed, e.g. %v", w2.errors, w2.lastErr)
	}
	s.achieved, s.events = w2.rate(), int(w2.written)
	if err := b.waitTopic(ctx, p, topic, w.written+w2.written, time.Minute); err != nil {
		return s, err
	}
	u, err := readUsage(p.pid())
	if err != nil {
		return s, err
	}
	s.cpuPerEvent = float64((u.cpu - cpu0).Microseconds()) / float64(max(s.events, 1))
	s.rssMiB = mib(u.hwmKiB)
	want, err := b.expectedEvents(ctx, aggType)
	if err != nil {
		return s, err
	}
	var lat map[int64]time.Duration
	s.check, lat, err = b.verify(ctx, topic, want)
	if err != nil {
		return s, err
	}
	// Latency over the measured window's events only.
	var window []time.Duration
	for id, l := range lat {
		if id > firstID {
			window = append(window, l)
		}
	}
	s.p50, s.p99, s.p999 = exactQuantile(0.5, window), exactQuantile(0.99, window), exactQuantile(0.999, window)
	progress("steady %d/s: %s: achieved %.0f/s; p50 %s p99 %s p99.9 %s; %.1f µs CPU/event; peak RSS %.0f MiB; %s; %s",
		o.dbzRate, r.name, s.achieved, s.p50, s.p99, s.p999, s.cpuPerEvent, s.rssMiB, s.machine, s.check)
	return s, nil
}

// waitTopic waits until topic holds n records.
func (b *bench) waitTopic(ctx context.Context, p relayProcess, topic string, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return p.failure("exited during the load")
		}
		got, err := b.endOffset(ctx, topic)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s holds %d records, %d expected, %s after the load", topic, got, n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// expected is one outbox row: its aggregate (the Kafka key) and when it
// was written.
type expected struct {
	agg     string
	created time.Time
}

// expectedEvents reads the outbox rows of one aggregate type, by id.
func (b *bench) expectedEvents(ctx context.Context, aggType string) (map[int64]expected, error) {
	rows, err := b.pool.Query(ctx, "SELECT id, aggregate_id, created_at FROM outbox WHERE aggregate_type = $1", aggType)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]expected{}
	for rows.Next() {
		var id int64
		var e expected
		if err := rows.Scan(&id, &e.agg, &e.created); err != nil {
			return nil, err
		}
		out[id] = e
	}
	return out, rows.Err()
}

// verify reads topic from the start to its end offset and checks it
// against the outbox rows: every id present (header id; Debezium writes it
// as JSON, so quotes are dropped), duplicates counted, and per key the ids
// in increasing order, as they were written. It returns each id's latency
// at its first arrival: the record's timestamp (the broker's append time)
// minus the row's created_at.
func (b *bench) verify(ctx context.Context, topic string, want map[int64]expected) (verdict, map[int64]time.Duration, error) {
	v := verdict{expected: len(want)}
	end, err := b.endOffset(ctx, topic)
	if err != nil {
		return v, nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return v, nil, err
	}
	defer cl.Close()
	seen := map[int64]int{}
	lat := map[int64]time.Duration{}
	lastByKey := map[string]int64{}
	deadline := time.Now().Add(5 * time.Minute)
	for int64(v.records) < end {
		if time.Now().After(deadline) {
			return v, nil, fmt.Errorf("read %d of %d records of %s in 5 minutes", v.records, end, topic)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return v, nil, ctx.Err()
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
		})
		if ferr != nil {
			return v, nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			v.records++
			var id int64
			if _, err := fmt.Sscanf(strings.Trim(headerValue(r, "id"), `"`), "%d", &id); err != nil {
				if v.unreadable++; v.unreadable == 1 {
					var hs []string
					for _, h := range r.Headers {
						hs = append(hs, fmt.Sprintf("%s=%q", h.Key, h.Value))
					}
					progress("  %s: a record without a numeric id header: key %q, headers %s, value %.200q", topic, r.Key, strings.Join(hs, " "), r.Value)
				}
				return
			}
			seen[id]++
			if seen[id] > 1 {
				v.duplicates++
				return
			}
			key := string(r.Key)
			if last, ok := lastByKey[key]; ok && id < last {
				v.outOfOrder++
			}
			lastByKey[key] = max(lastByKey[key], id)
			if e, ok := want[id]; ok {
				lat[id] = r.Timestamp.Sub(e.created)
			}
		})
	}
	for id := range want {
		if seen[id] == 0 {
			v.missing++
		}
	}
	return v, lat, nil
}

// debeziumVersion is the version in the runner jar's name.
func debeziumVersion(home string) string {
	runners, _ := filepath.Glob(filepath.Join(home, "debezium-server-dist-*-runner.jar"))
	if len(runners) != 1 {
		return "unknown"
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(runners[0]), "debezium-server-dist-"), "-runner.jar")
}

// javaVersion is the first line of java -version.
func javaVersion(java string) string {
	out, err := exec.Command(java, "-version").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// scriptOutput runs scripts/debezium.sh with arg and returns its one line.
func scriptOutput(root, arg string) (string, error) {
	out, err := exec.Command(filepath.Join(root, "scripts", "debezium.sh"), arg).Output()
	if err != nil {
		return "", fmt.Errorf("scripts/debezium.sh %s: %w", arg, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// markdown is bench/results/debezium.md.
func (r *debeziumResults) markdown() string {
	var b strings.Builder
	in := r.info
	b.WriteString("# cdc-outbox and Debezium Server, side by side\n\n")
	b.WriteString("Written by `make bench-debezium` (`go run ./bench -debezium`); the method is below and in bench/debezium.go.\n\n")
	fmt.Fprintf(&b, "| | |\n|---|---|\n| date | %s |\n| PostgreSQL | %s |\n| Kafka | %s (single local broker, KRaft) |\n", in.date, in.pgVersion, in.kafkaVersion)
	fmt.Fprintf(&b, "| Debezium Server | %s, on %s |\n| cdc-outbox | built from this checkout with %s |\n", r.version, r.java, in.goVersion)
	fmt.Fprintf(&b, "| machine | %d cores, %s; %s |\n| run time | %s |\n\n", in.cores, in.cpuModel, in.loadText(), in.duration.Round(time.Second))
	if w := in.busyWarning(); w != "" {
		fmt.Fprintf(&b, "**Warning:** %s\n\n", w)
	}
	if r.incomplete != "" {
		fmt.Fprintf(&b, "**Incomplete run:** %s\n\n", r.incomplete)
	}
	if len(r.drains) > 0 {
		fmt.Fprintf(&b, "## Backlog of %s single-row transactions\n\n", thousands(float64(r.drains[0].events)))
		b.WriteString("| relay | start-up to first event | start-up CPU | drain events/s | CPU µs/event | peak RSS MiB | verifier |\n|---|---:|---:|---:|---:|---:|---|\n")
		for _, d := range r.drains {
			fmt.Fprintf(&b, "| %s | %.1f s | %.1f s | %s | %.1f | %.0f | %s |\n", d.relay.name, d.startup.Seconds(), d.startupCPU.Seconds(),
				thousands(d.rate()), d.cpuPerEvent(), d.rssMiB, d.check)
		}
		if c, ok := r.drainOf("cdc"); ok {
			for _, d := range r.drains {
				if d.relay.debezium {
					fmt.Fprintf(&b, "\ncdc-outbox against %s: %.1f× the events/s, %.1f× less CPU per event, %.0f× less memory.",
						d.relay.name, c.rate()/d.rate(), d.cpuPerEvent()/c.cpuPerEvent(), d.rssMiB/c.rssMiB)
				}
			}
			b.WriteString("\n")
		}
	}
	if len(r.steady) > 0 {
		fmt.Fprintf(&b, "\n## Steady %s events/s\n\n", thousands(float64(r.rate)))
		b.WriteString("| relay | achieved/s | p50 | p99 | p99.9 | CPU µs/event | peak RSS MiB | machine during the window | verifier |\n|---|---:|---:|---:|---:|---:|---:|---|---|\n")
		for _, s := range r.steady {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f | %.0f | %s | %s |\n", s.relay.name, thousands(s.achieved), s.p50, s.p99, s.p999,
				s.cpuPerEvent, s.rssMiB, s.machine, s.check)
		}
	}
	b.WriteString(debeziumNotes)
	b.WriteString("\n## Debezium Server's configuration\n\n```properties\n" + r.config + "```\n")
	return b.String()
}

func (r *debeziumResults) drainOf(short string) (relayDrain, bool) {
	for _, d := range r.drains {
		if d.relay.short == short {
			return d, true
		}
	}
	return relayDrain{}, false
}

const debeziumNotes = `
## How to read this

- **Same world.** One PostgreSQL, one Kafka broker, one outbox table and
  publication; each relay reads its own replication slot (pgoutput) and
  writes to its own topics (one partition, ` + "`message.timestamp.type=LogAppendTime`" + `,
  created beforehand). Each relay runs alone.
- **Backlog.** All slots are created before the backlog is written (a
  server-side procedure, one row per transaction, ~200-byte JSON payloads),
  so every relay finds the same backlog. The relays take it in turn
  (cdc-outbox first here, last in the steady load). *Start-up* is process
  start to the first record in Kafka (JVM start, connecting, the first
  batch); *drain events/s* and *CPU µs/event* are from the first record to
  the last, the CPU being the process's utime+stime from /proc. *Peak RSS*
  is VmHWM.
- **Steady load.** A slot made just before each relay starts; paced writers
  commit single-row transactions; after a 10 s warm-up (the JVM compiles its
  hot paths), the measured window. Latency is the record's timestamp (the
  broker's append time) minus the row's ` + "`created_at`" + `, exact quantiles over
  the window's events, the same measure for every relay. CPU per event
  covers the window until the last event is in Kafka.
- **Verifier.** Each relay's topic is read back: every id written is there,
  duplicates are counted, and per key the ids must arrive in the order they
  were written.
- **Closest equivalent.** The EventRouter routes by ` + "`aggregate_type`" + `, keys by
  ` + "`aggregate_id`" + `, expands the JSON payload as the value and adds the id,
  event_type and aggregate_type headers; its producer uses acks=all and
  idempotence, like cdc-outbox's. cdc-outbox also maps the row's
  ` + "`headers`" + ` column and the record timestamp, which the router does not.
  Debezium runs with its defaults (` + "`poll.interval.ms`" + ` 500, batches of 2,048),
  and once tuned for latency (below).
- The machine is shared: see the load above. The ratios between relays in
  one run are what to compare.
`

// runDebeziumCompare is run's -debezium branch.
func runDebeziumCompare(ctx context.Context, o options, b *bench, res *debeziumResults) int {
	res.incomplete = measured(ctx, &res.info, func() error { return b.runDebezium(ctx, o, res) })
	md := res.markdown()
	fmt.Println()
	fmt.Print(md)
	if res.incomplete != "" {
		progress("incomplete run: %s not written", filepath.Join(o.out, "debezium.md"))
		return 1
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	path := filepath.Join(o.out, "debezium.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	progress("wrote %s", path)
	for _, d := range res.drains {
		if !d.check.ok() {
			return 1
		}
	}
	for _, s := range res.steady {
		if !s.check.ok() {
			return 1
		}
	}
	return 0
}
