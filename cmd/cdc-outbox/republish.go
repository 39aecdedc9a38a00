package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/republish"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
)

// republishConfig is everything `cdc-outbox republish` is told: run's
// connection, producer and mapping settings, under the same names, and
// which rows to send again.
type republishConfig struct {
	runConfig
	AfterID, UntilID string
	Since, Until     string
	BatchSize        int
	ProgressInterval time.Duration
}

func republishFlags(c *republishConfig) *flags {
	f := newFlags("cdc-outbox republish", "Send outbox rows to Kafka again, from the table itself, as the stream would have sent them (the same topic, key, value,\n"+
		"headers and timestamp, and the same bad-event policy): the repair after a replication slot was lost (wal_status lost, dropped,\n"+
		"or not carried over a failover) and the way to give a consumer history. Consumers skip what they have by event id.\n"+
		"Rows go in the order of the id, or of (created_at, id) with --since or --until, in batches; progress on stderr.\n"+
		"Interrupted (SIGINT, SIGTERM) or stopped by a bad row, it says which flag starts it again where it stopped.\n"+
		noRowsForMessages)
	rc := &c.runConfig
	f.String(&rc.PostgresURL, "postgres-url", "", "PostgreSQL connection `url` or key=value string; PG* environment variables fill what it leaves out; the role needs SELECT on the table")
	f.String(&rc.Table, "table", contract.DefaultTable, tableHelp)
	f.String(&c.AfterID, "after-id", "", "send rows whose id is greater than this `id` (an integer id column: ids grow in the order rows are written); "+
		"after a lost slot, an id that Kafka has and every id before it, or earlier: repeats are harmless")
	f.String(&c.UntilID, "until-id", "", "send rows whose id is at most this `id` (an integer id column)")
	f.String(&c.Since, "since", "", "send rows whose created_at is at or after this `time` (RFC 3339, 2026-01-02T15:04:05Z, or as PostgreSQL prints it; no offset means UTC); "+
		"rows then go in the order of (created_at, id), for any id type")
	f.String(&c.Until, "until", "", "send rows whose created_at is before this `time`")
	f.Int(&c.BatchSize, "batch-size", 1000, "rows read per query; memory is bounded by --max-inflight-events, not by the table")
	f.Int(&rc.MaxInflightEvents, "max-inflight-events", 20000, "`events` sent but not yet acknowledged before reading waits")
	f.Duration(&c.ProgressInterval, "progress-interval", 5*time.Second, "how often to print progress on stderr; 0 prints none")
	f.Duration(&rc.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for the events sent to be acknowledged")
	f.String(&rc.Slot, "slot", "cdc_outbox", "`name` of the replication slot of the stream the rows belong to: rows go under the source (--source or its default) of its newest history epoch "+
		"(read from --checkpoint-topic), as the stream publishes them after a lost history")
	f.String(&rc.CheckpointTopic, "checkpoint-topic", "cdc_outbox.checkpoints", "compacted `topic` holding the stream's history epochs (run's --checkpoint-topic)")
	kafkaFlags(f, rc)
	mappingFlags(f, rc)
	// Not run's value formats: a configuration file shared with run that
	// sets one is refused rather than its payloads sent raw to topics whose
	// consumers read a registry's format.
	f.String(&rc.Value.Format, "value-format", valueRaw, "record value: raw only (the payload as the service wrote it); republish does not write a schema registry's formats yet, "+
		"so an outbox whose run writes avro, protobuf or json-schema values is refused rather than re-published in another format")
	logFlags(f, rc)
	return f
}

// since and until are the time flags parsed; validate has checked them.
func (c *republishConfig) times() (since, until time.Time) {
	since, _ = parseTime(c.Since)
	until, _ = parseTime(c.Until)
	return since, until
}

// parseTime reads RFC 3339, or created_at as PostgreSQL prints it in
// republish's session (DateStyle ISO, TimeZone UTC), which the resume hint
// repeats: a timestamptz with its offset (2026-01-02 15:04:05.123456+00),
// a timestamp without one (2026-01-02 15:04:05.123456). A time without an
// offset is taken as UTC, which is how PostgreSQL reads it too: for a
// timestamptz column in that session, and for a timestamp column, whose
// comparison ignores any offset and so keeps the wall time as written.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("use RFC 3339 (2026-01-02T15:04:05Z) or 2026-01-02 15:04:05+00, or 2026-01-02 15:04:05 for UTC")
}

