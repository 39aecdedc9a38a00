package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// This file is the value formats of run: the payload as it is (raw), or
// Avro, Protobuf or JSON Schema in the Confluent wire format by the
// schemas of a registry (package schema). The registry is one per process
// (flags); the format, the subject and the version are each outbox's
// (flags for the default, keys of the file's outboxes entries).

// valueRaw is the value format that writes the payload as it is.
const valueRaw = "raw"

// Protobuf message choices (--schema-protobuf-message).
const (
	protoFirst     = "first"
	protoEventType = "event-type"
)

// registryConfig is the schema registry's connection, one per process.
type registryConfig struct {
	URL             string
	Username        string
	Password        string
	PasswordFile    string
	BearerToken     string
	BearerTokenFile string
	CAFile          string
	Timeout         time.Duration
}

// valueConfig is how one outbox's record values are written.
type valueConfig struct {
	Format          string        // raw, avro, protobuf, json-schema
	Strategy        string        // subject naming strategy: topic, record, topic-record
	Namespace       string        // qualifies a record name without a dot
	ID, Version     int           // a pinned schema id or subject version; 0 for none
	IDColumn        string        // a column naming the schema's global id
	VersionColumn   string        // a column naming the subject's version
	RecordColumn    string        // a column naming the record (and Protobuf message) name
	Refresh         time.Duration // how long the subject's latest version stands
	ProtobufMessage string        // first or event-type
	RegisterFile    string        // a schema file registered at start (opt-in)
	RegisterSubject string        // the subject it is registered under
}

// valueKeys are the keys of an outboxes entry that set its valueConfig, and
// the flags of the default outbox.
var valueKeys = []string{"value-format", "schema-subject-strategy", "schema-record-namespace", "schema-id", "schema-version",
	"column-schema-id", "column-schema-version", "column-schema-record", "schema-refresh", "schema-protobuf-message",
	"schema-register-file", "schema-register-subject"}

// valueIntKeys and valueDurationKeys are the valueKeys an entry gives as a
// YAML integer, or a duration string, rather than a string.
var (
	valueIntKeys      = map[string]bool{"schema-id": true, "schema-version": true}
	valueDurationKeys = map[string]bool{"schema-refresh": true}
)

// valueFlags are run's flags of the schema registry and of the default
// outbox's value format.
func valueFlags(f *flags, c *runConfig) {
	r, v := &c.Registry, &c.Value
	f.String(&v.Format, "value-format", valueRaw, "record value: raw (the payload as the service wrote it), or avro, protobuf or json-schema "+
		"(the payload encoded, or for json-schema validated, by its schema in --schema-registry-url, in the Confluent wire format: magic byte, 4-byte schema id, data)")
	f.String(&r.URL, "schema-registry-url", "", "`url` of the schema registry's Confluent-compatible REST API (Confluent: http://host:8081; Apicurio: http://host:8080/apis/ccompat/v7); "+
		"needed by a value format other than raw")
	f.String(&r.Username, "schema-registry-username", "", "HTTP basic authentication `user` for the schema registry")
	f.String(&r.Password, "schema-registry-password", "", "its `password`; a command line is visible to other users of the machine: prefer --schema-registry-password-file")
	f.String(&r.PasswordFile, "schema-registry-password-file", "", "`file` holding the schema registry password, read at start; a trailing newline is not part of it")
	f.String(&r.BearerToken, "schema-registry-bearer-token", "", "bearer `token` for the schema registry, instead of basic authentication; prefer --schema-registry-bearer-token-file")
	f.String(&r.BearerTokenFile, "schema-registry-bearer-token-file", "", "`file` holding the schema registry bearer token, read at start")
	f.String(&r.CAFile, "schema-registry-ca-file", "", "PEM `file` of the CA certificates that verify an https schema registry, instead of the system's")
	f.Duration(&r.Timeout, "schema-registry-timeout", 5*time.Second, "most time one schema registry request may take; the stream waits for it "+
		"(only for a schema it has not fetched yet), and a slower answer counts as none: the stream reads again later")
	f.String(&v.Strategy, "schema-subject-strategy", schema.TopicName.String(), "subject of an event's schema: topic (<topic>-value), record (<record name>) "+
		"or topic-record (<topic>-<record name>); the record name is --column-schema-record's value, else the event type, in --schema-record-namespace")
	f.String(&v.Namespace, "schema-record-namespace", "", "`namespace` that qualifies a record name without a dot (PaymentCreated in com.example is com.example.PaymentCreated)")
	f.Int(&v.ID, "schema-id", 0, "write every event by the schema of this global `id`; 0: by its subject")
	f.Int(&v.Version, "schema-version", 0, "write every event by this `version` of its subject; 0: the latest")
	f.String(&v.IDColumn, "column-schema-id", "", "optional `column` whose value, when not NULL, is the global id of the schema to write the row by")
	f.String(&v.VersionColumn, "column-schema-version", "", "optional `column` whose value, when not NULL, is the version of the subject to write the row by (e.g. schema_version)")
	f.String(&v.RecordColumn, "column-schema-record", "", "optional `column` whose value, when not NULL, is the row's record name (the record subject strategies, and the Protobuf message), instead of its event type")
	f.Duration(&v.Refresh, "schema-refresh", time.Minute, "how long a subject's latest version is used before the registry is asked again")
	f.String(&v.ProtobufMessage, "schema-protobuf-message", protoFirst, "protobuf: the message of the schema an event is written as: first (the file's first message) "+
		"or event-type (the message named by the event's record name: its type, or --column-schema-record's value)")
	f.String(&v.RegisterFile, "schema-register-file", "", "opt-in: a schema `file` that run registers at start under --schema-register-subject (or finds there already); "+
		"by default nothing is registered")
	f.String(&v.RegisterSubject, "schema-register-subject", "", "`subject` for --schema-register-file; default <topic>-value when --topic names one topic")
}

