#!/usr/bin/env bash
# A local Jaeger (all-in-one, in memory) as the OTLP receiver of the tracing
# tests, built once from its Go module into .local/bin and reused:
#
#   scripts/jaeger.sh build    # go build, only when the binary is missing
#   scripts/jaeger.sh start    # OTLP/HTTP and the query API on free ports
#   scripts/jaeger.sh stop
#   scripts/jaeger.sh otlp-endpoint | query-url
#
# The build is long (a large module graph); CDC_OUTBOX_JAEGER_BIN names a
# binary built elsewhere to skip it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version=v1.76.0 # as in scripts/jaeger/go.mod
dir="$repo/.local/jaeger"
bin="${CDC_OUTBOX_JAEGER_BIN:-$repo/.local/bin/jaeger-$version}"

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

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
	[ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null
}

start() {
	running && return 0
	build
	mkdir -p "$dir"
	local otlp query health
	otlp=$(free_port); query=$(free_port); health=$(free_port)
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
	"$bin" --config "$dir/config.yaml" >"$dir/log" 2>&1 &
	echo $! >"$dir/pid"
	local deadline=$((SECONDS + 60))
	until curl -fsS "http://127.0.0.1:$health/status" >/dev/null 2>&1; do
		if ! running; then echo "jaeger: exited; see $dir/log" >&2; tail -20 "$dir/log" >&2; exit 1; fi
		if [ $SECONDS -ge $deadline ]; then echo "jaeger: not healthy after 60 s; see $dir/log" >&2; exit 1; fi
		sleep 0.2
	done
}

stop() {
	running || return 0
	local pid
	pid=$(cat "$dir/pid")
	kill "$pid"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	rm -f "$dir/pid"
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
status) running ;;
otlp-endpoint) cat "$dir/otlp" ;;
query-url) cat "$dir/query" ;;
*) echo "usage: $0 build|start|stop|status|otlp-endpoint|query-url" >&2; exit 2 ;;
esac
