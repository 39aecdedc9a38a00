package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cdc-outbox/cdc-outbox/internal/pipeline"
	"github.com/cdc-outbox/cdc-outbox/internal/replication"
	"github.com/cdc-outbox/cdc-outbox/internal/republish"
	"github.com/cdc-outbox/cdc-outbox/internal/sink"
	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
	"github.com/cdc-outbox/cdc-outbox/schema"
)

// This file is the one place that says what to do about an error of the
// data path. The internal packages return errors that state the facts (the
// slot, the LSN, the event id, the SQLSTATE, the broker's error code) and
// know nothing of the command line; explain adds the advice, with the flag
// names, once, at the edge. Renaming a flag means editing this file and
// advice_test.go, not the data path.

// explain is err's text followed by what to do about it, in one line.
func explain(err error) string {
	if err == nil {
		return ""
	}
	advice := advise(err)
	if len(advice) == 0 {
		// A bare error of reaching the brokers, from the health check.
		advice = nonEmpty(kafkaFault(err))
	}
	return err.Error() + strings.Join(advice, "")
}

// advise walks err's chain and returns the advice for each error in it that
// has some, innermost first, each beginning with its separator.
func advise(err error) []string {
	switch e := err.(type) {
	case nil:
		return nil
	case *replication.ConnectError:
		return nonEmpty(postgresConnect(e))
	case *replication.Error:
		return nonEmpty(replicationAdvice(e))
	case *replication.ForkError:
		return []string{forkAdvice}
	case *replication.RestoreError:
		return []string{restoreAdvice}
	case *pipeline.BadEventError:
		return append(advise(e.Err), badEventAdvice(e))
	case *pipeline.TooLargeError:
		return []string{"; shrink the payload, or raise --max-record-bytes together with the broker's message.max.bytes (keep it at or below that)"}
	case *pipeline.RefusedError:
		return nonEmpty(kafkaRefusal(e.Err))
	case *sink.TxError:
		return append(advise(e.Err), txAdvice(e))
	case *sink.RecordError:
		return []string{"; in exactly-once delivery a record the broker refuses aborts its whole Kafka transaction and stops the stream (nothing is confirmed past it)" +
			kafkaRefusal(e.Err)}
	case *sink.CheckpointError:
		return append(advise(e.Err), checkpointAdvice(e))
	case *pipeline.SchemaStopError:
		return append(advise(e.Err), "; the stream stopped before this event and confirms nothing past it: restart once the schema is there")
	case *pipeline.UnavailableError:
		return advise(e.Err)
	case *schema.MismatchError:
		return []string{mismatchAdvice(e)}
	case *schema.SubjectError:
		return []string{"; give the event a record name (its event type, or --column-schema-record's column), or use --schema-subject-strategy=topic"}
	case *schema.NotFoundError:
		return []string{"; register the schema under the subject again (nothing is registered unless --schema-register-file asks), " +
			"or point the outbox at a subject, version or id the registry has (--schema-subject-strategy, --schema-version, --schema-id, or the row's schema version column)"}
	case *schema.SchemaError:
		return []string{"; register a usable version of the schema (one of the outbox's --value-format, without references), or change the outbox's --value-format"}
	case *schema.RegistryError:
		return []string{registryAdvice(e)}
	case *ColumnError:
		return []string{"; write a version or id the subject has in that column, or NULL for the configured one"}
	case *republish.BadEventError:
		return append(advise(e.Err), "; fix the row (or the configuration) and run again with --after-id before it, "+
			"or with --on-bad-event=dead-letter to set such events aside")
	case interface{ Unwrap() []error }:
		var all []string
		for _, inner := range e.Unwrap() {
			all = append(all, advise(inner)...)
		}
		return all
	case interface{ Unwrap() error }:
		return advise(e.Unwrap())
	}
	for _, s := range sentinelAdvice {
		// Compared as interfaces: a leaf of another type is never equal,
		// whatever its type (a map lookup would panic on an error value
		// that is not comparable).
		if err == s.err {
			return []string{s.advice}
		}
	}
	return nil
}

