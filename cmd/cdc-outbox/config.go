package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/internal/tracing"
	"github.com/cdc-outbox/cdc-outbox/outbox/contract"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

// runConfig is everything `cdc-outbox run` is told.
type runConfig struct {
	PostgresURL       string
	Table             string
	Publication       string
	Slot              string
	CreatePublication bool
	CreateSlot        bool
	RecreateSlot      bool
	SlotFailover      bool
	Shards            int

	KafkaBrokers          string
	KafkaLinger           time.Duration
	KafkaCompression      string
	KafkaAutoCreateTopics bool
	MaxRecordBytes        int

	KafkaTLS              bool
	KafkaTLSCAFile        string
	KafkaTLSCertFile      string
	KafkaTLSKeyFile       string
	KafkaTLSServerName    string
	KafkaSASLMechanism    string
	KafkaSASLUsername     string
	KafkaSASLPassword     string
	KafkaSASLPasswordFile string

	Mapping mapping.Config
	Source  string // --source; "" until run resolves the default
	// Outboxes is the configuration file's outboxes list; when it is
	// set, --table is not read.
	Outboxes        []outboxEntry
	OnBadEvent      string
	DeadLetterTopic string
	MessagePrefix   string

	// Value is the default outbox's value format; Registry the schema
	// registry's connection (schemas.go).
	Value    valueConfig
	Registry registryConfig

	Delivery            string
	TransactionalID     string
	CheckpointTopic     string
	TransactionInterval time.Duration

	MaxInflightEvents int
	MaxInflightBytes  int
	StatusInterval    time.Duration
	KeepaliveInterval time.Duration
	ReceiveTimeout    time.Duration
	ShutdownTimeout   time.Duration

	CPUs int

	HTTPAddr         string
	Pprof            bool
	SlotPollInterval time.Duration

	LogFormat string
	LogLevel  string
}

