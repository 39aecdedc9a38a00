#!/usr/bin/env bash
# A local single-node Apache Kafka broker (KRaft, combined broker+controller)
# for tests, the demo and benchmarks: real Kafka jars from Maven Central, run
# with the machine's Java 17+. No Docker.
#
#   scripts/kafka.sh start|stop|restart|kill|pause|resume|status|brokers|
#                    proxied-brokers|proxied-target|logs|destroy
#
# The jars are resolved once by Maven from scripts/kafka/pom.xml into
# .local/kafka/libs and reused. The broker listens on 127.0.0.1 on free ports
# chosen at first start and kept, so a restarted broker is found at the same
# address; its log dir survives stop, kill and restart (destroy removes it).
# `brokers` prints the bootstrap address. "Ready" means the broker answered a
# metadata request (scripts/kafkaready), not that some time passed.
# CDC_OUTBOX_LOCAL moves the state folder.
#
# A second listener, PROXIED, is for network-fault tests. The broker listens
# on the address `proxied-target` prints and advertises the one
# `proxied-brokers` prints, where nothing listens until a test starts a proxy
# there that forwards to the target. A Kafka client connects to the bootstrap
# address and then to the address the broker advertises; bootstrapped at
# `proxied-brokers`, every one of its connections crosses the test's proxy,
# which can cut them or go silent. Both ports are chosen at first start and
# kept. A state folder written before this listener existed is brought up to
# date (same ports, same log dir) by the next start; a broker already running
# on the old file opens the listener at its next restart.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/kafka"
libs="$state/libs"
data="$state/data"
conf="$state/server.properties"
pidfile="$state/pid"
logfile="$state/kafka.log"
pom="$repo/scripts/kafka/pom.xml"

die() { echo "kafka.sh: $*" >&2; exit 1; }

port_is_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port [below [taken...]]: a port nothing listens on, under below
# (default 40000), other than the taken ones.
free_port() {
	local p below=${1:-40000}
	shift || true
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % (below - 20000)))
		case " $* " in *" $p "*) continue ;; esac
		if port_is_free "$p"; then echo "$p"; return; fi
	done
	die "no free port found on 127.0.0.1"
}

# conf_port KEY LISTENER: the port of LISTENER in the KEY line of the
# existing server.properties (listeners, advertised.listeners), or nothing.
conf_port() {
	[ -f "$conf" ] || return 0
	sed -n "s/^$1=.*$2:\/\/[^,]*:\([0-9][0-9]*\).*/\1/p" "$conf" | head -n 1
}

java_bin() {
	local j=""
	if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
		j="$JAVA_HOME/bin/java"
	elif command -v java >/dev/null 2>&1; then
		j=$(command -v java)
	fi
	[ -n "$j" ] || die "no Java found; install a JDK 17+ (e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME"
	local v
	v=$("$j" -XshowSettings:properties -version 2>&1 | awk -F' = ' '/java.specification.version/ {print $2}')
	[ "${v%%.*}" -ge 17 ] 2>/dev/null || die "Java $v found at $j; Kafka 4 needs Java 17+"
	echo "$j"
}

# jars downloads the broker's jars unless the cache matches the pom.
jars() {
	local sum
	sum=$(md5sum "$pom" | cut -d' ' -f1)
	[ -f "$libs/.pom-$sum" ] && return
	command -v mvn >/dev/null 2>&1 || die "Maven is needed once to fetch the Kafka jars; install it (e.g. 'apt-get install maven')"
	echo "kafka.sh: downloading Apache Kafka jars from Maven Central (once, ~45 MB)..." >&2
	rm -rf "$libs"
	mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory="$libs" >&2 || die "could not fetch the Kafka jars with Maven"
	touch "$libs/.pom-$sum"
}

