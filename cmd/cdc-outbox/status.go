package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/checkpoint"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/shard"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// statusConfig is everything `cdc-outbox status` is told. The connection
// flags are those of run, with the same names, defaults and environment
// variables, so one environment serves both commands.
type statusConfig struct {
	PostgresURL string
	Slot        string
	Publication string
	Table       string
	MetricsURL  string
	JSON        bool
	Timeout     time.Duration
	Shards      int
	// kafka holds --delivery, --checkpoint-topic and the Kafka connection:
	// status reads the stream's history epochs from the checkpoint topic,
	// and in exactly-once delivery the Kafka checkpoint too.
	kafka runConfig
	// given reports whether a flag was given (flags.given); nil: none was.
	given func(name string) bool
}

// readsKafka reports whether status reads the checkpoint topic: always in
// exactly-once delivery, whose checkpoint it shows; in at-least-once when
// Kafka is named, since a status of the database alone must not wait on
// a Kafka it was not told of.
func (c *statusConfig) readsKafka() bool {
	return c.kafka.Delivery == deliveryExactlyOnce || c.given != nil && c.given("kafka-brokers")
}

func statusFlags(c *statusConfig) *flags {
	f := newFlags("cdc-outbox status", "Show the health of cdc-outbox's replication slot: its position, the WAL it holds,\n"+
		"its publication and the outbox table. Read-only, on a normal (not a replication) connection.\n"+
		"Exit code: 0 healthy (an inactive slot is healthy, with a warning), 1 the slot is missing\n"+
		"or its wal_status is lost, or run cannot stream from this server as this role (wal_level,\n"+
		"REPLICATION, an UNLOGGED table: checked first, as run does), 2 PostgreSQL cannot be reached\n"+
		"or read, or a flag is wrong.")
	f.String(&c.PostgresURL, "postgres-url", "", "PostgreSQL connection `url` or key=value string; PG* environment variables fill what it leaves out")
	f.String(&c.Slot, "slot", "cdc_outbox", "`name` of the logical replication slot")
	f.String(&c.Publication, "publication", "cdc_outbox", "`name` of the publication")
	f.String(&c.Table, "table", contract.DefaultTable, runTableHelp)
	f.Int(&c.Shards, "shards", 1, "the `count` of slots the outbox is split over (run's --shards): each shard's slot is read, and the report is the worst shard's, with every shard listed")
	f.String(&c.MetricsURL, "metrics-url", "", "`url` of the running streamer's /metrics (its --http-addr), read for each outbox table's events streamed and last event; empty: not read")
	deliveryFlags(f, &c.kafka)
	f.String(&c.kafka.KafkaBrokers, "kafka-brokers", "127.0.0.1:9092", "Kafka bootstrap `brokers`, comma-separated, to read the stream's history epochs (from --checkpoint-topic) "+
		"and, in exactly-once delivery, the checkpoint from; in at-least-once delivery Kafka is read only when this is given")
	kafkaSecurityFlags(f, &c.kafka)
	f.Bool(&c.JSON, "json", false, "print one JSON object instead of text")
	f.Duration(&c.Timeout, "timeout", 10*time.Second, "give up connecting and reading after this long")
	c.given = f.given
	return f
}

func (c *statusConfig) validate() error {
	var p problems
	p.source(c.PostgresURL, c.Publication, c.Slot)
	_, err := pgname.ParseList(c.Table)
	p.check(err == nil, "--table %q: %v", c.Table, err)
	p.check(c.MetricsURL == "" || strings.HasPrefix(c.MetricsURL, "http://") || strings.HasPrefix(c.MetricsURL, "https://"),
		"--metrics-url %q: give the streamer's http://host:port/metrics", c.MetricsURL)
	p.check(c.Timeout > 0, "--timeout %s: must be positive", c.Timeout)
	p.check(c.Shards >= 1 && c.Shards <= shard.Max, "--shards %d: give 1 (one slot) to %d", c.Shards, shard.Max)
	k := &c.kafka
	p.check(k.Delivery == deliveryAtLeastOnce || k.Delivery == deliveryExactlyOnce, "--delivery %q: use %s or %s", k.Delivery, deliveryAtLeastOnce, deliveryExactlyOnce)
	if c.readsKafka() {
		p.check(strings.TrimSpace(k.KafkaBrokers) != "", "--kafka-brokers is empty: give host:port[,host:port...]")
		p.check(k.CheckpointTopic != "", "--checkpoint-topic is empty")
		k.validateKafkaSecurity(&p)
	}
	return errors.Join(p...)
}

// Verdicts, as the JSON key verdict gives them.
const (
	verdictHealthy       = "healthy"
	verdictUnmet         = "prerequisite_unmet"
	verdictInactive      = "slot_inactive"
	verdictMissing       = "slot_missing"
	verdictLost          = "wal_lost"
	verdictCannotConnect = "cannot_connect"
	verdictCannotRead    = "cannot_read"
)