// values are run's outboxes' value formats, in the order of outboxes().
func (c *runConfig) values() ([]valueConfig, []string) {
	if len(c.Outboxes) == 0 {
		ps := c.outboxes()
		out, where := make([]valueConfig, len(ps)), make([]string, len(ps))
		for i := range ps {
			out[i], where[i] = c.Value, "--value-format"
		}
		return out, where
	}
	out, where := make([]valueConfig, len(c.Outboxes)), make([]string, len(c.Outboxes))
	for i, e := range c.Outboxes {
		out[i], where[i] = e.value(c.Value), e.where
	}
	return out, where
}

// value is the entry's value format: def, the flags', with what the entry
// sets instead. parseOutboxes has checked the integers and durations.
func (e outboxEntry) value(def valueConfig) valueConfig {
	v := def
	strs := map[string]*string{"value-format": &v.Format, "schema-subject-strategy": &v.Strategy, "schema-record-namespace": &v.Namespace,
		"column-schema-id": &v.IDColumn, "column-schema-version": &v.VersionColumn, "column-schema-record": &v.RecordColumn,
		"schema-protobuf-message": &v.ProtobufMessage, "schema-register-file": &v.RegisterFile, "schema-register-subject": &v.RegisterSubject}
	for k, val := range e.values {
		switch {
		case strs[k] != nil:
			*strs[k] = val
		case k == "schema-id":
			v.ID, _ = strconv.Atoi(val)
		case k == "schema-version":
			v.Version, _ = strconv.Atoi(val)
		case k == "schema-refresh":
			v.Refresh, _ = time.ParseDuration(val)
		}
	}
	return v
}

// schemaFormat is v's schema format; ok false for raw.
func (v valueConfig) schemaFormat() (f schema.Format, ok bool) {
	if v.Format == valueRaw {
		return 0, false
	}
	f, err := schema.ParseFormat(v.Format)
	return f, err == nil
}

// registerSubject is the subject --schema-register-file goes under: the
// one given, else the topic strategy's of a topic template that names one
// topic; "" when neither.
func (v valueConfig) registerSubject(m mapping.Config) string {
	if v.RegisterSubject != "" {
		return v.RegisterSubject
	}
	tmpl := m.Topic
	if tmpl == "" {
		tmpl = mapping.DefaultConfig().Topic
	}
	if v.Strategy != schema.TopicName.String() || strings.ContainsAny(tmpl, "{}") {
		return ""
	}
	s, _ := schema.Subject(schema.TopicName, tmpl, "")
	return s
}

