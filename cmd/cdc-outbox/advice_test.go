package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/mapping"
	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/republish"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// TestAdvice pins every piece of advice the command gives about an error of
// the data path: explain(err) is err's own text (the facts, from the
// internal packages), then exactly the advice. Renaming a flag changes
// this table and advice.go, nothing else.
func TestAdvice(t *testing.T) {
	pgConnect := func(err error) error {
		return fmt.Errorf("connect to PostgreSQL: %w", &replication.ConnectError{
			Err: fmt.Errorf("failed to connect to `user=u database=d`: 127.0.0.1:5432 (127.0.0.1): %w", err)})
	}
	pub := &replication.Coverage{Captured: &replication.Relation{OID: 1, Name: pgname.Name{Schema: "public", Relation: "all_events"}}}
	refused := func(err error) error {
		return &pipeline.BadEventError{EventID: "7", LSN: 0x3EB, Err: &pipeline.RefusedError{Topic: "outbox.event.payment", Err: err}}
	}

	for _, tc := range []struct {
		name   string
		err    error
		advice string // what explain adds to err.Error()
	}{
		// Connecting to PostgreSQL.
		{"postgres TLS host", pgConnect(&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "10.0.0.1", Certificate: &x509.Certificate{}}}),
			": the server's TLS certificate is not issued for the host in --postgres-url: connect by a name or IP address " +
				"that the certificate lists (sslmode=verify-full checks it), or reissue the certificate with that name"},
		{"postgres TLS CA", pgConnect(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}),
			": the server's TLS certificate is not signed by a CA that cdc-outbox trusts: point sslrootcert in --postgres-url " +
				"(or PGSSLROOTCERT) at the CA certificate that signed the server's"},
		{"postgres TLS expired", pgConnect(x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}}),
			": the server's TLS certificate was refused (expired, not yet valid, or not for a server): renew it on the server"},
		{"postgres TLS other", pgConnect(&tls.CertificateVerificationError{Err: errors.New("x509: other")}),
			": the server's TLS certificate did not verify: check sslrootcert in --postgres-url and the server's certificate"},
		{"postgres password", pgConnect(&pgconn.PgError{Code: "28P01", Message: `password authentication failed for user "u"`}),
			": check the password (in --postgres-url, PGPASSWORD or ~/.pgpass) and that the role has one set (ALTER ROLE ... PASSWORD, or sql/role.sql)"},
		{"postgres pg_hba.conf", pgConnect(&pgconn.PgError{Code: "28000", Message: `pg_hba.conf rejects connection for host "127.0.0.1", user "u", database "d", no encryption`}),
			": the server's pg_hba.conf does not let this role connect this way: for cdc-outbox, allow the role on the outbox's " +
				"database (a logical replication connection matches the database name), over TLS with scram-sha-256 (hostssl), " +
				"and connect with sslmode=verify-full"},
		{"postgres no role", pgConnect(&pgconn.PgError{Code: "28000", Message: `role "u" does not exist`}), ""},
		{"postgres refused", pgConnect(errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")),
			"; check --postgres-url (CDC_OUTBOX_POSTGRES_URL), the PG* environment variables, and that the server is running and reachable"},
		{"postgres no url", &replication.ConnectError{Defaults: true, Err: errors.New("dial unix /var/run/postgresql/.s.PGSQL.5432: connect: no such file or directory")},
			"; no --postgres-url was given (nor CDC_OUTBOX_POSTGRES_URL), so the PG* environment variables and libpq's defaults were used: " +
				"give --postgres-url (postgres://user@host:5432/database)"},

		// Conditions of streaming (replication.Error).
		{"no table", &replication.Error{Err: replication.ErrNoTable},
			`: create it (sql/publication.sql has the default) or point --table at yours (quote a name that has capitals, dots or spaces: --table '"Billing"."Outbox Events"')`},
		{"not a table", &replication.Error{Err: replication.ErrNotTable}, "; point --table at the outbox table"},
		{"no publication", &replication.Error{Err: replication.ErrNoPublication, Statement: `CREATE PUBLICATION "p" FOR TABLE "public"."outbox" WITH (publish = 'insert')`},
			`: run CREATE PUBLICATION "p" FOR TABLE "public"."outbox" WITH (publish = 'insert'), or start with --create-publication`},
		{"outbox inside a published partitioned table", &replication.Error{Err: replication.ErrNotPublished, Coverage: pub}, "; point --publication at it"},
		{"partitions missing", &replication.Error{Err: replication.ErrNotPublished, Coverage: &replication.Coverage{}}, ""},
		{"slot missing", &replication.Error{Err: replication.ErrSlotMissing, Slot: "s"},
			": start with --create-slot, or run SELECT pg_create_logical_replication_slot('s', 'pgoutput')"},
		{"slot of another plugin", &replication.Error{Err: replication.ErrSlotPlugin}, ": choose another --slot, or drop that slot if nothing else uses it"},
		{"slot of another database", &replication.Error{Err: replication.ErrSlotDatabase}, ": connect to that database or choose another --slot"},
		{"slot forgotten", &replication.Error{Err: replication.ErrSlotForgotten},
			". Start once with --recreate-slot (a new slot, streaming from its creation on), then re-publish the outbox rows committed " +
				"since the old one stopped from the table with cdc-outbox republish --after-id <the last id up to which Kafka has every event> (or --since <time>)"},
		{"slot dropped while streaming", &replication.Error{Err: replication.ErrSlotGone},
			". Start cdc-outbox once with --recreate-slot (a new slot that streams from its creation on), then re-publish the events " +
				"committed since the last one Kafka has with cdc-outbox republish --after-id <id> (or --since <time>)"},
		{"slot not carried over a failover", &replication.Error{Err: replication.ErrSlotGone, AfterFailover: true},
			". cdc-outbox makes its slot a failover slot with --slot-failover (the default). " +
				"To recover: start cdc-outbox once with --recreate-slot (a new slot, streaming from its creation on), " +
				"then re-publish the events committed since the last one Kafka has with cdc-outbox republish --after-id <id> (or --since <time>); " +
				"consumers skip the repeats by event id. See High availability in docs/operating.md"},
		{"another cluster", &replication.Error{Err: replication.ErrOtherCluster}, "; check --postgres-url"},
		{"shards on PostgreSQL 14", &replication.Error{Err: replication.ErrShardsVersion}, ": run with --shards 1 (one slot) on this server, or upgrade it"},
		{"a server that hashes otherwise", &replication.Error{Err: replication.ErrShardsHash}, ": run with --shards 1 (one slot) on this server"},
		{"another number of shards", &replication.Error{Err: replication.ErrShardCount},
			": start with the --shards those were made with, or change the number of shards as docs/sharding.md says " +
				"(create the new shards' publications and slots while the old ones stream, stop, then drop the old ones); " +
				"a restart with another --shards alone would stream their aggregates twice or hold their WAL forever"},
		{"a shard's publication without its filter", &replication.Error{Err: replication.ErrShardFilter},
			": drop that publication and its shard's slot only after the procedure of docs/sharding.md, or give the shards another --publication and --slot"},
		{"aggregate id not text", &replication.Error{Err: replication.ErrShardColumn},
			": point --column-aggregate-id at a text or varchar column of a deterministic collation, or leave --shards at 1"},
		{"shards taken by another process", &replication.Error{Err: replication.ErrHolderTaken},
			"; this process stopped all its shards, and a restart waits as a standby"},
		{"failover past the fork", &replication.ForkError{From: "a:5432", FromTimeline: 1, To: "b:5432", ToTimeline: 2, Fork: 0x3000060, Confirmed: 0x3000000, Newest: 0x3100000},
			". Start cdc-outbox again: it resumes at the slot's position on the new primary, which the standby had, and sends again what " +
				"the new primary holds after it; with --delivery exactly-once it skips only the transactions up to the fork that Kafka holds, never one after it. " +
				"The events Kafka got for the WAL past the fork stay there: their transactions are not on the new primary, which may give their event ids to new events, " +
				"so the new primary's events after the fork carry their source with /epoch-N (the lost history is recorded in the checkpoint topic) and none shares source and id with a lost one; " +
				"reconcile the lost events by the LSNs above (docs/guarantees.md, Failover), and set synchronized_standby_slots on the primary so that it cannot happen again"},
		{"restored under the stream", &replication.RestoreError{Server: "a:5432", Timeline: 1, Flushed: 0x3000150, Confirmed: 0x3011350, Newest: 0x3011350},
			". Start cdc-outbox again: it resumes at the slot's position on the restored server and sends again what the server holds after it; " +
				"with --delivery exactly-once it skips nothing it cannot prove Kafka holds. The events Kafka got for the WAL past the restored server's end stay there: " +
				"their transactions are not on the server, which may give their event ids to new events, so every event streamed from now on carries its source with /epoch-N " +
				"(the lost history is recorded in the checkpoint topic) and none shares source and id with a lost one; list the lost events with cdc-outbox lost-events. " +
				"If the restored server has no slot of this name (a base backup does not hold slots), the start creates one that streams only what commits from then on: " +
				"re-publish what was committed since the restore with cdc-outbox republish --since <time of the restore> (docs/guarantees.md, A server restored under the running stream)"},
		{"publication gone", &replication.Error{Err: replication.ErrPublicationGone, Publication: "cdc_outbox", Slot: "s", Confirmed: 0x152E2B0},
			`. To recover: re-create it (CREATE PUBLICATION "cdc_outbox" FOR TABLE <outbox table> WITH (publish = 'insert')), ` +
				"drop the slot (SELECT pg_drop_replication_slot('s')), start cdc-outbox with --recreate-slot, " +
				"then re-publish with cdc-outbox republish --after-id <id> the outbox rows committed after the last confirmed position 0/152E2B0 " +
				"(those your consumers have not seen; they dedupe by event id)"},
		{"WAL lost", &replication.Error{Err: replication.ErrWALLost, Slot: "s"},
			". To recover: start once with --recreate-slot, which drops this slot and creates a new one that streams only what commits from then on, " +
				"then re-publish the outbox rows committed after that position from the table: cdc-outbox republish --after-id <the last id up to which Kafka has every event> " +
				"(or --since <a time before it>); consumers skip the repeats by event id; " +
				`to prevent it, raise max_slot_wal_keep_size or alert on cdc_outbox_slot_wal_status{status="unreserved"}`},
		{"WAL lost, idle", fmt.Errorf("stream: %w", &replication.Error{Err: replication.ErrWALLost, Slot: "s", Reason: "idle_timeout"}),
			". To recover: start once with --recreate-slot, which drops this slot and creates a new one that streams only what commits from then on, " +
				"then re-publish the outbox rows committed after that position from the table: cdc-outbox republish --after-id <the last id up to which Kafka has every event> " +
				"(or --since <a time before it>); consumers skip the repeats by event id; " +
				"to prevent it, keep cdc-outbox running (a hot standby instance on the same slot takes over within seconds), " +
				"or raise idle_replication_slot_timeout (0 turns it off)"},
		{"server error", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, ""},

		// Bad events and the broker's refusals (pipeline).
		{"bad row", &pipeline.BadEventError{EventID: "42", LSN: 0x10, Err: &mapping.BadEventError{EventID: "42", Column: "payload", Reason: "is NULL"}},
			"; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{"record too large", &pipeline.BadEventError{EventID: "42", Err: &pipeline.TooLargeError{Size: 2 << 20, Limit: 1 << 20}},
			"; shrink the payload, or raise --max-record-bytes together with the broker's message.max.bytes (keep it at or below that)" +
				"; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{"non-transactional message", &pipeline.BadEventError{EventID: "e1", Message: true, Err: &pipeline.NonTransactionalError{Prefix: "cdc_outbox"}},
			"; it stops the stream at every start until it is set aside: run with --on-bad-event=dead-letter, and correct the writer"},
		{"bad message", &pipeline.BadEventError{EventID: "e1", Message: true, Err: &mapping.BadEventError{EventID: "e1", Reason: `message member "v" is missing`}},
			"; a message cannot be corrected once written: correct the writer, and fix the configuration and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{"unmapped relation", &pipeline.BadEventError{EventID: "42", Err: &pipeline.UnmappedError{Relation: "public.gone", OID: 9, Why: "it no longer exists"}},
			"; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: too large", refused(fmt.Errorf("%w (uncompressed_bytes=5000)", kerr.MessageTooLarge)),
			"; the topic's max.message.bytes (or the broker's message.max.bytes) is below --max-record-bytes: lower --max-record-bytes to match, " +
				"so such rows are caught as bad events before they are sent, or raise the topic's limit" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: batch too large", refused(kerr.RecordListTooLarge),
			"; the topic's max.message.bytes (or the broker's message.max.bytes) is below --max-record-bytes: lower --max-record-bytes to match, " +
				"so such rows are caught as bad events before they are sent, or raise the topic's limit" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: timestamp", refused(kerr.InvalidTimestamp),
			"; the record's timestamp (the row's created_at) is out of the range the topic accepts (message.timestamp.before.max.ms and " +
				"message.timestamp.after.max.ms): fix created_at in the row, or widen the topic's range" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: invalid record", refused(kerr.InvalidRecord),
			"; the broker's validation of the record failed (a compacted topic needs a key; check the broker's log for the reason)" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: corrupt", refused(kerr.CorruptMessage),
			"; the broker found the record batch corrupt (CRC mismatch): check the network and the broker, and --kafka-compression" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"refused: topic name", refused(kerr.InvalidTopicException),
			"; the broker does not accept this topic name (invalid, or an internal topic such as __consumer_offsets): check --topic and the row's columns it uses" +
				"; or run with --on-bad-event=dead-letter to set such events aside"},
		{"cluster: no such topic", &pipeline.ProduceError{EventID: "7", Err: &pipeline.RefusedError{Topic: "t", Err: kerr.UnknownTopicOrPartition}},
			"; create the topic, or allow auto-creation (broker auto.create.topics.enable and --kafka-auto-create-topics); " +
				"if both allow it, the broker refused to create it (a name that differs from an existing topic's only in '.' and '_' collides with it): see the broker's log"},
		{"cluster: not authorized", &pipeline.ProduceError{EventID: "7", Err: &pipeline.RefusedError{Topic: "t", Err: kerr.TopicAuthorizationFailed}},
			"; grant the producer WRITE on the topic"},
		{"dead letter refused", &pipeline.DeadLetterError{EventID: "7", Err: &pipeline.RefusedError{Topic: "dlq", DeadLetter: true, Err: kerr.TopicAuthorizationFailed}},
			"; grant the producer WRITE on the topic"},
		{"cluster: SASL", &pipeline.ProduceError{EventID: "7", Err: &pipeline.RefusedError{Topic: "t", Err: kerr.SaslAuthenticationFailed}},
			"; SASL authentication failed: check --kafka-sasl-username and the password (--kafka-sasl-password-file or --kafka-sasl-password), " +
				"that the user exists on the broker with credentials for --kafka-sasl-mechanism, and that --kafka-brokers names its SASL listener"},

		// Schemas on the wire (schemas.go).
		{"payload does not fit", &pipeline.BadEventError{EventID: "7", LSN: 0x3EB, Err: &pipeline.EncodeError{Fault: pipeline.FaultEvent,
			Err: &schema.MismatchError{Subject: "payment-value", SchemaID: 3, Version: 2, Format: schema.Avro, Path: "$.n", Reason: "want long"}}},
			`; correct the writer so its payloads fit the avro schema, or register a version of subject "payment-value" that accepts them ` +
				"(mind the subject's compatibility rule: Confluent's default is BACKWARD, Apicurio's none)" +
				"; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{"subject deleted", &pipeline.SchemaStopError{EventID: "7", LSN: 0x3EB, Err: &pipeline.EncodeError{Fault: pipeline.FaultSchema,
			Err: &schema.NotFoundError{URL: "http://r", Subject: "payment-value", Code: 40401}}},
			"; register the schema under the subject again (nothing is registered unless --schema-register-file asks), " +
				"or point the outbox at a subject, version or id the registry has (--schema-subject-strategy, --schema-version, --schema-id, or the row's schema version column)" +
				"; the stream stopped before this event and confirms nothing past it: restart once the schema is there"},
		{"registry down", &pipeline.UnavailableError{EventID: "7", LSN: 0x3EB, Err: &pipeline.EncodeError{Fault: pipeline.FaultUnavailable,
			Err: &schema.RegistryError{URL: "http://r/subjects/p-value/versions/latest", Op: "latest_version", Err: errors.New("connection refused")}}},
			"; the stream waits, reading again from the confirmed position with backoff, and goes on once the registry answers" +
				": check that the registry runs and that --schema-registry-url reaches it (a slower answer than --schema-registry-timeout counts as none)"},
		{"registry refuses the credentials", &schema.RegistryError{URL: "http://r", Status: 401, Err: errors.New("unauthorized")},
			"; the stream waits, reading again from the confirmed position with backoff, and goes on once the registry answers" +
				": the registry refuses the credentials: check --schema-registry-username with --schema-registry-password-file, or --schema-registry-bearer-token-file"},

		// Exactly-once delivery (sink.Transactional).
		{"fenced: produce", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "produce", Err: kerr.InvalidProducerEpoch},
			"; another instance registered the same transactional id (--transactional-id, by default from the database and --slot) and took over: " +
				"this instance was fenced and stops without writing. If it should be the one running, stop the other and start this one again"},
		{"fenced: commit", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "commit", Err: fmt.Errorf("end: %w", kerr.ProducerFenced)},
			"; another instance registered the same transactional id (--transactional-id, by default from the database and --slot) and took over: " +
				"this instance was fenced and stops without writing. If it should be the one running, stop the other and start this one again"},
		{"transaction timeout", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "register", Err: kerr.InvalidTransactionTimeout},
			"; the broker's transaction.max.timeout.ms is below the producer's transaction timeout (40s): raise it on the broker"},
		{"transactional id ACL", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "register", Err: kerr.TransactionalIDAuthorizationFailed},
			"; grant the producer WRITE and DESCRIBE on the transactional id (ACL resource TransactionalId, --transactional-id)"},
		{"cluster ACL", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "register", Err: kerr.ClusterAuthorizationFailed},
			"; grant the producer IDEMPOTENT_WRITE on the cluster, or WRITE on the transactional id (--transactional-id)"},
		{"commit unknown", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "commit", Err: kerr.UnknownServerError},
			"; the Kafka transaction was aborted or its outcome is unknown, and no position past it was confirmed: " +
				"start cdc-outbox again, it resumes from the checkpoint in Kafka (--checkpoint-topic)"},
		{"refused in a transaction", &sink.TxError{TransactionalID: "cdc-outbox-s", Op: "produce", Err: &sink.RecordError{Topic: "t", Err: kerr.MessageTooLarge}},
			"; in exactly-once delivery a record the broker refuses aborts its whole Kafka transaction and stops the stream (nothing is confirmed past it)" +
				"; the topic's max.message.bytes (or the broker's message.max.bytes) is below --max-record-bytes: lower --max-record-bytes to match, " +
				"so such rows are caught as bad events before they are sent, or raise the topic's limit"},
		{"checkpoint topic ACL", &sink.CheckpointError{Topic: "cdc_outbox.checkpoints", Op: "read it", Err: kerr.TopicAuthorizationFailed},
			"; grant the producer READ and WRITE (and CREATE, or create it yourself, compacted) on --checkpoint-topic"},
		{"checkpoint topic create", &sink.CheckpointError{Topic: "cdc_outbox.checkpoints", Op: "create", Err: kerr.ClusterAuthorizationFailed},
			"; create --checkpoint-topic yourself with cleanup.policy=compact, or grant the producer CREATE on the cluster"},
		{"checkpoint topic not read to its end", &sink.CheckpointError{Topic: "cdc_outbox.checkpoints", Op: "read it",
			Err: &sink.ShortReadError{Unread: map[int32]int64{0: 41}, Err: context.DeadlineExceeded}},
			"; the brokers were too slow to deliver --checkpoint-topic to its end within the start's minute, so the position is unknown and nothing was streamed: " +
				"start again once they answer promptly (a restart is safe)"},
		{"checkpoint topic other", &sink.CheckpointError{Topic: "cdc_outbox.checkpoints", Op: "read it", Err: errors.New("dial: refused")},
			"; exactly-once delivery reads its position from --checkpoint-topic at start: check that the brokers answer and the topic can be read"},

		// Re-publishing from the table (republish).
		{"republish: bad row", &republish.BadEventError{EventID: "42", Err: &mapping.BadEventError{EventID: "42", Column: "payload", Reason: "is NULL"}},
			"; fix the row (or the configuration) and run again with --after-id before it, or with --on-bad-event=dead-letter to set such events aside"},
		{"republish: row too large", &republish.BadEventError{EventID: "42", Err: &pipeline.TooLargeError{Size: 2 << 20, Limit: 1 << 20}},
			"; shrink the payload, or raise --max-record-bytes together with the broker's message.max.bytes (keep it at or below that)" +
				"; fix the row (or the configuration) and run again with --after-id before it, or with --on-bad-event=dead-letter to set such events aside"},
		{"republish: uuid ids", fmt.Errorf("%w: selecting rows by id needs ids that grow", republish.ErrNotOrdered),
			": select by --since and --until (created_at) instead"},
		{"republish: no created_at", fmt.Errorf("%w: selecting rows by time needs the created_at column", republish.ErrNoCreatedAt),
			": select by --after-id and --until-id instead, or name the column with --column-created-at"},
		{"republish: no id column", fmt.Errorf("%w: public.outbox has no column \"id\"", republish.ErrNoIDColumn), " (--column-id names it)"},
		{"republish: refused", fmt.Errorf("%w: event 7: %w", republish.ErrRefused, &pipeline.RefusedError{Topic: "t", Err: kerr.TopicAuthorizationFailed}),
			"; grant the producer WRITE on the topic"},

		// Reaching the brokers (the health check's errors).
		{"kafka SASL", fmt.Errorf("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512: %w", kerr.SaslAuthenticationFailed),
			"; SASL authentication failed: check --kafka-sasl-username and the password (--kafka-sasl-password-file or --kafka-sasl-password), " +
				"that the user exists on the broker with credentials for --kafka-sasl-mechanism, and that --kafka-brokers names its SASL listener"},
		{"kafka SASL mechanism", kerr.UnsupportedSaslMechanism,
			"; SASL authentication failed: the listener does not offer --kafka-sasl-mechanism; " +
				"use one of the broker's sasl.enabled.mechanisms, or check that --kafka-brokers names its SASL listener"},
		{"kafka SASL not expected", kerr.IllegalSaslState,
			"; SASL authentication failed: the listener does not expect SASL; point --kafka-brokers at the broker's " +
				"SASL_SSL (or SASL_PLAINTEXT) listener, or set --kafka-sasl-mechanism=none"},
		{"kafka TLS CA", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}},
			"; TLS: the broker's certificate is not signed by a CA this client trusts; give that CA's PEM certificate with --kafka-tls-ca-file"},
		{"kafka TLS host", fmt.Errorf("dial: %w", x509.HostnameError{Host: "10.0.0.1", Certificate: &x509.Certificate{}}),
			"; TLS: the broker's certificate is not valid for the address dialed; use a name the certificate lists in --kafka-brokers, or set --kafka-tls-server-name"},
		{"kafka TLS expired", x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}},
			"; TLS: the broker's certificate is not valid (expired, not yet valid, or not for server authentication); renew it on the broker"},
		{"kafka not TLS", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"},
			"; TLS: the listener does not speak TLS; point --kafka-brokers at the broker's SSL or SASL_SSL listener, or drop --kafka-tls"},
		{"kafka away", errors.New("dial tcp 127.0.0.1:9092: connect: connection refused"), ""},
		{"kafka EOF", io.EOF, ""},
	} {
		got := explain(tc.err)
		if !strings.HasPrefix(got, tc.err.Error()) || got[len(tc.err.Error()):] != tc.advice {
			t.Errorf("%s: explain(%v)\n got advice %q\nwant advice %q", tc.name, tc.err, strings.TrimPrefix(got, tc.err.Error()), tc.advice)
		}
	}
	if explain(nil) != "" {
		t.Error("explain(nil) is not empty")
	}
}