// statusReport is what status found. `cdc-outbox status --json` prints it
// as one JSON object. Its keys are stable, and every key is always present:
//
//	verdict              healthy, slot_inactive, prerequisite_unmet (the server,
//	                     the role or the table is not fit for streaming, as
//	                     cdc-outbox run would say), slot_missing, wal_lost,
//	                     cannot_connect or cannot_read
//	exit_code            the process's exit code: 0, 1 or 2
//	message              the verdict in words, with what to do ("" when healthy)
//	warnings             further problems, each saying what to do ([] when none)
//	error                why PostgreSQL could not be reached or read ("" unless exit_code is 2)
//	slot                 --slot
//	slot_exists          whether pg_replication_slots has the slot
//	plugin               the slot's output plugin; cdc-outbox needs pgoutput
//	database             the database the slot belongs to
//	active               whether a walsender is streaming from the slot
//	active_pid           that walsender's pid; 0 when inactive
//	holder_client_addr   the address the streaming process connects from (in Kubernetes,
//	                     the holding pod's IP); "" when inactive, over a Unix socket, or
//	                     when the role may not see that session
//	holder_since         when that process's replication connection began, RFC 3339 in UTC;
//	                     "" when not known
//	confirmed_flush_lsn  the position the streamer confirmed last, e.g. "0/1A2B3C4"
//	restart_lsn          the oldest WAL position the slot still needs ("0/0" when none)
//	current_wal_lsn      the server's WAL position when read
//	lag_bytes            current_wal_lsn - confirmed_flush_lsn: WAL not yet confirmed
//	retained_wal_bytes   current_wal_lsn - restart_lsn: WAL the server keeps for the slot
//	retained_wal         retained_wal_bytes, human-readable ("1.5 GiB")
//	wal_status           reserved, extended, unreserved or lost
//	invalidation_reason  why PostgreSQL invalidated the slot (17+): wal_removed, rows_removed,
//	                     wal_level_insufficient, idle_timeout (18+); "" while valid or on older servers
//	conflicting          a logical slot on a standby invalidated by a conflict with recovery (16+;
//	                     false on older servers)
//	inactive_since       when the slot was last released (17+), RFC 3339 in UTC; "" while active
//	                     or on older servers
//	failover             a failover slot (17+): standbys with sync_replication_slots = on keep a copy
//	synced               the slot is such a copy: read on a standby (or on one promoted since)
//	server_in_recovery   the server read is a standby
//	synchronized_standby_slots  the server's setting (17+): the standbys' physical slots the
//	                     logical walsenders wait for; "" when unset or on older servers
//	standbys_streaming   every slot synchronized_standby_slots names exists and is active
//	failover_ready       a failover keeps the stream: a failover slot, and every standby
//	                     --postgres-url names (its other hosts) holds a synchronized, persistent
//	                     copy of the slot close to the primary's position
//	failover_not_ready_reason  why not: not_failover_slot, no_standby (--postgres-url names one
//	                     host), or the first standby's state; "" when ready
//	failover_standbys    each standby: {standby (host:port), state (ready, temporary, behind,
//	                     missing, not_synced, invalidated, unreachable), confirmed_flush_lsn,
//	                     behind_bytes, error}; [] when none is read
//	publication          --publication
//	publication_exists   whether pg_publication has it
//	publishes_inserts    whether the publication publishes inserts
//	publication_tables   its tables as schema.table (a part in double quotes where
//	                     it needs them), from pg_publication_tables ([] when none)
//	table                --table, as schema.table
//	table_exists         whether the outbox table exists
//	table_in_publication whether the publication publishes every insert into
//	                     the outbox table (for a partitioned one, into each
//	                     partition), comparing relations, not names
//	table_rows_estimate  the table's pg_class.reltuples; -1 when unknown
//	                     (never analyzed, or no such table)
//	outboxes             every outbox table --table names or matches now, each an object:
//	                     table, oid, in_publication, rows_estimate (-1 when unknown),
//	                     events_streamed and last_event (from --metrics-url: the running
//	                     streamer's count and the commit time of its last event, RFC 3339;
//	                     -1 and "" when not read)
//	schemas              from --metrics-url, the schemas the running streamer writes values by
//	                     (--value-format avro, protobuf, json-schema), each an object: outbox,
//	                     registry, subject, schema_id, version; [] when not read or none
//	delivery             --delivery: at-least-once or exactly-once
//	kafka_checkpoint_lsn exactly-once: the slot's last checkpoint committed in Kafka
//	                     (--checkpoint-topic), "0/0" when none or in at-least-once delivery;
//	                     transactions up to it are in Kafka, and a start skips them
//	kafka_checkpoint_at  when that checkpoint was written, RFC 3339 in UTC; "" when none
//	kafka_ahead_bytes    kafka_checkpoint_lsn - confirmed_flush_lsn when positive: WAL that
//	                     PostgreSQL sends again at the next start and cdc-outbox skips
//	shards               with --shards above 1, each shard: {shard ("1 of 4"), slot, publication,
//	                     verdict, active, confirmed_flush_lsn, lag_bytes, retained_wal_bytes,
//	                     wal_status}, and the other keys are the worst shard's (the highest
//	                     exit code, then the most lag); [] for a stream not split
//
// The slot keys are zero ("", false, 0, "0/0") when the slot does not
// exist; everything but verdict, exit_code, message, error and the names
// given as flags is zero when PostgreSQL could not be reached or read.
type statusReport struct {
	Verdict  string   `json:"verdict"`
	ExitCode int      `json:"exit_code"`
	Message  string   `json:"message"`
	Warnings []string `json:"warnings"`
	Error    string   `json:"error"`

	Slot              string `json:"slot"`
	SlotExists        bool   `json:"slot_exists"`
	Plugin            string `json:"plugin"`
	Database          string `json:"database"`
	Active            bool   `json:"active"`
	ActivePID         int32  `json:"active_pid"`
	HolderClientAddr  string `json:"holder_client_addr"`
	HolderSince       string `json:"holder_since"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	RestartLSN        string `json:"restart_lsn"`
	CurrentWALLSN     string `json:"current_wal_lsn"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	RetainedWAL       string `json:"retained_wal"`
	WALStatus         string `json:"wal_status"`
	// Since PostgreSQL 16 and 17; zero on older servers.
	InvalidationReason string `json:"invalidation_reason"`
	Conflicting        bool   `json:"conflicting"`
	InactiveSince      string `json:"inactive_since"`
	inactiveFor        time.Duration
	// Failover slots, PostgreSQL 17+; zero on older servers.
	Failover                 bool              `json:"failover"`
	Synced                   bool              `json:"synced"`
	InRecovery               bool              `json:"server_in_recovery"`
	SynchronizedStandbySlots string            `json:"synchronized_standby_slots"`
	StandbysStreaming        bool              `json:"standbys_streaming"`
	FailoverReady            bool              `json:"failover_ready"`
	FailoverNotReadyReason   string            `json:"failover_not_ready_reason"`
	FailoverStandbys         []failoverStandby `json:"failover_standbys"`
	major                    int
	standbys                 bool // the server has physical slots: standbys replicate from it

	Publication        string         `json:"publication"`
	PublicationExists  bool           `json:"publication_exists"`
	PublishesInserts   bool           `json:"publishes_inserts"`
	PublicationTables  []string       `json:"publication_tables"`
	Table              string         `json:"table"`
	TableExists        bool           `json:"table_exists"`
	TableInPublication bool           `json:"table_in_publication"`
	TableRowsEstimate  int64          `json:"table_rows_estimate"`
	Outboxes           []statusOutbox `json:"outboxes"`
	// Schemas are the schemas the running streamer writes by (from
	// --metrics-url; [] when not read, or with raw values).
	Schemas []statusSchema `json:"schemas"`
	// TemporaryTables are temporary tables (any session's) that match a
	// pattern: never streamed.
	TemporaryTables []string `json:"temporary_tables"`
	// Membership says whether tables that come to match a pattern join the
	// publication by themselves: "installed", "all tables" (a publication
	// FOR ALL TABLES), "missing"; "" without a pattern.
	Membership string `json:"membership_trigger"`

	Delivery           string `json:"delivery"`
	KafkaCheckpointLSN string `json:"kafka_checkpoint_lsn"`
	KafkaCheckpointAt  string `json:"kafka_checkpoint_at"`
	KafkaAheadBytes    int64  `json:"kafka_ahead_bytes"`
	// HistoryEpoch is the stream's newest history epoch (0: no history
	// was lost), Epochs each epoch as its record says it.
	HistoryEpoch int      `json:"history_epoch"`
	Epochs       []string `json:"history_epochs"`
	// EpochsRead: the checkpoint topic was read (in at-least-once
	// delivery, only when Kafka is named).
	EpochsRead  bool `json:"history_epochs_read"`
	epochsAsked bool // the checkpoint topic was to be read

	Shards []statusShard `json:"shards"`

	connectedDB string // the database --postgres-url connects to
	// unmet is why cdc-outbox run cannot stream from this server as this
	// role, whatever the slot says (wal_level, REPLICATION, an UNLOGGED
	// table); nil when nothing is.
	unmet error
	// publicationProblem is what the publication misses of the table, with
	// the fix, when TableInPublication is false.
	publicationProblem string
}

