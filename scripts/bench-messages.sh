#!/usr/bin/env bash
# Measures the outbox table against outbox messages (docs/messages.md), the
# service side as a user runs it and the streamer's drain:
#
#   scripts/with-servers.sh scripts/bench-messages.sh        (make bench-messages)
#
# Write side: pgbench clients run a business insert into `payments` plus
# either an outbox insert (table) or pg_logical_emit_message of the same
# event (message, the envelope outbox.Emit writes), or the business insert
# alone (none, the baseline), each in a new database, flat out for
# BENCH_SECONDS (20) with BENCH_CLIENTS (8) clients: transactions/s, WAL
# bytes per transaction (pg_current_wal_lsn before and after) and the outbox
# table's growth. Drain: BENCH_EVENTS (100000) events written either way
# behind a new slot, then the streamer started on it: time until Kafka
# acknowledged them all, and the streamer's CPU time per event (from
# /proc). Each kind runs BENCH_ROUNDS (2) times, interleaved, so a noisy
# neighbour hurts both alike. Prints a Markdown table per round.
#
# It needs CDC_OUTBOX_TEST_POSTGRES_URL (a superuser's) and
# CDC_OUTBOX_TEST_KAFKA_BROKERS, which scripts/with-servers.sh sets, pgbench
# and psql (PATH, or the newest /usr/lib/postgresql/*/bin), curl and Linux's
# /proc. It drops what it made.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/ports.sh
. "$repo/scripts/lib/ports.sh"
admin=${CDC_OUTBOX_TEST_POSTGRES_URL:?set CDC_OUTBOX_TEST_POSTGRES_URL (scripts/with-servers.sh does)}
brokers=${CDC_OUTBOX_TEST_KAFKA_BROKERS:?set CDC_OUTBOX_TEST_KAFKA_BROKERS (scripts/with-servers.sh does)}
seconds=${BENCH_SECONDS:-20}
clients=${BENCH_CLIENTS:-8}
events=${BENCH_EVENTS:-100000}
rounds=${BENCH_ROUNDS:-2}

pgbin() {
	if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return; fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
	[ -x "$d/$1" ] || { echo "bench-messages: no $1 found" >&2; exit 1; }
	echo "$d/$1"
}
pgbench=$(pgbin pgbench)
psql=$(pgbin psql)
clk=$(getconf CLK_TCK)

