#!/usr/bin/env bash
# Builds nfpm, the deb/rpm packager `make package` runs, from its Go module
# (pinned in tools/nfpm) into a cache directory keyed by version, and prints
# the binary's path. A warm machine never rebuilds it.
#
#   tools/build-nfpm.sh                 build if missing, print the path
#   TETHER_CACHE_DIR=/x tools/...       cache somewhere else (default ~/.cache/tether)
#
# About a minute cold on 2 cores; progress is printed to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "github.com/goreleaser/nfpm/v2" {print $3}' "$here/nfpm/go.mod")
cache=${TETHER_CACHE_DIR:-${HOME:-/root}/.cache/tether}
dir="$cache/nfpm-$version"
mkdir -p "$cache"

if [ ! -x "$dir/nfpm" ]; then
	# One builder at a time (test packages may call this in parallel).
	exec 9>"$cache/.lock-nfpm"
	flock 9
	if [ ! -x "$dir/nfpm" ]; then
		printf 'nfpm: building nfpm %s into %s (about a minute cold)\n' "$version" "$dir" >&2
		tmp=$(mktemp -d "$cache/.build.XXXXXX")
		trap 'rm -rf "$tmp"' EXIT
		(cd "$here/nfpm" && go build -trimpath -o "$tmp/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm)
		mkdir -p "$dir"
		mv "$tmp/nfpm" "$dir/nfpm"
	fi
fi
printf '%s\n' "$dir/nfpm"