// forkAdvice is what a restart does after a failover past the fork, and
// what is left to the operator: the lost range's events in Kafka.
const forkAdvice = ". Start cdc-outbox again: it resumes at the slot's position on the new primary, which the standby had, and sends again what " +
	"the new primary holds after it; with --delivery exactly-once it skips only the transactions up to the fork that Kafka holds, never one after it. " +
	"The events Kafka got for the WAL past the fork stay there: their transactions are not on the new primary, which may give their event ids to new events, " +
	"so the new primary's events after the fork carry their source with /epoch-N (the lost history is recorded in the checkpoint topic) and none shares source and id with a lost one; " +
	"reconcile the lost events by the LSNs above (docs/guarantees.md, Failover), and set synchronized_standby_slots on the primary so that it cannot happen again"

const restoreAdvice = ". Start cdc-outbox again: it resumes at the slot's position on the restored server and sends again what the server holds after it; " +
	"with --delivery exactly-once it skips nothing it cannot prove Kafka holds. The events Kafka got for the WAL past the restored server's end stay there: " +
	"their transactions are not on the server, which may give their event ids to new events, so every event streamed from now on carries its source with /epoch-N " +
	"(the lost history is recorded in the checkpoint topic) and none shares source and id with a lost one; list the lost events with cdc-outbox lost-events. " +
	"If the restored server has no slot of this name (a base backup does not hold slots), the start creates one that streams only what commits from then on: " +
	"re-publish what was committed since the restore with cdc-outbox republish --since <time of the restore> (docs/guarantees.md, A server restored under the running stream)"