// validateValues checks the registry flags and every outbox's value
// format, naming the flag or the entry.
func (c *runConfig) validateValues(p *problems) {
	check := p.check
	values, where := c.values()
	maps := c.outboxes()
	uses := false
	for i, v := range values {
		at := where[i]
		if len(c.Outboxes) > 0 {
			at += ": value-format"
		}
		f, ok := v.schemaFormat()
		if v.Format != valueRaw && !ok {
			check(false, "%s %q: use raw, avro, protobuf or json-schema", at, v.Format)
			continue
		}
		if !ok {
			check(v.RegisterFile == "", "%s is raw, but --schema-register-file %q is given: registering a schema needs a value format that uses it", at, v.RegisterFile)
			continue
		}
		uses = true
		m := maps[i].Mapping
		check(m.Format != mapping.FormatCloudEventsStructured,
			"%s %s with record-format cloudevents-structured: a structured CloudEvent carries its data in a JSON envelope, which cannot hold an %s value; "+
				"use record-format cloudevents-binary (the value is the encoded payload, content-type and dataschema name its schema) or native", at, v.Format, v.Format)
		_, err := schema.ParseStrategy(v.Strategy)
		check(err == nil, "%s: schema-subject-strategy: %v", at, err)
		check(v.ID >= 0 && v.Version >= 0, "%s: schema-id %d and schema-version %d: neither may be negative", at, v.ID, v.Version)
		check(v.ID == 0 || v.Version == 0, "%s: schema-id %d and schema-version %d: pin one, an id or a version", at, v.ID, v.Version)
		check(v.ID != 0 || v.Version != 0 || v.Refresh > 0, "%s: schema-refresh %s: must be positive (the latest version is used)", at, v.Refresh)
		check(v.ProtobufMessage == protoFirst || v.ProtobufMessage == protoEventType, "%s: schema-protobuf-message %q: use first or event-type", at, v.ProtobufMessage)
		check(v.ProtobufMessage == protoFirst || f == schema.Protobuf, "%s: schema-protobuf-message %s is for --value-format protobuf", at, v.ProtobufMessage)
		if v.RegisterFile != "" {
			_, err := os.Stat(v.RegisterFile)
			check(err == nil, "%s: schema-register-file: %v", at, err)
			check(v.registerSubject(m) != "", "%s: schema-register-file needs schema-register-subject: the subject cannot be told from the topic %q and strategy %s", at, m.Topic, v.Strategy)
		}
	}
	r := c.Registry
	if !uses {
		check(r.URL == "", "--schema-registry-url is given, but no outbox has a --value-format that uses it (avro, protobuf or json-schema)")
		return
	}
	check(r.URL != "", "--value-format avro, protobuf or json-schema needs --schema-registry-url (Confluent: http://host:8081; Apicurio: http://host:8080/apis/ccompat/v7)")
	check(r.Password == "" || r.PasswordFile == "", "--schema-registry-password and --schema-registry-password-file are both set: give only one (the file is safer)")
	check(r.BearerToken == "" || r.BearerTokenFile == "", "--schema-registry-bearer-token and --schema-registry-bearer-token-file are both set: give only one (the file is safer)")
	basic := r.Username != "" || r.Password != "" || r.PasswordFile != ""
	bearer := r.BearerToken != "" || r.BearerTokenFile != ""
	check(!basic || !bearer, "--schema-registry-username (basic authentication) and --schema-registry-bearer-token: give one way to authenticate")
	check(!basic || r.Username != "" && (r.Password != "" || r.PasswordFile != ""),
		"--schema-registry-username needs --schema-registry-password-file (or --schema-registry-password), and the other way round")
	check(r.Timeout > 0, "--schema-registry-timeout %s: must be positive", r.Timeout)
	if u, err := url.Parse(r.URL); err == nil && u.User != nil {
		// The URL is logged, named by dataschema in CloudEvents records and
		// by a metric's label: it must hold no credentials.
		check(false, "--schema-registry-url %s holds credentials: give them with --schema-registry-username and --schema-registry-password-file, "+
			"or --schema-registry-bearer-token-file", u.Redacted())
	} else if r.URL != "" {
		_, err := schema.NewRegistry(schema.RegistryConfig{URL: r.URL, CAFile: r.CAFile})
		check(err == nil, "--schema-registry-url %q or --schema-registry-ca-file: %v", r.URL, err)
	}
}