// statusSchema is a schema the running streamer writes an outbox's values
// by, as its /metrics says (cdc_outbox_schema_info).
type statusSchema struct {
	Outbox   string `json:"outbox"`
	Registry string `json:"registry"`
	Subject  string `json:"subject"`
	ID       int    `json:"schema_id"`
	Version  int    `json:"version"`
}

// statusOutbox is one outbox table in the status report.
type statusOutbox struct {
	Table          string `json:"table"`
	OID            uint32 `json:"oid"`
	InPublication  bool   `json:"in_publication"`
	RowsEstimate   int64  `json:"rows_estimate"`
	EventsStreamed int64  `json:"events_streamed"`
	LastEvent      string `json:"last_event"`
	problem        string // what the publication misses of it, with the fix
}

func statusCommand(args []string, stdout, stderr io.Writer) int {
	var c statusConfig
	f := statusFlags(&c)
	if code, ok := f.load(args, c.validate, stdout, stderr); !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	r := readShardsStatus(ctx, &c)
	if r.Error != "" {
		// Said on stderr in both formats, so a script capturing only the
		// JSON still leaves the reason in its log.
		fmt.Fprintf(stderr, "cdc-outbox status: %s\n", r.Message)
	}
	if c.JSON {
		b, err := json.Marshal(r)
		if err != nil { // cannot happen: strings, numbers and booleans only
			fmt.Fprintf(stderr, "cdc-outbox status: %v\n", err)
			return 2
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else if r.Error == "" {
		r.writeText(stdout)
	}
	return r.ExitCode
}

func newStatusReport(c *statusConfig) *statusReport {
	return &statusReport{
		Warnings:           []string{},
		Slot:               c.Slot,
		ConfirmedFlushLSN:  "0/0",
		RestartLSN:         "0/0",
		CurrentWALLSN:      "0/0",
		RetainedWAL:        humanBytes(0),
		Publication:        c.Publication,
		PublicationTables:  []string{},
		FailoverStandbys:   []failoverStandby{},
		Table:              statusTable(c.Table),
		Outboxes:           []statusOutbox{},
		Schemas:            []statusSchema{},
		TemporaryTables:    []string{},
		TableRowsEstimate:  -1,
		Delivery:           c.kafka.Delivery,
		KafkaCheckpointLSN: "0/0",
		Shards:             []statusShard{},
	}
}

// readStatus connects, reads and judges. It never returns nil; on failure
// the report says why, with exit code 2.
func readStatus(ctx context.Context, c *statusConfig) *statusReport {
	r := newStatusReport(c)
	ps, _ := pgname.ParseList(c.Table)
	one := len(ps) == 1 && !ps[0].IsGlob()
	var name pgname.Name
	if one {
		name = ps[0].Name()
	}
	in, err := replication.Inspect(ctx, c.PostgresURL, replication.Names{Slot: c.Slot, Publication: c.Publication, Table: name})
	var outboxes replication.OutboxesInspection
	if err == nil {
		outboxes, err = replication.InspectOutboxes(ctx, c.PostgresURL, c.Publication, ps)
	}
	var connect *replication.ConnectError
	switch {
	case errors.As(err, &connect):
		r.fail(verdictCannotConnect, say(connect), err)
		return r
	case err != nil:
		r.fail(verdictCannotRead, fmt.Sprintf("cannot read the status: check that the role may read "+
			"pg_replication_slots, pg_publication and pg_class, and that the server is the primary: %v", say(err)), err)
		return r
	}
	r.fill(in)
	r.fillOutboxes(outboxes.Tables, !one)
	r.fillMembership(outboxes, c.Publication)
	if c.MetricsURL != "" {
		r.readStreamed(ctx, c.MetricsURL)
	}
	r.judge()
	r.readFailover(ctx, c, in)
	if c.readsKafka() {
		r.epochsAsked = true
		r.readKafkaCheckpoint(ctx, c, in)
	}
	return r
}

// readKafkaCheckpoint adds the stream's history epochs, and the Kafka
// checkpoint of exactly-once delivery, to the report; failing to read them
// is a warning. The epochs record lives in the checkpoint topic in either
// delivery.
func (r *statusReport) readKafkaCheckpoint(ctx context.Context, c *statusConfig, in replication.Inspection) {
	opts, err := c.kafka.kafkaSecurityOpts()
	if err == nil {
		var cp sink.Checkpoint
		cp, err = readCheckpoint(ctx, c, sink.Config{Brokers: c.kafka.brokers(), Opts: opts})
		if errors.Is(err, kerr.UnknownTopicOrPartition) && c.kafka.Delivery == deliveryAtLeastOnce {
			// An at-least-once stream creates the topic at its first
			// write: none yet, no epoch.
			err = nil
		}
		if err == nil && cp.Found && c.kafka.Delivery == deliveryExactlyOnce {
			r.KafkaCheckpointLSN = cp.LSN.String()
			r.KafkaCheckpointAt = cp.At.UTC().Format(time.RFC3339)
			if confirmed := in.Slot.ConfirmedFlush; r.SlotExists && cp.LSN > confirmed {
				r.KafkaAheadBytes = int64(cp.LSN - confirmed)
			}
		}
		if err == nil {
			r.EpochsRead = true
			err = r.readEpochs(cp.Epochs)
		}
	}
	switch {
	case err != nil && c.kafka.Delivery == deliveryExactlyOnce:
		r.Warnings = append(r.Warnings, fmt.Sprintf("cannot read the Kafka checkpoint of exactly-once delivery: %s; check --kafka-brokers, the TLS and SASL flags and --checkpoint-topic", say(err)))
	case err != nil:
		r.Warnings = append(r.Warnings, fmt.Sprintf("cannot read the stream's history epochs from Kafka: %s; check --kafka-brokers, the TLS and SASL flags and --checkpoint-topic", say(err)))
	}
}

// readEpochs adds the stream's history epochs, read with the checkpoint,
// and a warning while a lost history is recorded: its events are in Kafka.
func (r *statusReport) readEpochs(value []byte) error {
	es, err := checkpoint.DecodeEpochs(value)
	if err != nil || len(es) == 0 {
		return err
	}
	last := es[len(es)-1]
	r.HistoryEpoch = last.N
	for _, e := range es {
		r.Epochs = append(r.Epochs, e.String())
	}
	r.Warnings = append(r.Warnings, fmt.Sprintf("Kafka holds events of a history the database lost (%s): the stream publishes in epoch %d, its sources ending in /epoch-%d; "+
		"list the lost events with cdc-outbox lost-events and reconcile them (docs/guarantees.md)", last, last.N, last.N))
	return nil
}

// readCheckpoint reads the stream's Kafka checkpoint as run does: under
// the stream's identity, or else under the former default key, the slot's
// name, with the table's identity as origin; the epochs, under the
// stream's identity.
func readCheckpoint(ctx context.Context, c *statusConfig, cfg sink.Config) (sink.Checkpoint, error) {
	stream, err := replication.StreamIdentity(ctx, c.PostgresURL, c.Slot)
	if err != nil {
		return sink.Checkpoint{}, err
	}
	cp, err := sink.ReadCheckpoint(ctx, cfg, c.kafka.CheckpointTopic, stream, stream)
	if err != nil || cp.Found {
		return cp, err
	}
	// Only a stream of one table wrote under the former key.
	ps, err := pgname.ParseList(c.Table)
	if err != nil || len(ps) != 1 || ps[0].IsGlob() {
		return cp, nil
	}
	table, err := replication.TableIdentity(ctx, c.PostgresURL, ps[0].Name())
	switch {
	case errors.Is(err, replication.ErrNoTable):
		return cp, nil // no table, no checkpoint of its former key
	case err != nil:
		return sink.Checkpoint{}, err
	}
	former, err := sink.ReadCheckpoint(ctx, cfg, c.kafka.CheckpointTopic, c.Slot, table)
	// The epochs and the published record are kept under the stream's
	// identity only.
	former.Epochs, former.Published = cp.Epochs, cp.Published
	return former, err
}

func (r *statusReport) fail(verdict, message string, err error) {
	r.Verdict, r.ExitCode, r.Message, r.Error = verdict, 2, message, redact(err).Error()
}

// fill puts what the server said into the report.
func (r *statusReport) fill(in replication.Inspection) {
	r.connectedDB = in.Database
	r.unmet = in.Unmet
	if in.SlotExists {
		info := in.Slot
		r.SlotExists = true
		r.Plugin, r.Database = info.Plugin, info.Database
		r.Active, r.ActivePID = info.Active, info.ActivePID
		r.HolderClientAddr = info.HolderAddr
		if !info.HolderSince.IsZero() {
			r.HolderSince = info.HolderSince.UTC().Format(time.RFC3339)
		}
		r.ConfirmedFlushLSN = info.ConfirmedFlush.String()
		r.RestartLSN = info.RestartLSN.String()
		r.CurrentWALLSN = info.CurrentLSN.String()
		if info.CurrentLSN > info.ConfirmedFlush {
			r.LagBytes = int64(info.CurrentLSN - info.ConfirmedFlush)
		}
		r.RetainedWALBytes = max(info.RetainedBytes, 0)
		r.RetainedWAL = humanBytes(r.RetainedWALBytes)
		r.WALStatus = info.WALStatus
		r.InvalidationReason, r.Conflicting = info.InvalidationReason, info.Conflicting
		if !info.InactiveSince.IsZero() {
			r.InactiveSince = info.InactiveSince.UTC().Format(time.RFC3339)
			r.inactiveFor = info.InactiveFor
		}
		r.Failover, r.Synced, r.InRecovery = info.Failover, info.Synced, info.InRecovery
		r.SynchronizedStandbySlots, r.StandbysStreaming = info.StandbySlots, info.StandbysStreaming
	}
	r.major, r.InRecovery, r.standbys = in.Major, in.InRecovery, in.PhysicalSlots
	r.PublicationExists, r.PublishesInserts = in.Publication.Exists, in.Publication.Inserts
	for _, n := range in.Publication.Tables {
		r.PublicationTables = append(r.PublicationTables, n.String())
	}
	r.TableExists = in.TableExists
	r.TableRowsEstimate = in.RowsEstimate
	if in.Coverage != nil {
		r.TableInPublication, r.publicationProblem = in.Coverage.Complete(), in.Coverage.Problem()
	}
}

// statusTable is --table as the report names it: one table as
// schema.table, a list or pattern as given.
func statusTable(table string) string {
	ps, err := pgname.ParseList(table)
	if err == nil && len(ps) == 1 && !ps[0].IsGlob() {
		return ps[0].Name().String()
	}
	return table
}

// fillOutboxes lists the outbox tables; for a list or pattern (many) the
// table keys sum them up: exists when any matches, in the publication when
// every one is wholly, the rows estimate their sum.
func (r *statusReport) fillOutboxes(outboxes []replication.OutboxInspection, many bool) {
	var problems []string
	var rows int64
	for _, o := range outboxes {
		so := statusOutbox{Table: o.Table.Name.String(), OID: o.Table.OID, InPublication: o.Coverage.Complete() && o.Coverage.Publication != "",
			RowsEstimate: o.RowsEstimate, EventsStreamed: -1}
		if !so.InPublication && o.Coverage.Publication != "" {
			so.problem = o.Coverage.Problem()
			problems = append(problems, so.problem)
		}
		if rows >= 0 && o.RowsEstimate >= 0 {
			rows += o.RowsEstimate
		} else {
			rows = -1
		}
		r.Outboxes = append(r.Outboxes, so)
	}
	if !many {
		return
	}
	r.TableExists = len(outboxes) > 0
	r.TableInPublication = r.TableExists && len(problems) == 0
	r.publicationProblem = strings.Join(problems, "; ")
	r.TableRowsEstimate = -1
	if r.TableExists {
		r.TableRowsEstimate = rows
	}
}

// fillMembership reports the temporary tables the patterns match and
// whether tables that come to match join the publication, each a warning
// when it costs events.
func (r *statusReport) fillMembership(in replication.OutboxesInspection, publication string) {
	for _, t := range in.Temporary {
		r.TemporaryTables = append(r.TemporaryTables, t.Name.String())
		r.Warnings = append(r.Warnings, fmt.Sprintf("temporary table %s matches --table but is not streamed: a temporary table is private to its session and its rows are never written to the WAL; "+
			"if it was meant as an outbox, create it as a permanent table", t.Name))
	}
	m := in.Membership
	switch {
	case m == nil:
	case m.AllTables:
		r.Membership = "all tables"
	case m.Complete():
		r.Membership = "installed"
	default:
		r.Membership = "missing"
		r.Warnings = append(r.Warnings, fmt.Sprintf("tables that come to match --table will not join publication %q, so none of their rows will be streamed until each is added by hand: "+
			"the membership trigger is not installed, or not for these patterns. cdc-outbox run installs it when its role is a superuser (with --create-publication); otherwise run once, as a superuser: %s",
			publication, in.Command))
	}
}

// readStreamed reads the running streamer's per-outbox counts from its
// /metrics; failing to is a warning.
func (r *statusReport) readStreamed(ctx context.Context, url string) {
	streamed, last, schemas, err := scrapeOutboxes(ctx, url)
	if err != nil {
		r.Warnings = append(r.Warnings, fmt.Sprintf("cannot read the streamer's metrics at --metrics-url %s: %v", url, err))
		return
	}
	if schemas != nil {
		r.Schemas = schemas
	}
	for i := range r.Outboxes {
		o := &r.Outboxes[i]
		if n, ok := streamed[o.Table]; ok {
			o.EventsStreamed = n
		}
		if t, ok := last[o.Table]; ok && !t.IsZero() {
			o.LastEvent = t.UTC().Format(time.RFC3339)
		}
	}
}

// judge sets the verdict, exit code, message and warnings from what read
// found. The verdict is about streaming: first what run would stop on
// before it looks at the slot (wal_level, REPLICATION, an UNLOGGED table),
// then the slot: missing, lost, inactive. Other problems (publication,
// table, plugin) are warnings: they do not change the exit code.
func (r *statusReport) judge() {
	defer r.judgeUnmet()
	pub := pgname.Quote(r.Publication)
	qualified := outboxTable(r.Table).Quoted()
	warn := func(format string, args ...any) { r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...)) }

	if r.SlotExists && r.Plugin != "pgoutput" {
		warn("slot %q uses plugin %q, not pgoutput: cdc-outbox run refuses it; choose another --slot, or drop that slot if nothing else uses it", r.Slot, r.Plugin)
	}
	if r.SlotExists && r.connectedDB != "" && r.Database != r.connectedDB {
		warn("slot %q belongs to database %q, not %q (the one --postgres-url connects to): cdc-outbox run refuses it; connect to %q or choose another --slot",
			r.Slot, r.Database, r.connectedDB, r.Database)
	}
	if r.SlotExists && r.WALStatus == "unreserved" {
		warn("wal_status is unreserved: the slot holds more WAL (%s) than max_slot_wal_keep_size allows, and PostgreSQL removes some of it at the next checkpoint, "+
			"which loses the slot: start cdc-outbox run, or help it catch up, now", r.RetainedWAL)
	}
	r.judgeFailover(warn)
	switch {
	case !r.PublicationExists:
		warn("publication %q does not exist: cdc-outbox run creates it (unless --create-publication=false), or run CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
			r.Publication, pub, qualified)
	case !r.PublishesInserts:
		warn("publication %q does not publish inserts: run ALTER PUBLICATION %s SET (publish = 'insert')", r.Publication, pub)
	}
	if !r.TableExists && len(r.Outboxes) == 0 && r.Table != outboxTable(r.Table).String() {
		warn("no table matches %s in database %q yet: tables that match are streamed once created and in the publication (sql/outbox-membership.sql adds them as they are created); or check --table",
			r.Table, r.connectedDB)
	} else if !r.TableExists {
		warn("table %s does not exist in database %q: create it (sql/publication.sql has the default) or check --table", r.Table, r.connectedDB)
	} else if r.PublicationExists && !r.TableInPublication && r.publicationProblem != "" {
		warn("%s; or check --table and --publication", r.publicationProblem)
	} else if r.PublicationExists && !r.TableInPublication {
		warn("publication %q does not contain table %s: run ALTER PUBLICATION %s ADD TABLE %s, or check --table and --publication",
			r.Publication, r.Table, pub, qualified)
	}

	switch {
	case !r.SlotExists:
		r.Verdict, r.ExitCode = verdictMissing, 1
		r.Message = fmt.Sprintf("replication slot %q does not exist: start cdc-outbox run (it creates the slot) or check --slot", r.Slot)
	case r.invalidated():
		r.Verdict, r.ExitCode = verdictLost, 1
		reason := r.InvalidationReason
		if reason == "" && r.Conflicting {
			reason = "conflict"
		}
		what, prevent := replication.Invalidation(reason)
		r.Message = fmt.Sprintf("replication slot %q has wal_status lost: %s, so the slot can no longer stream. "+
			"Events committed after %s that it had not streamed never reach Kafka through it and must be recovered from the outbox table; "+
			"then start cdc-outbox run once with --recreate-slot, which drops the slot and creates a new one that streams what commits from then on. "+
			"To prevent it, %s",
			r.Slot, what, r.ConfirmedFlushLSN, prevent)
	case !r.Active:
		r.Verdict, r.ExitCode = verdictInactive, 0
		since := ""
		if r.InactiveSince != "" {
			since = fmt.Sprintf(" since %s (for %s)", r.InactiveSince, r.inactiveFor.Round(time.Second))
		}
		r.Message = fmt.Sprintf("slot %q is inactive%s: nothing is streaming from it, which is normal while cdc-outbox run is stopped; "+
			"it holds %s of WAL on the server, growing until a streamer confirms: start cdc-outbox run, or drop the slot if the outbox is no longer streamed",
			r.Slot, since, r.RetainedWAL)
	default:
		r.Verdict, r.ExitCode, r.Message = verdictHealthy, 0, ""
	}
}