// timeLayouts are the forms parseTime reads: RFC 3339, then PostgreSQL's
// ISO output, whose offset has hours only, minutes too, or seconds too,
// or is absent (a timestamp without time zone).
var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999Z07",
	"2006-01-02 15:04:05.999999999Z07:00:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
}

var integer = regexp.MustCompile(`^-?[0-9]+$`)

func (c *republishConfig) validate() error {
	var p problems
	check := p.check
	p.table(c.PostgresURL, c.Table)
	c.validateOutput(&p)
	check(c.AfterID == "" || integer.MatchString(c.AfterID), "--after-id %q: give an integer id", c.AfterID)
	check(c.UntilID == "" || integer.MatchString(c.UntilID), "--until-id %q: give an integer id", c.UntilID)
	since, err := parseTime(c.Since)
	check(err == nil, "--since %q: %v", c.Since, err)
	until, err := parseTime(c.Until)
	check(err == nil, "--until %q: %v", c.Until, err)
	check(since.IsZero() || until.IsZero() || since.Before(until), "--since must be before --until")
	check(c.BatchSize > 0, "--batch-size %d: must be positive", c.BatchSize)
	check(c.Value.Format == valueRaw, "--value-format %q: republish writes raw values only; its consumers read %s through a schema registry, so re-publishing those rows as raw JSON would break them",
		c.Value.Format, c.Value.Format)
	check(c.ProgressInterval >= 0, "--progress-interval %s: must not be negative", c.ProgressInterval)
	check(c.ShutdownTimeout >= 0, "--shutdown-timeout %s: must not be negative", c.ShutdownTimeout)
	return errors.Join(p...)
}

func republishCommand(args []string, stdout, stderr io.Writer) int {
	var c republishConfig
	f := republishFlags(&c)
	if code, ok := f.load(args, c.validate, stdout, stderr); !ok {
		return code
	}
	kafkaOpts, log, ok := kafkaCommand("republish", &c.runConfig, stderr)
	if !ok {
		return 2
	}
	ctx, stop := signalContext(log)
	defer stop()
	sum, err := republishRows(ctx, &c, kafkaOpts, log)
	attrs := []any{"rows_read", sum.RowsRead, "acknowledged", sum.Acked, "dead_lettered", sum.DeadLettered, "timestamps_replaced", sum.TimestampsReplaced,
		"elapsed", sum.Elapsed.Round(time.Millisecond), "rows_per_second", perSecond(sum.Acked, sum.Elapsed)}
	switch {
	case err == nil && sum.RowsRead == 0:
		log.Warn("republished nothing: no row of the table is in the selection. "+noRowsForMessages, attrs...)
		return 0
	case err == nil:
		log.Info("republished", attrs...)
		return 0
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		log.Warn("interrupted; everything before the resume point was acknowledged: run again with it to go on", append(attrs, "resume", resume(sum))...)
		return 1
	}
	log.Error("stopped with an error; everything before the resume point was acknowledged: fix the cause and run again with it",
		append(attrs, "resume", resume(sum), "error", say(err))...)
	return 1
}

// kafkaCommand is the start of a command that talks to Kafka once its
// flags are loaded: the TLS and SASL options, and the logger; false (exit
// code 2) when the options cannot be made, which stderr has been told.
func kafkaCommand(name string, c *runConfig, stderr io.Writer) ([]kgo.Opt, *slog.Logger, bool) {
	kafkaOpts, err := c.kafkaSecurityOpts()
	if err != nil {
		fmt.Fprintf(stderr, "cdc-outbox %s: invalid configuration:\n%v\n", name, err)
		return nil, nil, false
	}
	return kafkaOpts, newLogger(stderr, c.LogFormat, c.LogLevel), true
}

// noRowsForMessages is what republish cannot do for a message outbox.
const noRowsForMessages = "Events written as outbox messages (pg_logical_emit_message, outbox.Emit; see --message-prefix of run) have no row: " +
	"republish cannot send them again, and Kafka's retention holds their only copy."

// resume is the flag that starts a run again where s says it may.
func resume(s republish.Summary) string {
	if s.Resume.IsZero() {
		return "(the same selection: nothing was acknowledged)"
	}
	return resumeFlag(s.Resume)
}

// resumeFlag is the selection flag of r, "" for none.
func resumeFlag(r republish.Resume) string {
	switch {
	case r.IsZero():
		return ""
	case r.Since != "":
		return "--since '" + r.Since + "'"
	}
	return "--after-id " + r.AfterID
}

func perSecond(n int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(n) / d.Seconds())
}