// registry makes the schema registry client from the flags, reading the
// secret files; nil when no outbox needs one.
func (c *runConfig) registry(obs schema.Observer) (*schema.Registry, error) {
	if c.Registry.URL == "" {
		return nil, nil
	}
	r := c.Registry
	cfg := schema.RegistryConfig{URL: r.URL, Username: r.Username, Password: r.Password, BearerToken: r.BearerToken, CAFile: r.CAFile, Timeout: r.Timeout, Observer: obs}
	var err error
	if r.PasswordFile != "" {
		if cfg.Password, err = readSecretFile("--schema-registry-password-file", r.PasswordFile); err != nil {
			return nil, err
		}
	}
	if r.BearerTokenFile != "" {
		if cfg.BearerToken, err = readSecretFile("--schema-registry-bearer-token-file", r.BearerTokenFile); err != nil {
			return nil, err
		}
	}
	return schema.NewRegistry(cfg)
}

// readSecretFile reads a password or token file, less a trailing newline.
func readSecretFile(flagName, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s %s is empty", flagName, path)
	}
	return s, nil
}

// encodeObserver is what the value encoders tell metrics.
type encodeObserver interface {
	schema.Observer
	EncodeFailed(outbox, reason string)
	RegistryWaiting(waiting bool)
	SchemaInUse(outbox, url, subject string, id, version int)
}

// withEncoders gives each outbox of specs whose value format uses a
// registry its encoder, registering the schema files it is asked to at
// start. ctx bounds the registry requests of the stream.
func (c *runConfig) withEncoders(ctx context.Context, specs []outboxSpec, obs encodeObserver, log *slog.Logger) error {
	reg, err := c.registry(obs)
	if reg == nil || err != nil {
		return err
	}
	values, _ := c.values()
	for i, v := range values {
		f, ok := v.schemaFormat()
		if !ok {
			continue
		}
		if v.RegisterFile != "" {
			subject := v.registerSubject(specs[i].Mapping)
			s, err := reg.RegisterFile(ctx, subject, f, v.RegisterFile)
			if err != nil {
				return fmt.Errorf("--schema-register-file %s: register it under subject %q: %w", v.RegisterFile, subject, err)
			}
			log.Info("registered the schema file (or found it registered)", "file", v.RegisterFile, "subject", subject, "schema_id", s.ID, "version", s.Version)
		}
		strategy, _ := schema.ParseStrategy(v.Strategy)
		enc, err := schema.NewEncoder(reg, schema.Config{Format: f, Strategy: strategy, Namespace: v.Namespace, ID: v.ID, Version: v.Version,
			Refresh: v.Refresh, MessageByRecordName: v.ProtobufMessage == protoEventType})
		if err != nil {
			return err
		}
		specs[i].Encoder = newValueEncoder(ctx, enc, reg.URL(), f, specs[i], v, obs)
	}
	log.Info("record values are written by the schema registry's schemas", "registry", reg.URL(), "outboxes", describeValues(specs, values))
	return nil
}

// describeValues is the outboxes' value formats for the log.
func describeValues(specs []outboxSpec, values []valueConfig) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = s.Pattern.String() + ": " + values[i].Format
	}
	return strings.Join(parts, ", ")
}

// valueEncoder is one outbox's pipeline.Encoder: the payload the mapping
// put in the record's value, encoded by its schema. It runs on the
// replication goroutine only.
type valueEncoder struct {
	ctx    context.Context
	enc    *schema.Encoder
	outbox string // the outbox's pattern, the metrics' label
	obs    encodeObserver
	cols   []string
	// Where each column of the row is in cols; -1 when not configured.
	idCol, versionCol, recordCol int
	// CloudEvents binary: the value's media type, and dataschema naming
	// the schema in the registry.
	cloudEvents bool
	media       []byte
	url         string
	dataSchema  map[int][]byte // by schema id
	inUse       map[string]int // subject → the schema id last written by
	waiting     bool
}

// mediaTypes are the content types of a CloudEvent whose data is in a
// format: the Confluent wire format's header precedes the data, which
// consumers read with the registry's deserializers.
var mediaTypes = map[schema.Format]string{schema.Avro: "application/avro", schema.Protobuf: "application/protobuf", schema.JSONSchema: "application/json"}

