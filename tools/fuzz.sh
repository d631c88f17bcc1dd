#!/usr/bin/env bash
# fuzz.sh PKG TARGET TIME: go test -fuzz for a bounded time (make fuzz).
#
# Go 1.26's fuzzing coordinator can fail a target with a bare "context
# deadline exceeded" when -fuzztime ends while a worker is mid-input
# (go.dev/issue/75804, fixed in Go 1.27): nothing was found and nothing
# was written. Such a run is repeated once; any other failure, and above
# all one that wrote a failing input, fails at once.
set -uo pipefail
pkg=$1 target=$2 time=$3
for attempt in 1 2; do
	out=$(mktemp)
	"${GO:-go}" test -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -fuzzminimizetime 2s "$pkg" 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	if [ "$rc" -eq 0 ]; then
		rm -f "$out"
		exit 0
	fi
	if [ "$attempt" -eq 1 ] && grep -q '^    context deadline exceeded$' "$out" &&
		! grep -q 'Failing input written' "$out"; then
		echo "fuzz: $target stopped with the coordinator's deadline race (go.dev/issue/75804), nothing found: once more"
		rm -f "$out"
		continue
	fi
	rm -f "$out"
	exit "$rc"
done
