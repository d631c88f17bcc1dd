#!/usr/bin/env bash
# Builds Konnectivity (apiserver-network-proxy) — proxy-server and
# proxy-agent, the tunnel `make bench-tunnel` measures Tether against — from
# its Go module (pinned in tools/konnectivity) into a cache directory keyed by
# version, and prints the directory. A warm machine never rebuilds them. Only
# the bench needs them: the test binaries (tools/build-testbins.sh) do not
# include them.
#
#   tools/build-konnectivity.sh          build what is missing, print the dir
#   TETHER_CACHE_DIR=/x tools/...        cache somewhere else (default ~/.cache/tether)
#
# About a minute cold on 2 cores; progress is printed to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/apiserver-network-proxy" {print $3}' "$here/konnectivity/go.mod")
cache=${TETHER_CACHE_DIR:-${HOME:-/root}/.cache/tether}
dir="$cache/konnectivity-$version"
mkdir -p "$cache"

if [ ! -x "$dir/proxy-server" ] || [ ! -x "$dir/proxy-agent" ]; then
	# One builder at a time.
	exec 9>"$cache/.lock-konnectivity"
	flock 9
	for b in server:proxy-server agent:proxy-agent; do
		pkg=${b%%:*} name=${b##*:}
		[ -x "$dir/$name" ] && continue
		printf 'konnectivity: building %s %s into %s (about a minute cold)\n' "$name" "$version" "$dir" >&2
		tmp=$(mktemp -d "$cache/.build.XXXXXX")
		trap 'rm -rf "$tmp"' EXIT
		(cd "$here/konnectivity" && go build -trimpath -o "$tmp/$name" "sigs.k8s.io/apiserver-network-proxy/cmd/$pkg")
		mkdir -p "$dir"
		mv "$tmp/$name" "$dir/$name"
		rm -rf "$tmp"
	done
fi
printf '%s\n' "$dir"