// TestExplainWholeLines: what the operator reads, whole, for errors built
// by the internal packages' own code, wrapped as they reach the command.
func TestExplainWholeLines(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("relation: %w", &pipeline.BadEventError{EventID: "42", LSN: 0x16B3748,
			Err: &mapping.BadEventError{EventID: "42", Column: "aggregate_id", Reason: "is NULL; every outbox row needs an aggregate id (it is the Kafka key)"}}),
			`relation: bad event 42 at LSN 0/16B3748: column "aggregate_id": is NULL; every outbox row needs an aggregate id (it is the Kafka key); ` +
				"fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{&pipeline.BadEventError{LSN: 0x10, Err: &pipeline.TooLargeError{Size: 1100512, Limit: 1048576}},
			"bad event (no id) at LSN 0/10: the record is about 1100512 bytes, more than the 1048576 bytes a record may have; " +
				"shrink the payload, or raise --max-record-bytes together with the broker's message.max.bytes (keep it at or below that); " +
				"fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"},
		{&pipeline.BadEventError{EventID: "7", LSN: 0x3EB, Err: &pipeline.RefusedError{Topic: "outbox.event.payment", Err: kerr.TopicAuthorizationFailed}},
			`bad event 7 at LSN 0/3EB: Kafka refused the record for topic "outbox.event.payment": ` + kerr.TopicAuthorizationFailed.Error() +
				"; grant the producer WRITE on the topic; or run with --on-bad-event=dead-letter to set such events aside"},
	} {
		if got := explain(tc.err); got != tc.want {
			t.Errorf("explain:\n got %s\nwant %s", got, tc.want)
		}
	}
}
