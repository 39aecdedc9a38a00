#!/usr/bin/env bash
# A local single-node Apache Kafka broker (KRaft, combined broker+controller)
# for tests, the demo and benchmarks: real Kafka jars from Maven Central, run
# with the machine's Java 17+. No Docker.
#
#   scripts/kafka.sh start|stop|restart|kill|pause|resume|status|logs|destroy
#   scripts/kafka.sh brokers|sasl-brokers|sasl-user|sasl-password-file|ca-file
#   scripts/kafka.sh proxied-brokers|proxied-target
#
# The jars are resolved once by Maven from scripts/kafka/pom.xml into
# .local/kafka/libs (CDC_OUTBOX_KAFKA_JARS moves them), whatever the state
# folder, and reused. The broker listens on 127.0.0.1 on free ports below
# the kernel's ephemeral range (scripts/lib/ports.sh), chosen at first
# start and kept, so a restarted broker is found at the same address; its
# log dir survives stop, kill and restart (destroy removes it). A first
# start that loses a port to another program before the broker binds it
# starts again on new ports. "Ready" means the broker answered a metadata
# request on both client listeners (scripts/kafkaready), not that some time
# passed; a broker that exits meanwhile ends the wait at once, with the
# cause from its log.
#
# Two client listeners, each printed by a subcommand (one line, nothing else):
#
#   brokers             PLAINTEXT: host:port, no TLS, no authentication
#   sasl-brokers        SASL_SSL: host:port, TLS and SASL SCRAM-SHA-512
#   sasl-user           the SCRAM-SHA-512 user the SASL_SSL listener accepts
#   sasl-password-file  path of the file holding that user's password (mode
#                       0600, random, made once; one line)
#   ca-file             path of the PEM certificate of the test CA that signed
#                       the broker's certificate (SAN IP:127.0.0.1, localhost)
#
# The CA, the broker's PKCS12 keystore and truststore are made with the JDK's
# keytool into .local/kafka/tls. At start, when the user cannot log in with
# the password file's password, kafkaready creates it (or resets its
# password) through the admin API of the PLAINTEXT listener. A state folder from before the
# SASL_SSL listener existed is brought up to date by the next start: same
# ports, same data, a broker still running the old configuration restarted.
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
# date (same ports, same log dir) by the next start, like the SASL_SSL one.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/ports.sh
. "$repo/scripts/lib/ports.sh"
state="${CDC_OUTBOX_LOCAL:-$repo/.local}/kafka"
# The jars are a cache, shared by every state folder (the demo's, a test's).
libs="${CDC_OUTBOX_KAFKA_JARS:-$repo/.local/kafka/libs}"
data="$state/data"
conf="$state/server.properties"
pidfile="$state/pid"
tls="$state/tls"
password_file="$state/sasl-password"
sasl_user="cdc-outbox"
logfile="$state/kafka.log"
pom="$repo/scripts/kafka/pom.xml"

# Until the broker first answered, nobody knows its ports: a start that
# lost one may choose them all again.
unstarted="$state/unstarted"

die() { echo "kafka.sh: $*" >&2; exit 1; }

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

# keytool is the one of the JDK that runs the broker.
keytool_bin() {
	local j k
	j=$(java_bin)
	k="$(dirname "$(readlink -f "$j")")/keytool"
	[ -x "$k" ] || die "no keytool next to $j; install the JDK's tools (e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME"
	echo "$k"
}

secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# make_tls makes, once, a test CA and the broker's keystore (its key and a
# certificate for 127.0.0.1 signed by the CA) and truststore, all PKCS12,
# and the CA certificate as PEM for clients. Everything shares one random
# store password, kept beside them.
make_tls() {
	[ -s "$tls/ca.pem" ] && [ -s "$tls/broker.p12" ] && [ -s "$tls/truststore.p12" ] && [ -s "$tls/store-password" ] && return
	local ktool pw
	ktool=$(keytool_bin)
	rm -rf "$tls"
	mkdir -p "$tls"
	chmod 700 "$tls"
	(umask 077 && secret >"$tls/store-password")
	pw="$tls/store-password"
	kt() { "$ktool" "$@" >>"$tls/keytool.log" 2>&1 || { cat "$tls/keytool.log" >&2; die "keytool $1 failed; see $tls/keytool.log"; }; }
	kt -genkeypair -alias ca -keyalg EC -groupname secp256r1 -validity 3650 \
		-dname "CN=cdc-outbox local test CA" -ext bc:c -ext KU=keyCertSign,cRLSign \
		-storetype PKCS12 -keystore "$tls/ca.p12" -storepass:file "$pw"
	kt -exportcert -rfc -alias ca -keystore "$tls/ca.p12" -storepass:file "$pw" -file "$tls/ca.pem"
	kt -genkeypair -alias broker -keyalg EC -groupname secp256r1 -validity 3650 -dname "CN=127.0.0.1" \
		-storetype PKCS12 -keystore "$tls/broker.p12" -storepass:file "$pw"
	kt -certreq -alias broker -keystore "$tls/broker.p12" -storepass:file "$pw" -file "$tls/broker.csr"
	kt -gencert -alias ca -keystore "$tls/ca.p12" -storepass:file "$pw" -infile "$tls/broker.csr" \
		-outfile "$tls/broker.pem" -rfc -validity 3650 \
		-ext SAN=IP:127.0.0.1,DNS:localhost -ext KU=digitalSignature -ext EKU=serverAuth
	kt -importcert -noprompt -alias ca -file "$tls/ca.pem" -keystore "$tls/broker.p12" -storepass:file "$pw"
	kt -importcert -alias broker -file "$tls/broker.pem" -keystore "$tls/broker.p12" -storepass:file "$pw"
	kt -importcert -noprompt -alias ca -file "$tls/ca.pem" \
		-storetype PKCS12 -keystore "$tls/truststore.p12" -storepass:file "$pw"
	rm -f "$tls/broker.csr"
}

