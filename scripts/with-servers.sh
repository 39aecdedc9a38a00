#!/usr/bin/env bash
# Runs a command with a real PostgreSQL and a real Apache Kafka available:
#
#   scripts/with-servers.sh go test ./...
#
# A server whose address is already set (CDC_OUTBOX_TEST_POSTGRES_URL,
# CDC_OUTBOX_TEST_KAFKA_BROKERS) is used as it is. Otherwise the local one is
# started (scripts/postgres.sh, scripts/kafka.sh), its address exported, and it
# is stopped again when the command ends, whether it passed or not (one that
# was already running is left running). PG_VERSION picks the local
# PostgreSQL's major (scripts/postgres.sh). For the
# local servers CDC_OUTBOX_TEST_POSTGRES_CTL / CDC_OUTBOX_TEST_KAFKA_CTL name
# the control scripts, so fault tests can stop, kill and restart them.
#
# For the local broker's SASL_SSL listener (TLS, SCRAM-SHA-512) it also
# exports CDC_OUTBOX_TEST_KAFKA_SASL_BROKERS (its address),
# CDC_OUTBOX_TEST_KAFKA_CA (the test CA's PEM certificate),
# CDC_OUTBOX_TEST_KAFKA_SASL_USER and CDC_OUTBOX_TEST_KAFKA_SASL_PASSWORD_FILE
# (the file holding the user's password), each unless already set. With
# your own broker, set these for its SASL_SSL listener too.
#
# It also exports
# CDC_OUTBOX_TEST_KAFKA_PROXIED_BROKERS / CDC_OUTBOX_TEST_KAFKA_PROXIED_TARGET,
# the local broker's PROXIED listener (scripts/kafka.sh proxied-brokers,
# proxied-target), so network-fault tests can put a proxy between a client
# and the broker. These, too, are used as they are when already set.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
started=()
cleanup() {
	local s
	for s in "${started[@]}"; do "$repo/scripts/$s.sh" stop || true; done
}
trap cleanup EXIT

"$repo/scripts/deps.sh"

# A server that is already running (someone started it by hand) is used and
# left running; only what this script starts, it stops.
if [ -z "${CDC_OUTBOX_TEST_KAFKA_BROKERS:-}" ]; then
	"$repo/scripts/kafka.sh" status >/dev/null || started+=(kafka)
	"$repo/scripts/kafka.sh" start &
	kafka=$!
fi
if [ -z "${CDC_OUTBOX_TEST_POSTGRES_URL:-}" ]; then
	"$repo/scripts/postgres.sh" status >/dev/null || started+=(postgres)
	"$repo/scripts/postgres.sh" start
	export CDC_OUTBOX_TEST_POSTGRES_URL="$("$repo/scripts/postgres.sh" url)"
	export CDC_OUTBOX_TEST_POSTGRES_CTL="$repo/scripts/postgres.sh"
fi
if [ -n "${kafka:-}" ]; then
	wait "$kafka"
	export CDC_OUTBOX_TEST_KAFKA_BROKERS="$("$repo/scripts/kafka.sh" brokers)"
	export CDC_OUTBOX_TEST_KAFKA_CTL="$repo/scripts/kafka.sh"
	: "${CDC_OUTBOX_TEST_KAFKA_SASL_BROKERS:=$("$repo/scripts/kafka.sh" sasl-brokers)}"
	: "${CDC_OUTBOX_TEST_KAFKA_CA:=$("$repo/scripts/kafka.sh" ca-file)}"
	: "${CDC_OUTBOX_TEST_KAFKA_SASL_USER:=$("$repo/scripts/kafka.sh" sasl-user)}"
	: "${CDC_OUTBOX_TEST_KAFKA_SASL_PASSWORD_FILE:=$("$repo/scripts/kafka.sh" sasl-password-file)}"
	export CDC_OUTBOX_TEST_KAFKA_SASL_BROKERS CDC_OUTBOX_TEST_KAFKA_CA \
		CDC_OUTBOX_TEST_KAFKA_SASL_USER CDC_OUTBOX_TEST_KAFKA_SASL_PASSWORD_FILE
	: "${CDC_OUTBOX_TEST_KAFKA_PROXIED_BROKERS:=$("$repo/scripts/kafka.sh" proxied-brokers)}"
	: "${CDC_OUTBOX_TEST_KAFKA_PROXIED_TARGET:=$("$repo/scripts/kafka.sh" proxied-target)}"
	export CDC_OUTBOX_TEST_KAFKA_PROXIED_BROKERS CDC_OUTBOX_TEST_KAFKA_PROXIED_TARGET
fi

# The OTLP receiver of the tracing tests: each such test starts and stops
# it through this script, which builds it once into .local/bin (make test
# builds it first, as a cached step: scripts/jaeger.sh build).
: "${CDC_OUTBOX_TEST_JAEGER_CTL:=$repo/scripts/jaeger.sh}"
export CDC_OUTBOX_TEST_JAEGER_CTL

# The schema registry of the schema encoders' tests (internal/schema):
# each such test starts and stops Apicurio Registry through this script,
# which fetches it once into .local (scripts/apicurio.sh).
: "${CDC_OUTBOX_TEST_REGISTRY_CTL:=$repo/scripts/apicurio.sh}"
export CDC_OUTBOX_TEST_REGISTRY_CTL

"$@"