func runFlags(c *runConfig) *flags {
	f := newFlags("cdc-outbox run", "Stream inserts of a PostgreSQL outbox table to Kafka through logical replication.\n"+
		"A WAL position is confirmed to PostgreSQL only after Kafka acknowledged every event up to it.")
	f.String(&c.PostgresURL, "postgres-url", "", "PostgreSQL connection `url` or key=value string; PG* environment variables fill what it leaves out; the role needs REPLICATION")
	f.String(&c.Table, "table", contract.DefaultTable, runTableHelp)
	f.String(&c.Publication, "publication", "cdc_outbox", "`name` of the publication to stream")
	f.String(&c.Slot, "slot", "cdc_outbox", "`name` of the logical replication slot; it keeps the position across restarts")
	f.Bool(&c.CreatePublication, "create-publication", true, "create the publication (FOR TABLE <table> WITH (publish = 'insert'), and publish_via_partition_root = true for a partitioned table) when it is missing; "+
		"for a --table pattern, as a superuser, also install the membership trigger (sql/outbox-membership.sql) that adds tables created later to it")
	f.Bool(&c.CreateSlot, "create-slot", true, "create the replication slot (pgoutput) when it is missing")
	f.Bool(&c.RecreateSlot, "recreate-slot", false, "create the slot again when cdc-outbox made it before and it is gone, or drop and create it again when it lost its WAL (wal_status lost); changes in between are NOT streamed")
	f.Bool(&c.SlotFailover, "slot-failover", true, "on PostgreSQL 17+, make the slot a failover slot (created with failover = true, or switched to it at start), "+
		"which PostgreSQL synchronizes to standbys with sync_replication_slots = on; ignored, with a note, on 14-16")
	f.Int(&c.Shards, "shards", 1, "split the outbox over `count` slots (1 to 16), each with a publication that keeps the rows whose aggregate id hashes to it "+
		"(<publication>_shard_<i>_of_<n>, slot <slot>_shard_<i>_of_<n>), streamed in parallel by this process; PostgreSQL 15+. Changing it on a running stream is a procedure (docs/sharding.md)")

	kafkaFlags(f, c)
	mappingFlags(f, c)
	f.String(&c.MessagePrefix, "message-prefix", contract.DefaultMessagePrefix, "`prefix` of outbox messages: pg_logical_emit_message(true, <prefix>, <envelope>) is published as the event an outbox row "+
		"of the same values would be; messages of other prefixes are passed over")
	f.outboxes = &c.Outboxes
	valueFlags(f, c)

	deliveryFlags(f, c)
	f.String(&c.TransactionalID, "transactional-id", "", "exactly-once: the Kafka transactional `id`; a new instance with the same id fences the old one. Default cdc-outbox-<system identifier>-<database OID>-<slot>")
	f.Duration(&c.TransactionInterval, "transaction-interval", 100*time.Millisecond, "exactly-once: least time between Kafka transaction commits (sooner when half of --max-inflight-events wait); "+
		"longer means bigger transactions and more latency")
	f.Int(&c.MaxInflightEvents, "max-inflight-events", 20000, "`events` sent but not yet acknowledged before reading pauses")
	f.Int(&c.MaxInflightBytes, "max-inflight-bytes", 16<<20, "`bytes` sent but not yet acknowledged before reading pauses")
	f.Duration(&c.StatusInterval, "status-interval", 200*time.Millisecond, "least time between position updates to PostgreSQL; smaller means fewer repeats after a crash")
	f.Duration(&c.KeepaliveInterval, "keepalive-interval", 10*time.Second, "most time between status updates; keep it well below the server's wal_sender_timeout")
	f.Duration(&c.ReceiveTimeout, "receive-timeout", 30*time.Second, "how long PostgreSQL may send nothing on the replication connection (a reply is requested at half of it) before it is taken for dead and opened again; "+
		"also bounds connecting. 0 turns it off")
	f.Duration(&c.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long to wait for in-flight events")

	f.Int(&c.CPUs, "cpus", 1, "CPUs the Go runtime may use at once (GOMAXPROCS); 0 keeps Go's default (all of them, or the GOMAXPROCS variable). "+
		"With 1, a goroutine woken on the data path never wakes a second thread, which costs CPU per event")

	f.String(&c.HTTPAddr, "http-addr", ":8080", "`address` of the HTTP endpoint serving /metrics, /healthz and /readyz; empty turns it off")
	f.Bool(&c.Pprof, "pprof", false, "also serve Go's profiler under /debug/pprof/ on the HTTP endpoint (CPU and allocation profiles)")
	f.Duration(&c.SlotPollInterval, "slot-poll-interval", 15*time.Second, "how often to read the slot's retained WAL and wal_status for metrics")

	logFlags(f, c)
	return f
}

// kafkaFlags are the producer's flags, run's and republish's.
func kafkaFlags(f *flags, c *runConfig) {
	f.String(&c.KafkaBrokers, "kafka-brokers", "127.0.0.1:9092", "Kafka bootstrap `brokers`, comma-separated")
	f.Duration(&c.KafkaLinger, "kafka-linger", 5*time.Millisecond, "how long a batch waits for more records")
	f.String(&c.KafkaCompression, "kafka-compression", "none", "batch compression: none, gzip, snappy, lz4 or zstd")
	f.Bool(&c.KafkaAutoCreateTopics, "kafka-auto-create-topics", true, "let the broker create missing topics (where its auto.create.topics.enable allows)")
	f.Int(&c.MaxRecordBytes, "max-record-bytes", 1048576, "largest record to send, in `bytes`; keep it at or below the broker's message.max.bytes. Larger rows are bad events")
	kafkaSecurityFlags(f, c)
}

// kafkaSecurityFlags are the flags of a Kafka connection's TLS and SASL,
// the producer's and status's.
func kafkaSecurityFlags(f *flags, c *runConfig) {
	f.Bool(&c.KafkaTLS, "kafka-tls", false, "connect to the brokers with TLS (their SSL or SASL_SSL listener), verifying their certificates with the system's CAs or --kafka-tls-ca-file")
	f.String(&c.KafkaTLSCAFile, "kafka-tls-ca-file", "", "PEM `file` of the CA certificates that verify the brokers, instead of the system's; needs --kafka-tls")
	f.String(&c.KafkaTLSCertFile, "kafka-tls-cert-file", "", "PEM `file` of a client certificate, for brokers that require one (ssl.client.auth); needs --kafka-tls-key-file")
	f.String(&c.KafkaTLSKeyFile, "kafka-tls-key-file", "", "PEM `file` of the client certificate's private key")
	f.String(&c.KafkaTLSServerName, "kafka-tls-server-name", "", "host `name` the brokers' certificates must be valid for; default: the host of each broker address")
	f.String(&c.KafkaSASLMechanism, "kafka-sasl-mechanism", saslNone, "SASL mechanism: none, plain, scram-sha-256 or scram-sha-512 (use TLS with plain: it sends the password as it is)")
	f.String(&c.KafkaSASLUsername, "kafka-sasl-username", "", "SASL `user` name")
	f.String(&c.KafkaSASLPassword, "kafka-sasl-password", "", "SASL `password`; a command line is visible to other users of the machine: prefer --kafka-sasl-password-file")
	f.String(&c.KafkaSASLPasswordFile, "kafka-sasl-password-file", "", "`file` holding the SASL password, read at start; a trailing newline is not part of it")
}

// mappingFlags say how a row becomes a record and what becomes of a row
// that cannot, for run and republish alike: both must produce the same
// records.
func mappingFlags(f *flags, c *runConfig) {
	m := mapping.DefaultConfig()
	f.String(&c.Mapping.Topic, "topic", m.Topic, "topic `template`; {column} is replaced by that column's value")
	f.String(&c.Source, "source", "", "`name` of this outbox in the source header of every record, with which consumers tell its event ids from other outboxes'; "+
		"default <system identifier>/<database OID>/<table OID>, unique to the table and kept across restarts, failover and renames")
	f.String((*string)(&c.Mapping.Format), "record-format", string(m.Format), "record layout: native (headers id, event_type, aggregate_type, source; the payload as value), "+
		"cloudevents-binary (CloudEvents Kafka binding: ce_* headers, the payload as value) or cloudevents-structured (the CloudEvents JSON event as value); "+
		"the CloudEvents formats need --source to be a URI-reference, which the default is")
	f.String(&c.Mapping.IDColumn, "column-id", m.IDColumn, "event id `column` (header id)")
	f.String(&c.Mapping.AggregateTypeColumn, "column-aggregate-type", m.AggregateTypeColumn, "aggregate type `column` (header aggregate_type)")
	f.String(&c.Mapping.AggregateIDColumn, "column-aggregate-id", m.AggregateIDColumn, "aggregate id `column` (the record key)")
	f.String(&c.Mapping.EventTypeColumn, "column-event-type", m.EventTypeColumn, "event type `column` (header event_type)")
	f.String(&c.Mapping.PayloadColumn, "column-payload", m.PayloadColumn, "payload `column` (the record value): jsonb, json, text or bytea")
	f.String(&c.Mapping.HeadersColumn, "column-headers", m.HeadersColumn, "optional json `column` whose keys become extra headers")
	f.String(&c.Mapping.CreatedAtColumn, "column-created-at", m.CreatedAtColumn, "optional timestamp `column` (the record timestamp)")
	f.String(&c.Mapping.TracingSpanContextColumn, "column-tracing-span-context", "", "optional text `column` holding the trace context as Debezium's outbox extensions write it "+
		"(tracingspancontext: traceparent=..., tracestate=...); it becomes the traceparent and tracestate headers unless the headers column has a traceparent")
	c.Mapping.MaxHeaderBytes = m.MaxHeaderBytes

	f.String(&c.OnBadEvent, "on-bad-event", pipeline.Fail, "what to do with a row that cannot be published: fail (stop, confirm nothing past it) or dead-letter")
	f.String(&c.DeadLetterTopic, "dead-letter-topic", "outbox.dead-letter", "`topic` for bad rows under --on-bad-event=dead-letter")
}

// deliveryFlags say how events are delivered and where exactly-once keeps
// its position: run's and status's.
func deliveryFlags(f *flags, c *runConfig) {
	f.String(&c.Delivery, "delivery", deliveryAtLeastOnce, "at-least-once (a crash may repeat events in flight; consumers dedupe by event id) or exactly-once "+
		"(Kafka transactions: each PostgreSQL transaction's records and a checkpoint of its LSN commit together; consumers must read with isolation.level=read_committed)")
	f.String(&c.CheckpointTopic, "checkpoint-topic", "cdc_outbox.checkpoints", "compacted `topic` of the checkpoint records (exactly-once; key: <system identifier>/<database OID>/<slot>) and, in either delivery, of the history epochs a lost history begins (key: .../epochs) and of how far an at-least-once stream published (key: .../published); created when missing")
}

// logFlags are every long-running command's.
func logFlags(f *flags, c *runConfig) {
	f.String(&c.LogFormat, "log-format", "text", "log format: text or json")
	f.String(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
}

// tableHelp is --table's, for run and status alike.
const tableHelp = "outbox `table`: schema.table, or table in schema public; read as PostgreSQL reads a name, so unquoted parts are folded to lower case " +
	"and a part in double quotes is taken as it is (\"Billing\".\"Outbox Events\")"

// runTableHelp is run's --table's, which takes several outboxes.
const runTableHelp = "outbox `tables`, comma-separated: schema.table, table in schema public, or a pattern whose unquoted parts may hold * " +
	"(*.outbox, tenant_*.outbox), all streamed over one slot and publication; read as PostgreSQL reads a name, so unquoted parts are folded to lower case " +
	"and a part in double quotes is taken as it is (\"Billing\".\"Outbox Events\")"

// outboxTable is --table parsed; validation has checked that it parses.
func outboxTable(table string) pgname.Name {
	n, _ := pgname.Parse(table)
	return n
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// problems collects what is wrong with a configuration, so that validation
// reports everything at once.
type problems []error

func (p *problems) check(ok bool, format string, args ...any) {
	if !ok {
		*p = append(*p, fmt.Errorf(format, args...))
	}
}

// source checks the settings run and status share: the server, the
// publication and the slot (each checks --table as it reads it).
func (p *problems) source(url, publication, slot string) {
	_, err := pgconn.ParseConfig(url)
	p.check(err == nil, "--postgres-url: %v", redact(err))
	p.check(publication != "", "--publication is empty")
	p.check(slotName.MatchString(slot), "--slot %q: slot names are 1-63 characters of a-z, 0-9 and _", slot)
}

// table checks where the outbox table is.
func (p *problems) table(url, table string) {
	_, err := pgconn.ParseConfig(url)
	p.check(err == nil, "--postgres-url: %v", redact(err))
	_, err = pgname.Parse(table)
	p.check(err == nil, "--table %q: %v", table, err)
	if ps, lerr := pgname.ParseList(table); err == nil && lerr == nil {
		p.check(len(ps) == 1 && !ps[0].IsGlob(), "--table %q: name one table here; a list or a pattern is run's", table)
	}
}

// validate checks every limit in one place, at start, with messages that
// say what to change.
func (c *runConfig) validate() error {
	var p problems
	check := p.check
	p.source(c.PostgresURL, c.Publication, c.Slot)
	c.validateOutboxes(&p)
	c.validateOutput(&p)
	c.validateValues(&p)
	c.validateShards(&p)
	check(c.MessagePrefix != "" && len(c.MessagePrefix) <= 255 && utf8.ValidString(c.MessagePrefix) && !strings.ContainsRune(c.MessagePrefix, 0),
		"--message-prefix %q: give 1 to 255 bytes of UTF-8 text", c.MessagePrefix)
	check(c.CPUs >= 0, "--cpus %d: must be 0 (Go's default) or positive", c.CPUs)
	check(c.MaxInflightBytes > 0, "--max-inflight-bytes %d: must be positive", c.MaxInflightBytes)
	check(c.StatusInterval > 0, "--status-interval %s: must be positive", c.StatusInterval)
	check(c.KeepaliveInterval >= c.StatusInterval, "--keepalive-interval %s: must be at least --status-interval (%s)", c.KeepaliveInterval, c.StatusInterval)
	check(c.ReceiveTimeout == 0 || c.ReceiveTimeout >= max(time.Second, 4*c.StatusInterval),
		"--receive-timeout %s: must be 0 (off) or at least 1s and 4 × --status-interval (%s)", c.ReceiveTimeout, c.StatusInterval)
	check(c.ShutdownTimeout >= 0, "--shutdown-timeout %s: must not be negative", c.ShutdownTimeout)
	check(c.SlotPollInterval >= time.Second, "--slot-poll-interval %s: must be at least 1s", c.SlotPollInterval)
	check(c.Delivery == deliveryAtLeastOnce || c.Delivery == deliveryExactlyOnce, "--delivery %q: use %s or %s", c.Delivery, deliveryAtLeastOnce, deliveryExactlyOnce)
	check(c.TransactionInterval > 0, "--transaction-interval %s: must be positive", c.TransactionInterval)
	check(c.CheckpointTopic != "", "--checkpoint-topic is empty: give the compacted topic that holds the positions")
	if tracing.Enabled(os.Getenv) {
		if err := tracing.CheckEnv(os.Getenv); err != nil {
			p = append(p, fmt.Errorf("tracing: %w", err))
		}
	}
	return errors.Join(p...)
}

// validateOutput checks what run and republish share: the producer, the
// mapping, the bad-event policy and the log.
func (c *runConfig) validateOutput(p *problems) {
	check := p.check
	check(strings.TrimSpace(c.KafkaBrokers) != "", "--kafka-brokers is empty: give host:port[,host:port...]")
	check(validSource(c.Source), "--source %q: give 1 to 255 bytes of printable UTF-8, or leave it empty for the default", c.Source)
	check(c.OnBadEvent == pipeline.Fail || c.OnBadEvent == pipeline.DeadLetter, "--on-bad-event %q: use fail or dead-letter", c.OnBadEvent)
	check(c.OnBadEvent != pipeline.DeadLetter || c.DeadLetterTopic != "", "--on-bad-event=dead-letter needs --dead-letter-topic")
	check(c.MaxInflightEvents > 0, "--max-inflight-events %d: must be positive", c.MaxInflightEvents)
	check(c.MaxRecordBytes >= 1024, "--max-record-bytes %d: must be at least 1024", c.MaxRecordBytes)
	check(c.KafkaLinger >= 0, "--kafka-linger %s: must not be negative", c.KafkaLinger)
	check(sink.KnownCompression(c.KafkaCompression), "--kafka-compression %q: use none, gzip, snappy, lz4 or zstd", c.KafkaCompression)
	c.validateKafkaSecurity(p)
	check(c.LogFormat == "text" || c.LogFormat == "json", "--log-format %q: use text or json", c.LogFormat)
	_, err := parseLevel(c.LogLevel)
	check(err == nil, "--log-level %q: %v", c.LogLevel, err)
	formatOK := slices.Contains(mapping.Formats(), c.Mapping.Format)
	check(formatOK, "--record-format %q: use native, cloudevents-binary or cloudevents-structured", c.Mapping.Format)
	ce := c.Mapping.Format == mapping.FormatCloudEventsBinary || c.Mapping.Format == mapping.FormatCloudEventsStructured
	check(!ce || c.Source == "" || mapping.ValidSource(c.Source),
		"--source %q: --record-format %s needs a URI-reference (RFC 3986: such as billing, /billing/outbox or urn:example:billing; percent-encode other characters), or leave it empty for the default", c.Source, c.Mapping.Format)
	if formatOK {
		cfg := c.Mapping
		cfg.Source = c.Source
		if cfg.Source == "" || ce && !mapping.ValidSource(cfg.Source) {
			// The default, resolved at start, is a URI-reference of this
			// shape; a bad --source is reported above.
			cfg.Source = "0/0/0"
		}
		if _, err := mapping.New(cfg); err != nil {
			*p = append(*p, err)
		}
	}
}

// Delivery modes.
const (
	deliveryAtLeastOnce = "at-least-once"
	deliveryExactlyOnce = "exactly-once"
)

func (c *runConfig) brokers() []string {
	var out []string
	for _, b := range strings.Split(c.KafkaBrokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// redact removes a password from an error that may quote a connection
// string.
func redact(err error) error {
	if err == nil {
		return nil
	}
	s := keywordPassword.ReplaceAllString(err.Error(), "${1}xxxxx")
	return errors.New(urlPassword.ReplaceAllString(s, "${1}xxxxx@"))
}

// say is err explained (explain), without a password, for the log and
// for status.
func say(err error) string { return redact(errors.New(explain(err))).Error() }

var (
	keywordPassword = regexp.MustCompile(`(password\s*=\s*)('[^']*'|\S+)`)
	urlPassword     = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
)
