# Ports for the local servers (PostgreSQL, Kafka, Jaeger, and any server
# added later), sourced by their scripts: `. "$repo/scripts/lib/ports.sh"`.
#
# A server is given a port found free now and binds it only later, so
# something else can take the port in between. Two rules make that rare,
# and a third makes it harmless:
#
#  1. Ports are chosen below the kernel's ephemeral range
#     (/proc/sys/net/ipv4/ip_local_port_range), where the kernel gives
#     outgoing connections their local port: any program connecting
#     anywhere could otherwise be given the chosen port before the server
#     binds it. Below that range only a program that asks for the very
#     port takes it.
#  2. A port is free when no socket of any state uses it (the kernel's
#     /proc/net/tcp and tcp6: listeners, connections, TIME_WAIT), not
#     merely when nothing answers a connect.
#  3. A server that lost a port exits; its script waits only while the
#     server process lives, tells a lost port from other failures by its
#     log (ports_lost), and starts it again on new ports when nobody knows
#     the old ones yet.

# ports_low is the lowest port handed out: below it lie the well-known and
# commonly configured ports.
ports_low=10000

# ports_high prints the first port of the ephemeral range, the end
# (exclusive) of the ports handed out. A range starting too low to leave
# room (a tuned machine) falls back to the default range's start.
ports_high() {
	local lo=32768
	read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
	[ "$lo" -ge $((ports_low + 2000)) ] 2>/dev/null || lo=32768
	echo "$lo"
}

# ports_in_use prints, one per line, the local ports of every TCP socket of
# this network namespace, whatever its state.
ports_in_use() {
	local _ local_address _rest
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _ local_address _rest; do
		case "$local_address" in *:*) echo $((16#${local_address##*:})) ;; esac
	done | sort -un
}

# free_port [TAKEN...] prints a port below the ephemeral range that no
# socket uses, other than the TAKEN ones (ports chosen for the same server
# and not bound yet).
free_port() {
	local high used p
	high=$(ports_high)
	used=" $(ports_in_use | tr '\n' ' ') $* "
	for _ in $(seq 1 500); do
		p=$((ports_low + (RANDOM * 32768 + RANDOM) % (high - ports_low)))
		case "$used" in *" $p "*) continue ;; esac
		echo "$p"
		return 0
	done
	echo "ports.sh: no free port found on 127.0.0.1 between $ports_low and $high" >&2
	return 1
}

# ports_lost LOG [OFFSET] prints the line of LOG (from byte OFFSET on, the
# part the last start wrote) that says a port could not be bound, and fails
# when there is none. It knows the words of PostgreSQL ("could not bind"),
# the JVM (Kafka: "Address already in use") and Go (Jaeger: "bind: address
# already in use").
ports_lost() {
	tail -c +"$((${2:-0} + 1))" "$1" 2>/dev/null | grep -i -m 1 -e 'address already in use' -e 'could not bind'
}

# ports_alive PID says whether process PID runs: a zombie its parent has not
# reaped yet runs nothing (kill -0 would still succeed on it).
ports_alive() {
	[ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