# make_password makes, once, the SCRAM user's password file.
make_password() {
	[ -s "$password_file" ] && return
	(umask 077 && secret >"$password_file.new" && echo >>"$password_file.new")
	mv "$password_file.new" "$password_file"
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

# configure writes server.properties. Ports already in it are kept, so an
# older file (one without the SASL_SSL or the PROXIED listener) gains the
# listener and keeps its addresses, its log dir and so its data; a file
# that is already current is left as it is.
configure() {
	mkdir -p "$state" "$data"
	local port cport sport logdirs=""
	port=$(conf_port listeners PLAINTEXT)
	cport=$(conf_port listeners CONTROLLER)
	sport=$(conf_port listeners SASL_SSL)
	[ ! -f "$conf" ] || logdirs=$(sed -n 's/^log\.dirs=//p' "$conf" | head -n 1)
	[ -f "$conf" ] || touch "$unstarted"
	[ -n "$port" ] || port=$(free_port) || exit 1
	[ -n "$cport" ] || cport=$(free_port "$port") || exit 1
	[ -n "$sport" ] || sport=$(free_port "$port" "$cport") || exit 1
	# The PROXIED listener: the broker listens on pport and advertises
	# padv, where a test's proxy listens (forwarding to pport) while it
	# runs.
	local pport padv
	pport=$(conf_port listeners PROXIED)
	padv=$(conf_port advertised.listeners PROXIED)
	[ -n "$pport" ] || pport=$(free_port "$port" "$cport" "$sport") || exit 1
	[ -n "$padv" ] || padv=$(free_port "$port" "$cport" "$sport" "$pport") || exit 1
	make_tls
	make_password
	local pw
	pw=$(cat "$tls/store-password")
	cat >"$conf.new.$$" <<-EOF
		# Written by scripts/kafka.sh: one node that is both broker and controller.
		process.roles=broker,controller
		node.id=1
		controller.quorum.bootstrap.servers=127.0.0.1:$cport
		listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,PROXIED://127.0.0.1:$pport,CONTROLLER://127.0.0.1:$cport
		advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_SSL://127.0.0.1:$sport,PROXIED://127.0.0.1:$padv,CONTROLLER://127.0.0.1:$cport
		listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT
		inter.broker.listener.name=PLAINTEXT
		controller.listener.names=CONTROLLER
		# SASL_SSL: TLS with a certificate of the test CA in $tls, and
		# SCRAM-SHA-512 users (scripts/kafkaready creates the test user).
		sasl.enabled.mechanisms=SCRAM-SHA-512
		listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
		ssl.keystore.type=PKCS12
		ssl.keystore.location=$tls/broker.p12
		ssl.keystore.password=$pw
		ssl.key.password=$pw
		ssl.truststore.type=PKCS12
		ssl.truststore.location=$tls/truststore.p12
		ssl.truststore.password=$pw
		ssl.client.auth=none
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
	chmod 600 "$conf.new.$$" # it holds the store password
	if cmp -s "$conf.new.$$" "$conf"; then
		rm -f "$conf.new.$$"
	else
		[ -f "$conf" ] && echo "kafka.sh: updated $conf (same ports and data)" >&2
		mv "$conf.new.$$" "$conf"
	fi
	echo "127.0.0.1:$port" >"$state/brokers"
	echo "127.0.0.1:$sport" >"$state/sasl-brokers"
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
	[ -n "$p" ] && ports_alive "$p"
}

# ready waits up to $1 for the broker to serve, and no longer than its
# process lives.
ready() {
	(cd "$repo" && go run ./scripts/kafkaready -brokers "$(cat "$state/brokers")" -timeout "$1" \
		-pid "$(pid)" -sasl-brokers "$(cat "$state/sasl-brokers")" -ca-file "$tls/ca.pem" \
		-scram-user "$sasl_user" -scram-password-file "$password_file")
}

# current says whether the running broker was started with server.properties
# as it is now.
current() { [ "$(md5sum <"$conf")" = "$(cat "$state/started-conf" 2>/dev/null)" ]; }

start() {
	if running; then
		configure
		if current; then
			echo "kafka already running: $(cat "$state/brokers")"
			return
		fi
		echo "kafka.sh: the running broker has an older configuration; restarting it" >&2
		stop
	fi
	jars
	local j attempt offset lost
	j=$(java_bin)
	for attempt in 1 2 3 4 5; do
		configure
		format
		offset=$(stat -c %s "$logfile" 2>/dev/null || echo 0)
		# setsid: the broker must outlive the shell that started it and must not
		# get the terminal's Ctrl-C meant for a test run.
		setsid "$j" -Xms256m -Xmx512m -XX:+UseG1GC \
			-Dlog4j2.configurationFile="$repo/scripts/kafka/log4j2.properties" \
			-cp "$libs/*" kafka.Kafka "$conf" </dev/null >>"$logfile" 2>&1 &
		echo $! >"$pidfile"
		md5sum <"$conf" >"$state/started-conf"
		if ready 90s; then
			rm -f "$unstarted"
			echo "kafka running: $(cat "$state/brokers")"
			return
		fi
		if running; then
			tail -n 20 "$logfile" >&2
			die "broker did not answer a metadata request within 90s; log: $logfile"
		fi
		rm -f "$pidfile"
		lost=$(ports_lost "$logfile" "$offset") || {
			tail -c +"$((offset + 1))" "$logfile" | tail -n 20 >&2
			die "the broker exited at start (its log is above); log: $logfile"
		}
		if [ ! -e "$unstarted" ]; then
			die "the broker could not bind one of its ports, which clients already know: $lost. Stop what holds it (ss -ltnp), or run 'scripts/kafka.sh destroy' to start afresh on new ports"
		fi
		[ "$attempt" -lt 5 ] || die "the broker lost a port at each of 5 starts, the last: $lost; log: $logfile"
		# A port found free was taken before the broker bound it. Nothing
		# was stored yet: new ports, and a log dir formatted for them (the
		# controller's address is written into it).
		echo "kafka.sh: $lost; starting again on new ports" >&2
		rm -rf "$data" "$conf" "$state/brokers" "$state/sasl-brokers" "$state/started-conf"
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
sasl-brokers) configure; cat "$state/sasl-brokers" ;;
sasl-user) echo "$sasl_user" ;;
sasl-password-file) configure; echo "$password_file" ;;
ca-file) configure; echo "$tls/ca.pem" ;;
# The PROXIED listener (see the top): the address clients are sent to, where
# a test's proxy listens, and the address the broker listens on, where that
# proxy forwards.
proxied-brokers) configure; echo "127.0.0.1:$(conf_port advertised.listeners PROXIED)" ;;
proxied-target) configure; echo "127.0.0.1:$(conf_port listeners PROXIED)" ;;
logs) cat "$logfile" ;;
destroy)
	stop || true
	# Keep the downloaded jars: they are a cache, not state.
	rm -rf "$data" "$conf" "$conf".new.* "$state/brokers" "$state/sasl-brokers" "$state/started-conf" \
		"$tls" "$password_file" "$logfile" "$state/format.log" "$unstarted"
	;;
*)
	echo "usage: $0 start|stop|restart|kill|pause|resume|status|logs|destroy" >&2
	echo "       $0 brokers|sasl-brokers|sasl-user|sasl-password-file|ca-file|proxied-brokers|proxied-target" >&2
	exit 2
	;;
esac
