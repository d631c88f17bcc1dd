#!/usr/bin/env bash
# Builds the real components Tether's tests run — kube-apiserver, kube-proxy,
# kube-controller-manager, kubectl (it finds tetherctl as its plugin), kubemark
# (the kubelet's own code with a fake runtime), the kubelet, etcd,
# Pebble (the ACME test server), promtool (the alerting rules' unit
# tests), Prometheus (the e2e tests' scraper, without its web UI's assets)
# and helm (the chart's tests) — from their Go modules (pinned in
# tools/kube, tools/etcd, tools/pebble, tools/promtool and tools/helm) into a
# cache directory keyed by version, so a warm machine never rebuilds them.
#
#   tools/build-testbins.sh            build what is missing, print the bin dir
#   TETHER_CACHE_DIR=/x tools/...      cache somewhere else (default ~/.cache/tether)
#
# A cold build takes about 19 minutes on 2 cores; progress is printed to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kube_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/kube/go.mod")
etcd_version=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")
pebble_version=$(awk '$1 == "require" && $2 == "github.com/letsencrypt/pebble/v2" {print $3}' "$here/pebble/go.mod")
# promtool and Prometheus come from the same module, pinned once.
promtool_version=$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3}' "$here/promtool/go.mod")
helm_version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3}' "$here/helm/go.mod")
# helm's own build stamps its version and, from its client-go (v0.X.Y), the
# Kubernetes version 1.X that `helm template` and `helm lint` assume.
helm_k8s_minor=$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$here/helm/go.mod")
cache=${TETHER_CACHE_DIR:-${HOME:-/root}/.cache/tether}
kube_dir="$cache/kube-$kube_version"
etcd_dir="$cache/etcd-$etcd_version"
pebble_dir="$cache/pebble-$pebble_version"
promtool_dir="$cache/promtool-$promtool_version"
prometheus_dir="$cache/prometheus-$promtool_version"
helm_dir="$cache/helm-$helm_version"
mkdir -p "$cache"

say() { printf 'testbins: %s\n' "$*" >&2; }

# build DIR NAME MODULE_DIR PACKAGE HINT [LDFLAGS]: go build PACKAGE as DIR/NAME,
# with a heartbeat every 30 s so a cold build is never silent.
build() {
	local dir=$1 name=$2 moddir=$3 pkg=$4 hint=$5 ldflags=${6:-}
	[ -x "$dir/$name" ] && return 0
	say "building $name from $pkg ($hint) into $dir"
	local start=$SECONDS
	( while sleep 30; do say "  still building $name ($((SECONDS - start)) s)"; done ) &
	local beat=$!
	local tmp
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	if ! (cd "$moddir" && go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg"); then
		kill "$beat" 2>/dev/null || true
		rm -rf "$tmp"
		say "FAILED to build $name"
		return 1
	fi
	kill "$beat" 2>/dev/null || true
	mkdir -p "$dir"
	mv "$tmp/$name" "$dir/$name"
	rm -rf "$tmp"
	say "built $name in $((SECONDS - start)) s"
}

# One builder at a time: test packages running in parallel all call this.
exec 9>"$cache/.lock"
flock 9
build "$etcd_dir" etcd "$here/etcd" go.etcd.io/etcd/server/v3 "about 1 minute cold"
build "$kube_dir" kube-apiserver "$here/kube" k8s.io/kubernetes/cmd/kube-apiserver "about 6 minutes cold on 2 cores"
build "$kube_dir" kube-proxy "$here/kube" k8s.io/kubernetes/cmd/kube-proxy "under a minute once kube-apiserver is built"
build "$kube_dir" kube-controller-manager "$here/kube" k8s.io/kubernetes/cmd/kube-controller-manager "about 2 minutes once kube-apiserver is built"
build "$kube_dir" kubectl "$here/kube" k8s.io/kubernetes/cmd/kubectl "about a minute once kube-apiserver is built"
build "$kube_dir" kubemark "$here/kube" k8s.io/kubernetes/cmd/kubemark "about a minute once kube-apiserver is built"
build "$kube_dir" kubelet "$here/kube" k8s.io/kubernetes/cmd/kubelet "about a minute once kube-apiserver is built"
build "$pebble_dir" pebble "$here/pebble" github.com/letsencrypt/pebble/v2/cmd/pebble "about 30 s cold"
build "$promtool_dir" promtool "$here/promtool" github.com/prometheus/prometheus/cmd/promtool "about 5 minutes cold"
# Without the builtinassets tag: the HTTP API works, the web UI is absent.
build "$prometheus_dir" prometheus "$here/promtool" github.com/prometheus/prometheus/cmd/prometheus "about a minute once promtool is built"
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$helm_version"
for p in chartutil lint/rules; do
	helm_ldflags+=" -X helm.sh/helm/v3/pkg/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$p.k8sVersionMinor=$helm_k8s_minor"
done
build "$helm_dir" helm "$here/helm" helm.sh/helm/v3/cmd/helm "about 3 minutes cold" "$helm_ldflags"

printf 'KUBE_APISERVER=%s\nKUBE_PROXY=%s\nKUBE_CONTROLLER_MANAGER=%s\nKUBECTL=%s\nKUBEMARK=%s\nKUBELET=%s\nETCD=%s\nPEBBLE=%s\nPROMTOOL=%s\nPROMETHEUS=%s\nHELM=%s\n' \
	"$kube_dir/kube-apiserver" "$kube_dir/kube-proxy" "$kube_dir/kube-controller-manager" "$kube_dir/kubectl" "$kube_dir/kubemark" "$kube_dir/kubelet" "$etcd_dir/etcd" "$pebble_dir/pebble" \
	"$promtool_dir/promtool" "$prometheus_dir/prometheus" "$helm_dir/helm"