// sentinelAdvice is what to do about conditions the internal packages
// return as a sentinel wrapped with the facts.
var sentinelAdvice = []struct {
	err    error
	advice string
}{
	{republish.ErrNotOrdered, ": select by --since and --until (created_at) instead"},
	{republish.ErrNoCreatedAt, ": select by --after-id and --until-id instead, or name the column with --column-created-at"},
	{republish.ErrNoIDColumn, " (--column-id names it)"},
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// postgresConnect says what to check when connecting to PostgreSQL failed:
// the address (none given, or the wrong one, or a server that is down), a
// server certificate that does not verify, a refused password, a
// pg_hba.conf rule.
func postgresConnect(e *replication.ConnectError) string {
	switch replication.CauseOf(e) {
	case replication.CauseNetwork:
		if e.Defaults {
			return fmt.Sprintf("; no --postgres-url was given (nor %s), so the PG* environment variables and libpq's defaults were used: "+
				"give --postgres-url (postgres://user@host:5432/database)", envName("postgres-url"))
		}
		return fmt.Sprintf("; check --postgres-url (%s), the PG* environment variables, and that the server is running and reachable", envName("postgres-url"))
	case replication.CauseTLSHostname:
		return ": the server's TLS certificate is not issued for the host in --postgres-url: connect by a name or IP address " +
			"that the certificate lists (sslmode=verify-full checks it), or reissue the certificate with that name"
	case replication.CauseTLSUnknownCA:
		return ": the server's TLS certificate is not signed by a CA that cdc-outbox trusts: point sslrootcert in --postgres-url " +
			"(or PGSSLROOTCERT) at the CA certificate that signed the server's"
	case replication.CauseTLSCertificate:
		return ": the server's TLS certificate was refused (expired, not yet valid, or not for a server): renew it on the server"
	case replication.CauseTLSVerify:
		return ": the server's TLS certificate did not verify: check sslrootcert in --postgres-url and the server's certificate"
	case replication.CausePassword:
		return ": check the password (in --postgres-url, PGPASSWORD or ~/.pgpass) and that the role has one set " +
			"(ALTER ROLE ... PASSWORD, or sql/role.sql)"
	case replication.CausePgHBA:
		return ": the server's pg_hba.conf does not let this role connect this way: for cdc-outbox, allow the role on the outbox's " +
			"database (a logical replication connection matches the database name), over TLS with scram-sha-256 (hostssl), " +
			"and connect with sslmode=verify-full"
	}
	return ""
}

// replicationAdvice says what to do about a condition of streaming that is
// not met.
func replicationAdvice(e *replication.Error) string {
	switch {
	case errors.Is(e.Err, replication.ErrNoTable):
		return `: create it (sql/publication.sql has the default) or point --table at yours ` +
			`(quote a name that has capitals, dots or spaces: --table '"Billing"."Outbox Events"')`
	case errors.Is(e.Err, replication.ErrNotTable):
		return "; point --table at the outbox table"
	case errors.Is(e.Err, replication.ErrNoPublication):
		return fmt.Sprintf(": run %s, or start with --create-publication", e.Statement)
	case errors.Is(e.Err, replication.ErrNotPublished):
		if e.Coverage != nil && e.Coverage.Captured != nil {
			return "; point --publication at it"
		}
	case errors.Is(e.Err, replication.ErrSlotMissing):
		return fmt.Sprintf(": start with --create-slot, or run SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", e.Slot)
	case errors.Is(e.Err, replication.ErrSlotPlugin):
		return ": choose another --slot, or drop that slot if nothing else uses it"
	case errors.Is(e.Err, replication.ErrSlotDatabase):
		return ": connect to that database or choose another --slot"
	case errors.Is(e.Err, replication.ErrSlotForgotten):
		return ". Start once with --recreate-slot (a new slot, streaming from its creation on), then re-publish the outbox rows committed " +
			"since the old one stopped from the table with cdc-outbox republish --after-id <the last id up to which Kafka has every event> (or --since <time>)"
	case errors.Is(e.Err, replication.ErrSlotGone) && e.AfterFailover:
		return ". cdc-outbox makes its slot a failover slot with --slot-failover (the default). " +
			"To recover: start cdc-outbox once with --recreate-slot (a new slot, streaming from its creation on), " +
			"then re-publish the events committed since the last one Kafka has with cdc-outbox republish --after-id <id> (or --since <time>); " +
			"consumers skip the repeats by event id. See High availability in docs/operating.md"
	case errors.Is(e.Err, replication.ErrSlotGone):
		return ". Start cdc-outbox once with --recreate-slot (a new slot that streams from its creation on), then re-publish the events " +
			"committed since the last one Kafka has with cdc-outbox republish --after-id <id> (or --since <time>)"
	case errors.Is(e.Err, replication.ErrOtherCluster):
		return "; check --postgres-url"
	case errors.Is(e.Err, replication.ErrShardsVersion):
		return ": run with --shards 1 (one slot) on this server, or upgrade it"
	case errors.Is(e.Err, replication.ErrShardsHash):
		return ": run with --shards 1 (one slot) on this server"
	case errors.Is(e.Err, replication.ErrShardCount):
		return ": start with the --shards those were made with, or change the number of shards as docs/sharding.md says " +
			"(create the new shards' publications and slots while the old ones stream, stop, then drop the old ones); " +
			"a restart with another --shards alone would stream their aggregates twice or hold their WAL forever"
	case errors.Is(e.Err, replication.ErrShardFilter):
		return ": drop that publication and its shard's slot only after the procedure of docs/sharding.md, or give the shards another --publication and --slot"
	case errors.Is(e.Err, replication.ErrShardColumn):
		return ": point --column-aggregate-id at a text or varchar column of a deterministic collation, or leave --shards at 1"
	case errors.Is(e.Err, replication.ErrHolderTaken):
		return "; this process stopped all its shards, and a restart waits as a standby"
	case errors.Is(e.Err, replication.ErrPublicationGone):
		return fmt.Sprintf(". To recover: re-create it (CREATE PUBLICATION %s FOR TABLE <outbox table> WITH (publish = 'insert')), "+
			"drop the slot (SELECT pg_drop_replication_slot('%s')), start cdc-outbox with --recreate-slot, "+
			"then re-publish with cdc-outbox republish --after-id <id> the outbox rows committed after the last confirmed position %s "+
			"(those your consumers have not seen; they dedupe by event id)",
			pgname.Quote(e.Publication), e.Slot, e.Confirmed)
	case errors.Is(e.Err, replication.ErrWALLost):
		_, prevent := replication.Invalidation(e.Reason)
		return ". To recover: start once with --recreate-slot, which drops this slot and creates a new one that streams only what commits from then on, " +
			"then re-publish the outbox rows committed after that position from the table: cdc-outbox republish --after-id <the last id up to which Kafka has every event> " +
			"(or --since <a time before it>); consumers skip the repeats by event id; " +
			"to prevent it, " + prevent
	}
	return ""
}

// badEventAdvice is the way out of a bad event that stopped the stream.
func badEventAdvice(e *pipeline.BadEventError) string {
	var refused *pipeline.RefusedError
	var lone *pipeline.NonTransactionalError
	switch {
	case errors.As(e.Err, &refused):
		return "; or run with --on-bad-event=dead-letter to set such events aside"
	case errors.As(e.Err, &lone):
		return "; it stops the stream at every start until it is set aside: run with --on-bad-event=dead-letter, and correct the writer"
	case e.Message:
		return "; a message cannot be corrected once written: correct the writer, and fix the configuration and restart, or run with --on-bad-event=dead-letter to set such events aside"
	}
	return "; fix the row (or the configuration) and restart, or run with --on-bad-event=dead-letter to set such events aside"
}

// mismatchAdvice is the way out of a payload that does not fit its schema.
func mismatchAdvice(e *schema.MismatchError) string {
	return fmt.Sprintf("; correct the writer so its payloads fit the %s schema, or register a version of subject %q that accepts them "+
		"(mind the subject's compatibility rule: Confluent's default is BACKWARD, Apicurio's none)", e.Format, e.Subject)
}

// registryAdvice says what to do about a registry that did not answer
// usefully; a retryable failure is waited for by the stream.
func registryAdvice(e *schema.RegistryError) string {
	waits := ""
	if schema.Retryable(e) {
		waits = "; the stream waits, reading again from the confirmed position with backoff, and goes on once the registry answers"
	}
	switch {
	case e.Status == 401 || e.Status == 403:
		return waits + ": the registry refuses the credentials: check --schema-registry-username with --schema-registry-password-file, or --schema-registry-bearer-token-file"
	case e.Status == 429 || e.Status >= 500:
		return waits + ": the registry is overloaded or failing: check its health and logs"
	case e.Status == 0 && schema.Retryable(e):
		return waits + ": check that the registry runs and that --schema-registry-url reaches it (a slower answer than --schema-registry-timeout counts as none)"
	case e.Status == 0:
		return ": the registry's TLS certificate did not verify: point --schema-registry-ca-file at the CA that signed it, or connect by a name the certificate lists"
	case e.Status == 404:
		return ": check --schema-registry-url: it names the base of the Confluent-compatible API (Apicurio: http://host:8080/apis/ccompat/v7)"
	}
	return ": check --schema-registry-url and the registry's log"
}

// kafkaRefusal says what to do about a record the broker refused for good.
func kafkaRefusal(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return "; the topic's max.message.bytes (or the broker's message.max.bytes) is below --max-record-bytes: lower --max-record-bytes to match, " +
			"so such rows are caught as bad events before they are sent, or raise the topic's limit"
	case errors.Is(err, kerr.InvalidTimestamp):
		return "; the record's timestamp (the row's created_at) is out of the range the topic accepts (message.timestamp.before.max.ms and " +
			"message.timestamp.after.max.ms): fix created_at in the row, or widen the topic's range"
	case errors.Is(err, kerr.InvalidRecord):
		return "; the broker's validation of the record failed (a compacted topic needs a key; check the broker's log for the reason)"
	case errors.Is(err, kerr.CorruptMessage):
		return "; the broker found the record batch corrupt (CRC mismatch): check the network and the broker, and --kafka-compression"
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return "; create the topic, or allow auto-creation (broker auto.create.topics.enable and --kafka-auto-create-topics); " +
			"if both allow it, the broker refused to create it (a name that differs from an existing topic's only in '.' and '_' collides with it): see the broker's log"
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return "; grant the producer WRITE on the topic"
	case errors.Is(err, kerr.InvalidTopicException):
		return "; the broker does not accept this topic name (invalid, or an internal topic such as __consumer_offsets): check --topic and the row's columns it uses"
	}
	return kafkaFault(err)
}

