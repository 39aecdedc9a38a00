#!/usr/bin/env bash
# Runs a command while CPU burners keep every core busy, the way a shared CI
# machine is: tests that wait on luck (a sleep, a read that races a server
# process) fail here first.
#
#   scripts/burn-cpu.sh go test -run TestHotStandby ./e2e
#
# CDC_OUTBOX_BURNERS sets how many burners run (default: one per core). Each
# is a busy shell loop started here and stopped here by its PID when the
# command ends, whether it passed or not; the command's exit status is kept.
set -euo pipefail

n="${CDC_OUTBOX_BURNERS:-$(nproc)}"
pids=()
stop() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq 1 "$n"); do
	sh -c 'while :; do :; done' &
	pids+=("$!")
done
echo "burn-cpu.sh: $n CPU burners running (pids ${pids[*]})" >&2
"$@"