// republishRows wires the table reader to the producer and prints progress.
func republishRows(ctx context.Context, c *republishConfig, kafkaOpts []kgo.Opt, log *slog.Logger) (republish.Summary, error) {
	source, err := resolveSource(ctx, &c.runConfig)
	if err != nil {
		return republish.Summary{}, err
	}
	// An explicit source too: the stream publishes under it, with the
	// epoch, after a lost history.
	if source, err = epochSource(ctx, &c.runConfig, source, kafkaOpts, log); err != nil {
		return republish.Summary{}, err
	}
	c.Mapping.Source = source
	since, until := c.times()
	began, lastProgress := time.Now(), time.Now()
	snk, err := sink.New(sink.Config{
		Brokers:            c.brokers(),
		Linger:             c.KafkaLinger,
		Compression:        c.KafkaCompression,
		MaxBufferedRecords: c.MaxInflightEvents + 1,
		MaxRecordBytes:     c.MaxRecordBytes,
		AutoCreateTopics:   c.KafkaAutoCreateTopics,
		Opts:               kafkaOpts,
	}, log)
	if err != nil {
		return republish.Summary{}, err
	}
	defer snk.Close()
	r, err := republish.New(republish.Config{
		URL:             c.PostgresURL,
		Table:           outboxTable(c.Table),
		Mapping:         c.Mapping,
		OnBadEvent:      c.OnBadEvent,
		DeadLetterTopic: c.DeadLetterTopic,
		MaxRecordBytes:  c.MaxRecordBytes,
		Select:          republish.Selection{AfterID: c.AfterID, UntilID: c.UntilID, Since: since, Until: until},
		BatchSize:       c.BatchSize,
		MaxInflight:     c.MaxInflightEvents,
		Log:             log,
		Explain:         explain,
		Progress: func(s republish.Summary) {
			if c.ProgressInterval == 0 || time.Since(lastProgress) < c.ProgressInterval {
				return
			}
			lastProgress = time.Now()
			log.Info("republishing", "rows_read", s.RowsRead, "acknowledged", s.Acked, "dead_lettered", s.DeadLettered,
				"rows_per_second", perSecond(s.Acked, time.Since(began)), "resume", resumeFlag(s.Resume))
		},
	}, snk)
	if err != nil {
		return republish.Summary{}, err
	}
	log.Info("republishing rows from the table", "table", outboxTable(c.Table).String(), "source", source, "after_id", c.AfterID, "until_id", c.UntilID,
		"since", c.Since, "until", c.Until)
	// What was sent is waited for, as long as it takes, or, after an
	// interrupt, --shutdown-timeout as run's shutdown does, so the resume
	// point is as far as it can be.
	flushCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(c.ShutdownTimeout, cancel) })()
	return r.Run(ctx, flushCtx)
}

// epochSource is the source base (--source, or its default) in the
// newest history epoch (checkpoint.Epoch) of the stream of --slot: after a
// lost history, the stream publishes the new history's events under it,
// whether base is its default or given, and a row sent again under base
// could share source and id with an event of the lost history, which a
// consumer would take it for. A row carries no LSN, so every row goes
// under the newest epoch's source: a row of an earlier history is then a
// repeat under another source, which a consumer processes again, never one
// it drops.
func epochSource(ctx context.Context, c *runConfig, base string, kafkaOpts []kgo.Opt, log *slog.Logger) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	stream, err := replication.StreamIdentity(ctx, c.PostgresURL, c.Slot)
	if err != nil {
		return "", fmt.Errorf("read the stream's identity for its history epochs: %w", err)
	}
	cp, err := sink.ReadCheckpoint(ctx, sink.Config{Brokers: c.brokers(), Opts: kafkaOpts}, c.CheckpointTopic, stream, stream)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return base, nil // no topic, no epoch
	case err != nil:
		return "", fmt.Errorf("read the stream's history epochs (%w): without them, rows could share source and id with events of a lost history; "+
			"check --checkpoint-topic and --slot (those of run) and that Kafka is reachable", err)
	}
	es, err := checkpoint.DecodeEpochs(cp.Epochs)
	if err != nil {
		return "", err
	}
	if len(es) == 0 {
		return base, nil
	}
	last := es[len(es)-1]
	source := checkpoint.Source(base, last.N)
	log.Warn("the stream is in a later history epoch: rows are published under its source, so that none shares source and id with an event of a lost history; "+
		"rows of an earlier history are repeated under it", "source", source, "epoch", last.String(), "slot", c.Slot, "checkpoint_topic", c.CheckpointTopic)
	return source, nil
}