// txAdvice says what to do about a failure of exactly-once delivery.
func txAdvice(e *sink.TxError) string {
	var refused *sink.RecordError
	switch {
	case errors.As(e.Err, &refused):
		return "" // its own advice says it
	case e.Fenced():
		return "; another instance registered the same transactional id (--transactional-id, by default from the database and --slot) and took over: " +
			"this instance was fenced and stops without writing. If it should be the one running, stop the other and start this one again"
	case errors.Is(e.Err, kerr.InvalidTransactionTimeout):
		return "; the broker's transaction.max.timeout.ms is below the producer's transaction timeout (40s): raise it on the broker"
	case errors.Is(e.Err, kerr.TransactionalIDAuthorizationFailed):
		return "; grant the producer WRITE and DESCRIBE on the transactional id (ACL resource TransactionalId, --transactional-id)"
	case errors.Is(e.Err, kerr.ClusterAuthorizationFailed):
		return "; grant the producer IDEMPOTENT_WRITE on the cluster, or WRITE on the transactional id (--transactional-id)"
	}
	return "; the Kafka transaction was aborted or its outcome is unknown, and no position past it was confirmed: " +
		"start cdc-outbox again, it resumes from the checkpoint in Kafka (--checkpoint-topic)"
}

// checkpointAdvice says what to do when the checkpoint topic cannot be
// created or read.
func checkpointAdvice(e *sink.CheckpointError) string {
	switch {
	case errors.Is(e.Err, kerr.TopicAuthorizationFailed):
		return "; grant the producer READ and WRITE (and CREATE, or create it yourself, compacted) on --checkpoint-topic"
	case errors.Is(e.Err, kerr.ClusterAuthorizationFailed):
		return "; create --checkpoint-topic yourself with cleanup.policy=compact, or grant the producer CREATE on the cluster"
	}
	var short *sink.ShortReadError
	if errors.As(e.Err, &short) {
		return "; the brokers were too slow to deliver --checkpoint-topic to its end within the start's minute, so the position is unknown and nothing was streamed: " +
			"start again once they answer promptly (a restart is safe)"
	}
	return "; exactly-once delivery reads its position from --checkpoint-topic at start: check that the brokers answer and the topic can be read"
}

