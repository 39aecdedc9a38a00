#!/usr/bin/env bash
# A local Jaeger (all-in-one, in memory) as the OTLP receiver of the tracing
# tests, built once from its Go module into .local/bin and reused:
#
#   scripts/jaeger.sh build      # go build, only when the binary is missing
#   scripts/jaeger.sh start      # OTLP/HTTP and the query API on free ports
#   scripts/jaeger.sh stop
#   scripts/jaeger.sh configure  # choose the ports (start does it when needed)
#   scripts/jaeger.sh otlp-endpoint | query-url
#
# The build is long (a large module graph); CDC_OUTBOX_JAEGER_BIN names a
# binary built elsewhere to skip it. The ports are below the kernel's
# ephemeral range (scripts/lib/ports.sh); Jaeger keeps nothing between
# starts, so a start that lost a port to another program before Jaeger
# bound it starts again on new ports. Its state (configuration, log, pid)
# is in .local/jaeger; CDC_OUTBOX_LOCAL moves the state folder.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/ports.sh
. "$repo/scripts/lib/ports.sh"
version=v1.76.0 # as in scripts/jaeger/go.mod
dir="${CDC_OUTBOX_LOCAL:-$repo/.local}/jaeger"
bin="${CDC_OUTBOX_JAEGER_BIN:-$repo/.local/bin/jaeger-$version}"

build() {
	[ -x "$bin" ] && return 0
	mkdir -p "$(dirname "$bin")"
	local start=$SECONDS
	echo "jaeger: building github.com/jaegertracing/jaeger/cmd/jaeger@$version once: long on a small machine (42 min on 2 busy cores with a cold Go build cache, under a minute with a warm one)" >&2
	# Its go.mod has replace directives, so go install pkg@version refuses
	# it; scripts/jaeger/go.mod pins it as a tool instead.
	(cd "$repo/scripts/jaeger" && CGO_ENABLED=0 go build -trimpath -o "$bin" github.com/jaegertracing/jaeger/cmd/jaeger)
	echo "jaeger: built in $((SECONDS - start)) s: $bin" >&2
}

running() {
	[ -f "$dir/pid" ] && ports_alive "$(cat "$dir/pid")"
}

# configure chooses the three ports and writes the configuration with
# them, and the endpoints the tests read.
configure() {
	mkdir -p "$dir"
	local otlp query health
	otlp=$(free_port) || exit 1
	query=$(free_port "$otlp") || exit 1
	health=$(free_port "$otlp" "$query") || exit 1
	cat >"$dir/config.yaml" <<YAML
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: []
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:$health
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:$query
    grpc:
      endpoint: 127.0.0.1:0
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$otlp
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
YAML
	echo "http://127.0.0.1:$otlp" >"$dir/otlp"
	echo "http://127.0.0.1:$query" >"$dir/query"
	echo "http://127.0.0.1:$health/status" >"$dir/health"
}

start() {
	running && return 0
	build
	[ -s "$dir/health" ] || configure
	local attempt lost deadline
	for attempt in 1 2 3 4 5; do
		"$bin" --config "$dir/config.yaml" >"$dir/log" 2>&1 &
		echo $! >"$dir/pid"
		deadline=$((SECONDS + 60))
		until curl -fsS "$(cat "$dir/health")" >/dev/null 2>&1; do
			if ! running; then break; fi
			if [ $SECONDS -ge $deadline ]; then echo "jaeger: not healthy after 60 s; see $dir/log" >&2; exit 1; fi
			sleep 0.2
		done
		running && return 0
		rm -f "$dir/pid"
		if ! lost=$(ports_lost "$dir/log"); then
			tail -20 "$dir/log" >&2
			echo "jaeger: exited at start (its log is above); log: $dir/log" >&2
			exit 1
		fi
		[ "$attempt" -lt 5 ] || { echo "jaeger: lost a port at each of 5 starts, the last: $lost" >&2; exit 1; }
		echo "jaeger: $lost; starting again on new ports" >&2
		configure
	done
}

stop() {
	running || return 0
	local pid
	pid=$(cat "$dir/pid")
	kill "$pid"
	while ports_alive "$pid"; do sleep 0.1; done
	rm -f "$dir/pid"
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
configure) configure ;;
status) running ;;
otlp-endpoint) cat "$dir/otlp" ;;
query-url) cat "$dir/query" ;;
*) echo "usage: $0 build|start|stop|status|configure|otlp-endpoint|query-url" >&2; exit 2 ;;
esac