func newValueEncoder(ctx context.Context, enc *schema.Encoder, url string, f schema.Format, spec outboxSpec, v valueConfig, obs encodeObserver) *valueEncoder {
	e := &valueEncoder{ctx: ctx, enc: enc, outbox: spec.Pattern.String(), obs: obs, idCol: -1, versionCol: -1, recordCol: -1,
		cloudEvents: spec.Mapping.Format == mapping.FormatCloudEventsBinary, media: []byte(mediaTypes[f]), url: url,
		dataSchema: map[int][]byte{}, inUse: map[string]int{}}
	for _, c := range []struct {
		name string
		at   *int
	}{{v.IDColumn, &e.idCol}, {v.VersionColumn, &e.versionCol}, {v.RecordColumn, &e.recordCol}} {
		if c.name != "" {
			*c.at = len(e.cols)
			e.cols = append(e.cols, c.name)
		}
	}
	return e
}

func (e *valueEncoder) Columns() []string { return e.cols }

// ColumnError is a row's column that should name a schema version or id
// and does not hold a positive integer.
type ColumnError struct {
	Column, Value string
}

func (e *ColumnError) Error() string {
	return fmt.Sprintf("column %q: %q is no schema version or id (a positive integer)", e.Column, e.Value)
}

func (e *valueEncoder) Encode(rec *kgo.Record, ev pipeline.EncodeEvent) error {
	in := schema.Event{Topic: rec.Topic, EventType: string(ev.EventType), Payload: rec.Value}
	col := func(i int) []byte {
		if i < 0 || i >= len(ev.Columns) {
			return nil
		}
		return ev.Columns[i]
	}
	for _, n := range []struct {
		i  int
		to *int
	}{{e.idCol, &in.ID}, {e.versionCol, &in.Version}} {
		if b := col(n.i); b != nil {
			v, err := strconv.Atoi(string(b))
			if err != nil || v <= 0 {
				e.obs.EncodeFailed(e.outbox, "column")
				return &pipeline.EncodeError{Fault: pipeline.FaultEvent, Err: &ColumnError{Column: e.cols[n.i], Value: string(b)}}
			}
			*n.to = v
		}
	}
	if b := col(e.recordCol); b != nil {
		in.RecordName = string(b)
	}
	out, s, err := e.enc.AppendEncode(e.ctx, nil, in)
	if err != nil {
		fault, reason := encodeFault(err, in.ID != 0 || in.Version != 0)
		e.obs.EncodeFailed(e.outbox, reason)
		if fault == pipeline.FaultUnavailable && !e.waiting {
			e.waiting = true
			e.obs.RegistryWaiting(true)
		}
		return &pipeline.EncodeError{Fault: fault, Err: err}
	}
	if e.waiting {
		e.waiting = false
		e.obs.RegistryWaiting(false)
	}
	if id, ok := e.inUse[s.Subject]; !ok || id != s.ID {
		e.inUse[s.Subject] = s.ID
		e.obs.SchemaInUse(e.outbox, e.url, s.Subject, s.ID, s.Version)
	}
	rec.Value = out
	if e.cloudEvents {
		ds, ok := e.dataSchema[s.ID]
		if !ok {
			ds = []byte(fmt.Sprintf("%s/schemas/ids/%d", e.url, s.ID))
			e.dataSchema[s.ID] = ds
		}
		mapping.SetDataSchema(rec, e.media, ds)
	}
	return nil
}

// encodeFault says whose an encoding error is, and names it for the
// metrics. named: the row named the schema's version or id, so a schema
// the registry does not have is the row's fault.
func encodeFault(err error, named bool) (pipeline.Fault, string) {
	var mismatch *schema.MismatchError
	var subject *schema.SubjectError
	var notFound *schema.NotFoundError
	var unusable *schema.SchemaError
	switch {
	case errors.As(err, &mismatch):
		return pipeline.FaultEvent, "mismatch"
	case errors.As(err, &subject):
		return pipeline.FaultEvent, "subject"
	case errors.As(err, &notFound) && named:
		return pipeline.FaultEvent, "not_found"
	case errors.As(err, &notFound):
		return pipeline.FaultSchema, "not_found"
	case errors.As(err, &unusable):
		return pipeline.FaultSchema, "schema"
	case schema.Retryable(err):
		return pipeline.FaultUnavailable, "unavailable"
	}
	// A registry's refusal that waiting does not change: another 4xx, a
	// certificate that does not verify.
	return pipeline.FaultSchema, "registry"
}