# configure writes server.properties at first start. An existing file is
# kept as it is unless it lacks a listener this script now writes; then it is
# written again, keeping its ports and its log dir, so the broker's data and
# the addresses clients know stay valid.
configure() {
	[ -f "$conf" ] && grep -q '^listeners=.*PROXIED://' "$conf" && return
	mkdir -p "$state" "$data"
	local port cport logdirs=""
	port=$(conf_port listeners PLAINTEXT)
	cport=$(conf_port listeners CONTROLLER)
	[ ! -f "$conf" ] || logdirs=$(sed -n 's/^log\.dirs=//p' "$conf" | head -n 1)
	[ -n "$port" ] || port=$(free_port)
	[ -n "$cport" ] || cport=$(free_port 40000 "$port")
	# The PROXIED listener: the broker listens on pport and advertises
	# padv, where a test's proxy listens (forwarding to pport) while it
	# runs. padv is taken below the kernel's ephemeral range, so no
	# outgoing connection is given it as its local port meanwhile.
	local pport padv ephemeral
	pport=$(conf_port listeners PROXIED)
	padv=$(conf_port advertised.listeners PROXIED)
	ephemeral=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	[ "$ephemeral" -gt 21000 ] 2>/dev/null || ephemeral=40000
	[ -n "$pport" ] || pport=$(free_port 40000 "$port" "$cport")
	[ -n "$padv" ] || padv=$(free_port "$ephemeral" "$port" "$cport" "$pport")
	local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
	local advertised="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
	local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
	listeners+=",PROXIED://127.0.0.1:$pport"
	advertised+=",PROXIED://127.0.0.1:$padv"
	protocols+=",PROXIED:PLAINTEXT"
	[ ! -f "$conf" ] || echo "kafka.sh: adding the PROXIED listener to $conf (ports and log dir kept)" >&2
	cat >"$conf" <<-EOF
		# Written by scripts/kafka.sh: one node that is both broker and controller.
		process.roles=broker,controller
		node.id=1
		controller.quorum.bootstrap.servers=127.0.0.1:$cport
		listeners=$listeners
		advertised.listeners=$advertised
		listener.security.protocol.map=$protocols
		inter.broker.listener.name=PLAINTEXT
		controller.listener.names=CONTROLLER
		log.dirs=${logdirs:-$data}
		num.partitions=1
		# A single node: every internal topic has one replica.
		offsets.topic.replication.factor=1
		offsets.topic.num.partitions=1
		transaction.state.log.replication.factor=1
		transaction.state.log.min.isr=1
		share.coordinator.state.topic.replication.factor=1
		share.coordinator.state.topic.min.isr=1
		# Tests create consumer groups and expect them to be served at once.
		group.initial.rebalance.delay.ms=0
		# The default cleaner buffer is 128 MiB of heap; the broker runs in 512 MiB.
		log.cleaner.dedupe.buffer.size=2097152
		auto.create.topics.enable=true
	EOF
	echo "127.0.0.1:$port" >"$state/brokers"
}

format() {
	[ -f "$data/meta.properties" ] && return
	local j id
	j=$(java_bin)
	id=$("$j" -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
	"$j" -cp "$libs/*" -Dlog4j2.configurationFile="$repo/scripts/kafka/log4j2.properties" \
		kafka.tools.StorageTool format --standalone -t "$id" -c "$conf" >"$state/format.log" 2>&1 ||
		{ cat "$state/format.log" >&2; die "formatting the log dir failed"; }
}

pid() { cat "$pidfile" 2>/dev/null || true; }

running() {
	local p
	p=$(pid)
	[ -n "$p" ] && [ -r "/proc/$p/stat" ] && [ "$(awk '{print $3}' "/proc/$p/stat")" != Z ]
}

ready() {
	(cd "$repo" && go run ./scripts/kafkaready -brokers "$(cat "$state/brokers")" -timeout "$1")
}

start() {
	if running; then
		echo "kafka already running: $(cat "$state/brokers")"
		configure
		if port_is_free "$(conf_port listeners PROXIED)"; then
			echo "kafka.sh: the running broker was started without the PROXIED listener; 'scripts/kafka.sh restart' opens it" >&2
		fi
		return
	fi
	jars
	configure
	format
	local j
	j=$(java_bin)
	# setsid: the broker must outlive the shell that started it and must not
	# get the terminal's Ctrl-C meant for a test run.
	setsid "$j" -Xms256m -Xmx512m -XX:+UseG1GC \
		-Dlog4j2.configurationFile="$repo/scripts/kafka/log4j2.properties" \
		-cp "$libs/*" kafka.Kafka "$conf" </dev/null >>"$logfile" 2>&1 &
	echo $! >"$pidfile"
	if ! ready 90s; then
		tail -n 20 "$logfile" >&2
		die "broker did not answer a metadata request within 90s; log: $logfile"
	fi
	echo "kafka running: $(cat "$state/brokers")"
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
	running || return 0
	local p
	p=$(pid)
	kill -TERM "$p"
	wait_gone "$p" 600 || { kill -KILL "$p"; wait_gone "$p" 100; }
	rm -f "$pidfile"
}

kill9() {
	running || die "not running"
	local p
	p=$(pid)
	kill -KILL "$p"
	wait_gone "$p" 100
	rm -f "$pidfile"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
kill) kill9 ;;
# pause/resume: SIGSTOP/SIGCONT, a broker that hangs without closing sockets.
pause) running || die "not running"; kill -STOP "$(pid)" ;;
resume) running || die "not running"; kill -CONT "$(pid)" ;;
status)
	if running; then echo "running: $(cat "$state/brokers")"; else echo "stopped"; exit 3; fi
	;;
brokers) configure; cat "$state/brokers" ;;
# The PROXIED listener (see the top): the address clients are sent to, where
# a test's proxy listens, and the address the broker listens on, where that
# proxy forwards.
proxied-brokers) configure; echo "127.0.0.1:$(conf_port advertised.listeners PROXIED)" ;;
proxied-target) configure; echo "127.0.0.1:$(conf_port listeners PROXIED)" ;;
logs) cat "$logfile" ;;
destroy)
	stop || true
	# Keep the downloaded jars: they are a cache, not state.
	rm -rf "$data" "$conf" "$state/brokers" "$logfile" "$state/format.log"
	;;
*)
	echo "usage: $0 start|stop|restart|kill|pause|resume|status|brokers|proxied-brokers|proxied-target|logs|destroy" >&2
	exit 2
	;;
esac