// kafkaFault says what to check for an error of reaching the brokers that
// no retry cures (sink.FaultOf): a refused SASL login or a failed TLS
// handshake. Neither the error nor the advice carries a password.
func kafkaFault(err error) string {
	switch sink.FaultOf(err) {
	case sink.FaultSASLCredentials:
		return "; SASL authentication failed: check --kafka-sasl-username and the password " +
			"(--kafka-sasl-password-file or --kafka-sasl-password), that the user exists on the broker " +
			"with credentials for --kafka-sasl-mechanism, and that --kafka-brokers names its SASL listener"
	case sink.FaultSASLMechanism:
		return "; SASL authentication failed: the listener does not offer --kafka-sasl-mechanism; " +
			"use one of the broker's sasl.enabled.mechanisms, or check that --kafka-brokers names its SASL listener"
	case sink.FaultSASLUnexpected:
		return "; SASL authentication failed: the listener does not expect SASL; point --kafka-brokers at the broker's " +
			"SASL_SSL (or SASL_PLAINTEXT) listener, or set --kafka-sasl-mechanism=none"
	case sink.FaultTLSUnknownCA:
		return "; TLS: the broker's certificate is not signed by a CA this client trusts; " +
			"give that CA's PEM certificate with --kafka-tls-ca-file"
	case sink.FaultTLSHostname:
		return "; TLS: the broker's certificate is not valid for the address dialed; " +
			"use a name the certificate lists in --kafka-brokers, or set --kafka-tls-server-name"
	case sink.FaultTLSCertificate:
		return "; TLS: the broker's certificate is not valid (expired, not yet valid, or not for server authentication); renew it on the broker"
	case sink.FaultNotTLS:
		return "; TLS: the listener does not speak TLS; point --kafka-brokers at the broker's SSL or SASL_SSL listener, or drop --kafka-tls"
	}
	return ""
}