work=$(mktemp -d)
streamer_pid=
cleanup() {
	[ -z "$streamer_pid" ] || kill -TERM "$streamer_pid" 2>/dev/null || true
	for db in $("$psql" "$admin" -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'bench_messages_%'"); do
		"$psql" "$admin" -qAtc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '$db'" >/dev/null || true
		"$psql" "$admin" -qc "DROP DATABASE IF EXISTS $db" || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/cdc-outbox" "$repo/cmd/cdc-outbox"

# The event, the same each way: the row's id, created_at are the table's
# defaults; the message's are in its envelope, as outbox.Emit writes it.
payload='{"account": "acct-42", "amount": 1200, "currency": "EUR", "payment_id": "0192f0c1-7a3e-7b4c-9d2e-5f6a7b8c9d0e"}'
business="INSERT INTO payments (account, amount) VALUES ('acct-' || :acct, :acct);"
cat >"$work/none.sql" <<EOF
\set acct random(1, 100000)
BEGIN;
$business
COMMIT;
EOF
cat >"$work/table.sql" <<EOF
\set acct random(1, 100000)
BEGIN;
$business
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', 'acct-' || :acct, 'PaymentCreated', '$payload');
COMMIT;
EOF
cat >"$work/message.sql" <<EOF
\set acct random(1, 100000)
BEGIN;
$business
SELECT pg_logical_emit_message(true, 'cdc_outbox', '{"v":1,"id":"' || gen_random_uuid() || '","aggregate_type":"payment","aggregate_id":"acct-' || :acct || '","event_type":"PaymentCreated","payload":$payload,"created_at":' || to_json(now())::text || '}');
COMMIT;
EOF

base=${admin%%\?*}
base=${base%/*}
newdb() { # newdb NAME: a database with the outbox table and payments
	"$psql" "$admin" -qc "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" 2>/dev/null
	"$psql" "$base/$1?sslmode=disable" -q -v ON_ERROR_STOP=1 -f "$repo/sql/publication.sql" \
		-c "CREATE TABLE payments (id bigserial PRIMARY KEY, account text NOT NULL, amount int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
	echo "$base/$1?sslmode=disable"
}

write_side() { # write_side KIND: one row of the write table
	local kind=$1 url before after out tx tps wal sizes
	url=$(newdb "bench_messages_w_$kind")
	"$psql" "$url" -qc CHECKPOINT
	before=$("$psql" "$url" -Atc "SELECT pg_current_wal_lsn()")
	out=$("$pgbench" -n -c "$clients" -j 2 -T "$seconds" -f "$work/$kind.sql" "$url" 2>&1)
	after=$("$psql" "$url" -Atc "SELECT pg_current_wal_lsn()")
	tx=$(awk '/number of transactions actually processed/ {split($6, a, "/"); print a[1]}' <<<"$out")
	tps=$(awk '/^tps/ {printf "%.0f", $3}' <<<"$out")
	wal=$("$psql" "$url" -Atc "SELECT pg_wal_lsn_diff('$after', '$before')::bigint")
	sizes=$("$psql" "$url" -AtF ' | ' -c "SELECT pg_relation_size('outbox'), pg_indexes_size('outbox')")
	echo "| $kind | $tps | $((wal / tx)) | $sizes | $tx |"
	"$psql" "$admin" -qc "DROP DATABASE bench_messages_w_$kind"
}

drain() { # drain KIND: one row of the drain table
	local kind=$1 url slot port got start end ut st secs cpu
	url=$(newdb "bench_messages_d_$kind")
	slot="bench_messages_$kind"
	"$psql" "$url" -qAtc "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
	"$pgbench" -n -c 4 -j 2 -t $((events / 4)) -f "$work/$kind.sql" "$url" >/dev/null 2>&1
	port=$(free_port)
	start=$(date +%s.%N)
	"$work/cdc-outbox" run --postgres-url "$url" --kafka-brokers "$brokers" --slot "$slot" --create-slot=false \
		--topic "bench_messages_${kind}_$(date +%s).{aggregate_type}" --http-addr "127.0.0.1:$port" --log-level warn >"$work/drain-$kind.log" 2>&1 &
	streamer_pid=$!
	got=0
	while [ "$got" -lt $((events / 4 * 4)) ]; do
		sleep 0.1
		kill -0 "$streamer_pid" 2>/dev/null || { echo "bench-messages: the streamer stopped:" >&2; tail "$work/drain-$kind.log" >&2; exit 1; }
		got=$(curl -s "127.0.0.1:$port/metrics" | awk '/^cdc_outbox_events_total/ {s += $2} END {printf "%d", s}')
	done
	end=$(date +%s.%N)
	read -r ut st < <(awk '{print $14, $15}' "/proc/$streamer_pid/stat")
	kill -TERM "$streamer_pid"
	wait "$streamer_pid" || true
	streamer_pid=
	secs=$(echo "$end - $start" | bc -l)
	cpu=$(echo "($ut + $st) / $clk" | bc -l)
	printf '| %s | %d | %.1f | %.0f | %.1f |\n' "$kind" "$got" "$secs" "$(echo "$got / $secs" | bc -l)" "$(echo "$cpu * 1000000 / $got" | bc -l)"
	"$psql" "$url" -qAtc "SELECT pg_drop_replication_slot('$slot')" >/dev/null
	"$psql" "$admin" -qc "DROP DATABASE bench_messages_d_$kind"
}

echo "PostgreSQL $("$psql" "$admin" -Atc 'SHOW server_version'), fsync $("$psql" "$admin" -Atc 'SHOW fsync'), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
for round in $(seq "$rounds"); do
	echo
	echo "Round $round, write side ($clients clients, ${seconds}s each):"
	echo
	echo "| kind | tx/s | WAL bytes/tx | outbox heap bytes | outbox index bytes | transactions |"
	echo "|---|---|---|---|---|---|"
	for kind in none table message; do write_side "$kind"; done
	echo
	echo "Round $round, drain of $events events:"
	echo
	echo "| kind | events | seconds | events/s | streamer CPU µs/event |"
	echo "|---|---|---|---|---|"
	for kind in table message; do drain "$kind"; done
done
