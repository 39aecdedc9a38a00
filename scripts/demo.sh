#!/usr/bin/env bash
# `make demo`: cdc-outbox end to end on this machine, no Docker. Starts a
# PostgreSQL and a Kafka of the demo's own, applies sql/publication.sql,
# runs the streamer, writes a burst of payment events and shows them
# arriving in Kafka with the lag figures. Ctrl-C stops everything.
#
# The demo's servers are not the tests': their state is in .local/demo
# (under CDC_OUTBOX_LOCAL when set), so a test run never finds the demo's
# slot holding WAL on its server, and stopping the demo stops nothing a
# test uses. The downloads (Kafka jars, PostgreSQL binaries) are shared.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/ports.sh
. "$repo/scripts/lib/ports.sh" # ports_alive
cd "$repo"
local_dir="${CDC_OUTBOX_LOCAL:-$repo/.local}/demo"
mkdir -p "$local_dir"
# The servers' scripts keep their state there.
export CDC_OUTBOX_LOCAL="$local_dir"
bin="$local_dir/bin/cdc-outbox"
log="$local_dir/demo-streamer.log"
http="127.0.0.1:${CDC_OUTBOX_DEMO_HTTP_PORT:-8080}"
streamer=""

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# where says where the demo's data is: as root, PostgreSQL's data folder is
# under /tmp, where the unprivileged user that runs the server can reach it
# (scripts/postgres.sh).
where() {
	local pgdata
	pgdata="$(scripts/postgres.sh datadir)"
	case "$pgdata" in
	"$local_dir"/*) echo "$local_dir" ;;
	*) echo "$local_dir, and PostgreSQL's data folder $pgdata" ;;
	esac
}

# tell writes a line of the cleanup to stdout, or to stderr when stdout is
# gone (`make demo | tee demo.log`, and Ctrl-C stops tee first), or
# nowhere: the cleanup goes on either way.
tell() { echo "$*" 2>/dev/null || echo "$*" >&2 2>/dev/null || true; }

# cleanup stops the streamer with one SIGTERM (it drains and confirms what
# Kafka acknowledged, then exits 0), then the servers. The streamer runs in
# a session of its own (setsid, below), so the terminal's Ctrl-C reaches
# only this script: a second signal would make it exit at once. Nothing it
# writes may stop it: SIGPIPE is ignored and a failed write is no error.
cleanup() {
	trap - INT TERM EXIT
	trap '' PIPE
	set +e
	tell
	tell "==> Stopping"
	if [ -n "$streamer" ] && kill -0 "$streamer" 2>/dev/null; then
		kill -TERM "$streamer"
		if wait "$streamer"; then
			tell "cdc-outbox stopped"
		else
			tell "cdc-outbox exited with status $?; its log: $log"
		fi
	fi
	scripts/kafka.sh stop || tell "the demo's Kafka did not stop: CDC_OUTBOX_LOCAL=$local_dir scripts/kafka.sh stop"
	scripts/postgres.sh stop || tell "the demo's PostgreSQL did not stop: CDC_OUTBOX_LOCAL=$local_dir scripts/postgres.sh stop"
	tell "servers stopped; their data stays for the next demo: $(where). 'make clean' removes it"
}
# Ctrl-C (or a TERM) is how the demo ends: a clean stop, exit 0. A stdout
# that is gone (`make demo | head`) ends it too, once the script writes to
# it: the servers are stopped all the same.
trap 'cleanup; exit 0' INT TERM
trap 'exit 141' PIPE
trap cleanup EXIT

say "Checking prerequisites"
scripts/deps.sh
jars="${CDC_OUTBOX_KAFKA_JARS:-$repo/.local/kafka/libs}"
if [ -f "$jars/.pom-$(md5sum scripts/kafka/pom.xml | cut -d' ' -f1)" ]; then
	say "Starting the demo's PostgreSQL and Kafka"
else
	say "Starting the demo's PostgreSQL and Kafka (downloading the Kafka jars first, once: about a minute)"
fi
echo "their data: $(where)"
scripts/postgres.sh start
scripts/kafka.sh start
url="$(scripts/postgres.sh url)"
brokers="$(scripts/kafka.sh brokers)"

say "Creating the outbox table and publication (sql/publication.sql)"
psql_bin="$(command -v psql || ls /usr/lib/postgresql/*/bin/psql | sort -V | tail -n 1)"
psql_() { "$psql_bin" "$url" -v ON_ERROR_STOP=1 -q "$@"; }
psql_ -f sql/publication.sql

say "Building and starting cdc-outbox"
# As `make build` builds it: the version and commit go into the binary.
make --no-print-directory -s build BIN="$bin"
"$bin" version
setsid "$bin" run --postgres-url "$url" --kafka-brokers "$brokers" --http-addr "$http" </dev/null >"$log" 2>&1 &
streamer=$!
# Until it streams, as long as it runs (a streamer that exited is a zombie
# of this script, which kill -0 would still find), for a minute at most.
deadline=$((SECONDS + 60))
until grep -q '"streaming"\|msg=streaming' "$log"; do
	ports_alive "$streamer" || { cat "$log"; echo "cdc-outbox exited; its log is above"; exit 1; }
	[ $SECONDS -lt $deadline ] || { cat "$log"; echo "cdc-outbox did not stream within a minute; its log is above"; exit 1; }
	sleep 0.1
done
echo "streaming (log: $log)"

say "A payment service writes 6 events into the outbox, each in its own transaction"
since=$(($(date +%s%3N) - 1000))
for i in 1 2 3; do
	for kind in PaymentCreated PaymentCaptured; do
		psql_ -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		          VALUES ('payment', 'pay-$i', '$kind', '{\"payment_id\": \"pay-$i\", \"amount\": ${i}00, \"currency\": \"EUR\"}',
		                  '{\"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e473$i-00f067aa0ba902b7-01\"}')"
	done
done

say "What arrives in Kafka"
go run ./scripts/demo --brokers "$brokers" --since "$since" --count 6 --metrics "http://$http/metrics"

say "cdc-outbox keeps streaming. Try, in another terminal:"
cat <<-TIP
	  psql '$url' -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', 'OrderPlaced', '{}')"
	  curl -s http://$http/metrics | grep ^cdc_outbox_
	  $bin status --postgres-url '$url'
	Press Ctrl-C to stop everything.
TIP
wait "$streamer"
