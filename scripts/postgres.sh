#!/usr/bin/env bash
# A throwaway local PostgreSQL cluster for tests, the demo and benchmarks.
#
#   scripts/postgres.sh start|stop|restart|kill|status|url|logs|destroy|init|datadir
#
# The cluster is built from the machine's server binaries (initdb/pg_ctl on
# PATH, else the newest /usr/lib/postgresql/*/bin), listens on 127.0.0.1 only,
# on a free port chosen at first start and kept for later restarts, and has
# wal_level=logical so cdc-outbox can stream from it. `url` prints a libpq URL
# for the superuser `postgres` (trust authentication: it is local and
# throwaway).
#
# initdb refuses to run as root, so when run as root the server runs as the
# unprivileged user `postgres` (created if missing) and its data lives under
# /tmp, where that user can reach it. As a normal user it lives in
# .local/postgres (git-ignored). CDC_OUTBOX_LOCAL moves the state folder.
#
# `init` creates the cluster without starting it and `datadir` prints its data
# folder, so a caller can change its configuration or add files (TLS
# certificates) before the first start; internal/testenv does that for tests
# that need a server of their own.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/postgres"

mkdir -p "$state"
if [ "$(id -u)" = 0 ]; then
	runas=postgres
	# A folder the postgres user can reach, made once per checkout and
	# remembered in the state folder (so a new clone never finds an old
	# cluster there).
	if [ ! -s "$state/datadir" ]; then
		mktemp -d "${TMPDIR:-/tmp}/cdc-outbox-postgres.XXXXXXXX" >"$state/datadir"
	fi
	data="$(cat "$state/datadir")"
else
	runas=""
	data="$state/data"
fi
portfile="$state/port"
logfile="$data.log"

die() { echo "postgres.sh: $*" >&2; exit 1; }

bindir() {
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(readlink -f "$(command -v pg_ctl)")"
		return
	fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$d" ] && [ -x "$d/initdb" ] ||
		die "no PostgreSQL server binaries found (initdb, pg_ctl); install them, e.g. 'apt-get install postgresql'"
	echo "$d"
}

# as runs a command as the server's user.
as() {
	if [ -n "$runas" ]; then
		runuser -u "$runas" -- "$@"
	else
		"$@"
	fi
}

port_is_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

port() {
	if [ ! -s "$portfile" ]; then
		mkdir -p "$state"
		local p
		for _ in $(seq 1 200); do
			p=$((20000 + RANDOM % 20000))
			if port_is_free "$p"; then
				echo "$p" >"$portfile"
				break
			fi
		done
		[ -s "$portfile" ] || die "no free port found on 127.0.0.1"
	fi
	cat "$portfile"
}

url() { echo "postgres://postgres@127.0.0.1:$(port)/postgres?sslmode=disable"; }

init() {
	[ -s "$data/PG_VERSION" ] && return
	local bin
	bin=$(bindir)
	if [ -n "$runas" ]; then
		id "$runas" >/dev/null 2>&1 || useradd --system --no-create-home "$runas"
	fi
	mkdir -p "$data" "$state"
	[ -z "$runas" ] || chown "$runas" "$data"
	chmod 700 "$data"
	as "$bin/initdb" --pgdata="$data" --username=postgres --auth=trust \
		--encoding=UTF8 --locale=C.UTF-8 >"$data.initdb.log" 2>&1 ||
		{ cat "$data.initdb.log" >&2; die "initdb failed"; }
	# The settings cdc-outbox needs, plus room for tests that run in parallel
	# (each owns a slot and a walsender). fsync is off: this cluster is
	# throwaway, and killing the server process (not the machine) loses
	# nothing that was written to the OS.
	cat >>"$data/postgresql.conf" <<-EOF

		# --- scripts/postgres.sh ---
		listen_addresses = '127.0.0.1'
		port = $(port)
		unix_socket_directories = ''  # TCP only: no socket lock file to outlive a killed server
		wal_level = logical
		max_wal_senders = 40
		max_replication_slots = 40
		max_connections = 200
		fsync = off
		log_min_messages = warning
	EOF
}

running() {
	local pid
	pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
	[ -n "$pid" ] && ! gone "$pid"
}

start() {
	init
	if running; then
		echo "postgres already running: $(url)"
		return
	fi
	touch "$logfile"
	[ -z "$runas" ] || chown "$runas" "$logfile"
	as "$(bindir)/pg_ctl" start -D "$data" -l "$logfile" -w -t 60 >/dev/null ||
		{ tail -n 10 "$logfile" >&2; die "server did not start; log: $logfile"; }
	echo "postgres running: $(url)"
}

stop() {
	[ -s "$data/PG_VERSION" ] || return 0
	running || return 0
	as "$(bindir)/pg_ctl" stop -D "$data" -m fast -w -t 60 >/dev/null
}

# gone reports whether none of the given processes is alive (a zombie that
# init has not reaped yet counts as gone).
gone() {
	local p
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		[ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && continue
		return 1
	done
}

# kill SIGKILLs the postmaster: the next start runs crash recovery. It waits
# until the postmaster and its backends are gone, because a new postmaster
# refuses to start while old backends still hold the shared memory.
kill9() {
	local pid kids
	pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
	[ -n "$pid" ] || die "not running"
	kids=$(ps -o pid= --ppid "$pid" || true)
	kill -KILL "$pid"
	# shellcheck disable=SC2086 # word splitting of the pid list is meant
	for _ in $(seq 1 300); do
		if gone "$pid" $kids; then
			# A dead postmaster that init has not reaped yet still passes
			# PostgreSQL's own liveness check of postmaster.pid; it is dead,
			# so its lock file goes.
			rm -f "$data/postmaster.pid"
			return
		fi
		sleep 0.1
	done
	die "postmaster $pid or its backends did not exit after SIGKILL"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
kill) kill9 ;;
status)
	if [ -s "$data/PG_VERSION" ] && running; then echo "running: $(url)"; else echo "stopped"; exit 3; fi
	;;
url) url ;;
init) init ;;
datadir) echo "$data" ;;
logs) cat "$logfile" ;;
destroy)
	stop || true
	rm -rf "$data" "$data.log" "$data.initdb.log" "$state"
	# The next start makes a new cluster from scratch.
	;;
*)
	echo "usage: $0 start|stop|restart|kill|status|url|logs|destroy|init|datadir" >&2
	exit 2
	;;
esac
