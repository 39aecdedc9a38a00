#!/usr/bin/env bash
# Runs a test command against PostgreSQL of each major version given, one
# after the other, and says per version how many tests ran, passed and
# failed, and how long it took:
#
#   scripts/test-versions.sh "14 16 17 18" go test -v -run TestEndToEnd ./e2e
#   scripts/test-versions.sh current go test -v ./e2e
#
# For each major it runs the command against a fresh cluster of that version
# (scripts/postgres.sh with PG_VERSION: destroyed, started, its address and
# control script exported as CDC_OUTBOX_TEST_POSTGRES_URL and
# CDC_OUTBOX_TEST_POSTGRES_CTL, and destroyed again afterwards, its log kept
# in .local/test-versions/<major>.postgres.log), so the versions never share
# state. `current` runs it once against the server the
# environment names already. Kafka is the environment's
# (scripts/with-servers.sh). The counts come from the lines `go test -v`
# prints for each test and subtest ("--- PASS: ..."). It exits non-zero if the
# command failed for any version, after running all of them.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 \"14 16 17 18\"|current command..." >&2; exit 2; }
versions=$1
shift
logs="${CDC_OUTBOX_LOCAL:-$repo/.local}/test-versions"
mkdir -p "$logs"

summaries=()
failed=0

# run runs the command once, teeing its output to a log, and adds the
# summary line for the server it ran against.
run() {
	local name=$1 log="$logs/$1.log" began status server
	began=$(date +%s)
	set +e
	"${@:2}" 2>&1 | tee "$log"
	status=${PIPESTATUS[0]}
	set -e
	server=$("$repo/scripts/postgres.sh" version 2>/dev/null | awk '{print $3}' || true)
	local secs=$(($(date +%s) - began)) pass fail skip
	pass=$(grep -cE '^ *--- PASS' "$log" || true)
	fail=$(grep -cE '^ *--- FAIL' "$log" || true)
	skip=$(grep -cE '^ *--- SKIP' "$log" || true)
	local verdict=ok
	if [ "$status" != 0 ]; then
		verdict="FAILED (exit $status)"
		failed=1
	fi
	summaries+=("$(printf 'PostgreSQL %-6s %4d tests: %4d passed, %d failed, %d skipped, in %dm%02ds: %s' \
		"${server:-$name}" $((pass + fail + skip)) "$pass" "$fail" "$skip" $((secs / 60)) $((secs % 60)) "$verdict")")
	echo "test-versions.sh: ${summaries[-1]}"
}

if [ "$versions" = current ]; then
	run current "$@"
else
	for v in $versions; do
		export PG_VERSION=$v
		"$repo/scripts/deps.sh"
		"$repo/scripts/postgres.sh" destroy
		"$repo/scripts/postgres.sh" start
		CDC_OUTBOX_TEST_POSTGRES_URL=$("$repo/scripts/postgres.sh" url)
		export CDC_OUTBOX_TEST_POSTGRES_URL CDC_OUTBOX_TEST_POSTGRES_CTL="$repo/scripts/postgres.sh"
		run "$v" "$@"
		# The server's log outlives its cluster, for a failure to be read.
		"$repo/scripts/postgres.sh" logs >"$logs/$v.postgres.log" 2>&1 || true
		"$repo/scripts/postgres.sh" destroy
	done
fi

echo "test-versions.sh: summary"
printf '  %s\n' "${summaries[@]}"
exit "$failed"