// judgeUnmet puts first the condition run would stop on before it looks
// at the slot: the slot's own verdict is then a consequence (missing: run
// could not create it) or a second problem (a warning).
func (r *statusReport) judgeUnmet() {
	if r.unmet == nil {
		return
	}
	if r.Verdict != verdictMissing && r.Verdict != verdictHealthy && r.Message != "" {
		r.Warnings = append(r.Warnings, r.Message)
	}
	r.Verdict, r.ExitCode = verdictUnmet, 1
	r.Message = "cdc-outbox run cannot stream from this server as this role: " + say(r.unmet)
}

// judgeFailover warns about what would lose the slot in a failover, on
// failoverStandby is a standby's copy of the slot in the report.
type failoverStandby struct {
	Standby           string `json:"standby"`
	State             string `json:"state"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	BehindBytes       int64  `json:"behind_bytes"`
	Error             string `json:"error"`
}

// readFailover reads, from the standbys --postgres-url names, whether a
// failover keeps the stream; only on a primary with the slot.
func (r *statusReport) readFailover(ctx context.Context, c *statusConfig, in replication.Inspection) {
	if !in.SlotExists || in.InRecovery {
		return
	}
	f := replication.FailoverReadiness(ctx, c.PostgresURL, c.Slot, in.Slot.Failover, in.Slot.ConfirmedFlush)
	r.FailoverReady, r.FailoverNotReadyReason = f.Ready, f.Reason
	for _, sb := range f.Standbys {
		fs := failoverStandby{Standby: sb.Addr, State: sb.State, ConfirmedFlushLSN: sb.ConfirmedFlush.String(), BehindBytes: sb.BehindBytes}
		if sb.Err != nil {
			fs.Error = redact(sb.Err).Error()
		}
		r.FailoverStandbys = append(r.FailoverStandbys, fs)
		if sb.State != replication.StandbyReady {
			r.Warnings = append(r.Warnings, fmt.Sprintf("not ready for a failover to %s: %s", sb.Addr, standbyAdvice(fs)))
		}
	}
}

// standbyAdvice says what a standby's state means for a failover to it.
func standbyAdvice(s failoverStandby) string {
	switch s.State {
	case replication.StandbyTemporary:
		return "its copy of the slot is still temporary, and a promotion drops it; its log says why it is not synchronized " +
			"(\"could not synchronize replication slot\"): it turns persistent once the primary's slot passes the standby's own position, as cdc-outbox confirms"
	case replication.StandbyBehind:
		return fmt.Sprintf("its copy of the slot is at %s, %d bytes behind the primary's: a failover resumes there and sends the events since again; "+
			"check that its slot sync worker runs (sync_replication_slots = on)", s.ConfirmedFlushLSN, s.BehindBytes)
	case replication.StandbyMissing:
		return "it has no copy of the slot: set sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name and dbname in primary_conninfo there"
	case replication.StandbyNotSynced:
		return "its slot of that name is not a synchronized copy of the primary's (made there by hand): drop it, so that the primary's is synchronized"
	case replication.StandbyInvalidated:
		return "its copy of the slot is invalidated"
	case replication.StandbyUnreachable:
		return "it cannot be read: " + s.Error
	}
	return s.State
}

// servers that have failover slots (17+) and standbys to fail over to
// (physical slots: slot synchronization needs primary_slot_name).
func (r *statusReport) judgeFailover(warn func(string, ...any)) {
	switch {
	case r.major < 17 || !r.SlotExists:
	case !r.InRecovery && !r.standbys:
	case r.InRecovery && !r.Synced:
		warn("this server is a standby, and slot %q here is not a synchronized copy of the primary's: a promotion does not keep the stream. "+
			"On the primary make it a failover slot (cdc-outbox run --slot-failover, the default); on this standby set sync_replication_slots = on, "+
			"hot_standby_feedback = on, primary_slot_name, and dbname in primary_conninfo", r.Slot)
	case r.InRecovery:
	case !r.Failover:
		warn("slot %q is not a failover slot, so a failover to a standby loses it: start cdc-outbox run with --slot-failover (the default) to switch it, "+
			"or run ALTER_REPLICATION_SLOT %s (FAILOVER true) on a replication connection (psql \"dbname=<db> replication=database\")", r.Slot, r.Slot)
	case r.SynchronizedStandbySlots == "":
		warn("synchronized_standby_slots is not set on this primary: its walsender may send cdc-outbox changes a standby has not received yet, " +
			"and after a failover to that standby cdc-outbox stops once and resumes from the slot there, sending some events again. " +
			"Set it to the physical slots of the standbys that may take over: ALTER SYSTEM SET synchronized_standby_slots = '<slot>'; SELECT pg_reload_conf()")
	case !r.StandbysStreaming:
		warn("a standby slot named in synchronized_standby_slots (%s) is missing or inactive: until its standby streams again, "+
			"the walsender waits and cdc-outbox receives nothing; start the standby, or remove its slot from the setting", r.SynchronizedStandbySlots)
	}
}

// invalidated reports whether PostgreSQL invalidated the slot: wal_status
// lost, or (16+, 17+) conflicting or an invalidation_reason.
func (r *statusReport) invalidated() bool {
	return r.SlotExists && (r.WALStatus == "lost" || r.InvalidationReason != "" || r.Conflicting)
}

// writeText prints the report as aligned "key: value" lines, the verdict
// last.
func (r *statusReport) writeText(w io.Writer) {
	var lines [][2]string
	add := func(key, format string, args ...any) {
		lines = append(lines, [2]string{key, fmt.Sprintf(format, args...)})
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}

	for _, sh := range r.Shards {
		add("shard "+sh.Shard, "slot %s: %s, %s, confirmed %s, lag %s, retains %s (wal_status %s)", sh.Slot, strings.ReplaceAll(sh.Verdict, "_", " "),
			map[bool]string{true: "active", false: "inactive"}[sh.Active], sh.ConfirmedFlushLSN, humanBytes(sh.LagBytes), humanBytes(sh.RetainedWALBytes), orNone(sh.WALStatus))
	}
	if len(r.Shards) > 0 {
		add("worst shard", "%s (below)", r.Slot)
	}
	add("slot", "%s", r.Slot)
	add("  exists", "%s", yes(r.SlotExists))
	if r.SlotExists {
		add("  plugin", "%s", r.Plugin)
		add("  database", "%s", r.Database)
		switch {
		case r.Active:
			holder := ""
			if r.HolderClientAddr != "" {
				holder += ", client " + r.HolderClientAddr
			}
			if r.HolderSince != "" {
				holder += ", streaming since " + r.HolderSince
			}
			add("  active", "yes (pid %d%s)", r.ActivePID, holder)
		case r.InactiveSince != "":
			add("  active", "no, since %s (for %s)", r.InactiveSince, r.inactiveFor.Round(time.Second))
		default:
			add("  active", "no")
		}
		if r.LagBytes == 0 {
			add("  confirmed_flush_lsn", "%s (caught up with the server)", r.ConfirmedFlushLSN)
		} else {
			add("  confirmed_flush_lsn", "%s (%s behind the server's %s)", r.ConfirmedFlushLSN, humanBytes(r.LagBytes), r.CurrentWALLSN)
		}
		add("  restart_lsn", "%s", r.RestartLSN)
		if r.RetainedWALBytes < 1024 {
			add("  retained WAL", "%d bytes", r.RetainedWALBytes)
		} else {
			add("  retained WAL", "%d bytes (%s)", r.RetainedWALBytes, r.RetainedWAL)
		}
		walStatus := r.WALStatus
		if walStatus == "" {
			walStatus = "unknown (PostgreSQL before 13)"
		}
		add("  wal_status", "%s", walStatus)
		if r.InvalidationReason != "" {
			add("  invalidation_reason", "%s", r.InvalidationReason)
		}
		if r.Conflicting {
			add("  conflicting", "yes (with recovery on this standby)")
		}
		if r.major >= 17 {
			add("  failover", "%s", yes(r.Failover))
			add("  synced", "%s", yes(r.Synced))
		}
	}
	if r.InRecovery {
		add("server", "standby (in recovery)")
	}
	if r.major >= 17 && !r.InRecovery && r.standbys {
		add("synchronized_standby_slots", "%s", orNone(r.SynchronizedStandbySlots))
	}
	if r.SlotExists && !r.InRecovery && r.major >= 17 {
		if r.FailoverReady {
			add("failover ready", "yes")
		} else {
			add("failover ready", "no (%s)", r.FailoverNotReadyReason)
		}
		for _, sb := range r.FailoverStandbys {
			add("  standby "+sb.Standby, "%s, copy at %s", sb.State, sb.ConfirmedFlushLSN)
		}
	}
	add("publication", "%s", r.Publication)
	add("  exists", "%s", yes(r.PublicationExists))
	if r.PublicationExists {
		add("  publishes inserts", "%s", yes(r.PublishesInserts))
		add("  tables", "%s", listTables(r.PublicationTables, 10))
	}
	add("table", "%s", r.Table)
	add("  exists", "%s", yes(r.TableExists))
	if r.TableExists {
		add("  in publication", "%s", yes(r.TableInPublication))
		if r.TableRowsEstimate < 0 {
			add("  rows (estimate)", "unknown (never analyzed)")
		} else {
			add("  rows (estimate)", "%d", r.TableRowsEstimate)
		}
	}
	if len(r.Outboxes) > 1 || r.Table != outboxTable(r.Table).String() {
		add("outboxes", "%d", len(r.Outboxes))
		for _, o := range r.Outboxes {
			line := fmt.Sprintf("in publication %s, rows (estimate) %s", yes(o.InPublication), estimate(o.RowsEstimate))
			if o.EventsStreamed >= 0 {
				line += fmt.Sprintf(", streamed %d", o.EventsStreamed)
			}
			if o.LastEvent != "" {
				line += ", last event " + o.LastEvent
			}
			add("  "+o.Table, "%s", line)
		}
		if r.Membership != "" {
			add("  membership trigger", "%s", r.Membership)
		}
		for _, t := range r.TemporaryTables {
			add("  "+t, "TEMPORARY: not streamed")
		}
	} else if len(r.Outboxes) == 1 && r.Outboxes[0].EventsStreamed >= 0 {
		add("  streamed", "%d", r.Outboxes[0].EventsStreamed)
		add("  last event", "%s", orNone(r.Outboxes[0].LastEvent))
	}
	for i, sc := range r.Schemas {
		if i == 0 || sc.Registry != r.Schemas[i-1].Registry {
			add("schema registry", "%s", sc.Registry)
		}
		add("  "+sc.Outbox, "subject %s: schema %d, version %d", sc.Subject, sc.ID, sc.Version)
	}
	add("delivery", "%s", r.Delivery)
	if r.Delivery == deliveryExactlyOnce {
		switch {
		case r.KafkaCheckpointAt == "":
			add("  kafka checkpoint", "none yet")
		case r.KafkaAheadBytes > 0:
			add("  kafka checkpoint", "%s, written %s (%s ahead of the slot: sent again at the next start, and skipped)", r.KafkaCheckpointLSN, r.KafkaCheckpointAt, humanBytes(r.KafkaAheadBytes))
		default:
			add("  kafka checkpoint", "%s, written %s (the slot has confirmed it)", r.KafkaCheckpointLSN, r.KafkaCheckpointAt)
		}
	}
	switch {
	case r.HistoryEpoch > 0:
		add("  history epoch", "%d (the events' sources end in /epoch-%d)", r.HistoryEpoch, r.HistoryEpoch)
		for _, e := range r.Epochs {
			add("  lost history", "%s", e)
		}
	case r.EpochsRead:
		add("  history epoch", "0 (no history lost)")
	case r.epochsAsked:
		add("  history epoch", "not read (see the warning)")
	default:
		add("  history epoch", "not read (give --kafka-brokers to read it from --checkpoint-topic)")
	}
	for _, warning := range r.Warnings {
		add("warning", "%s", warning)
	}
	add("verdict", "%s", strings.ReplaceAll(r.Verdict, "_", " "))
	switch r.ExitCode {
	case 0:
		if r.Message != "" {
			add("warning", "%s", r.Message)
		}
	default:
		add("error", "%s", r.Message)
	}

	width := len("  confirmed_flush_lsn:") // the same column whatever is shown
	for _, l := range lines {
		width = max(width, len(l[0])+1)
	}
	for _, l := range lines {
		fmt.Fprintf(w, "%-*s %s\n", width, l[0]+":", l[1])
	}
}

func orNone(s string) string {
	if s == "" {
		return "(not set)"
	}
	return s
}

// listTables joins up to n tables; more are counted, not listed.
func listTables(tables []string, n int) string {
	if len(tables) == 0 {
		return "none"
	}
	if len(tables) <= n {
		return strings.Join(tables, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(tables[:n], ", "), len(tables)-n)
}

// humanBytes formats a byte count with binary units and at most one
// decimal: 512 B, 1.5 KiB, 16 MiB, 1.5 GiB.
func humanBytes(n int64) string {
	sign, u := "", uint64(n)
	if n < 0 {
		sign, u = "-", uint64(-(n+1))+1 // no overflow at math.MinInt64
	}
	if u < 1024 {
		return sign + strconv.FormatUint(u, 10) + " B"
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(u)/1024, 0
	for v >= 1023.95 && i < len(units)-1 { // would print as 1024.0
		v /= 1024
		i++
	}
	s := strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0")
	return sign + s + " " + units[i]
}
