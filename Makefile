# Tether — build, test, demo. Run as root on Debian 12 with Go installed.
#
#   make demo     the tunnel demo: real control plane, a gateway, two edges
#   make demo-tour  the tunnel demo, then service topology, a node pool, kubectl logs
#   make test     everything CI runs (installs what the tests need first)
#   make test-short  the tests that need no root, namespace or control plane

SHELL      := /bin/bash
GO         ?= go
BIN        := bin
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    := -s -w -X github.com/tether-edge/tether/internal/version.Version=$(VERSION)
# Network tests create namespaces and netfilter rules: they need root.
TEST_FLAGS ?= -count=1 -timeout 20m
# Fuzz targets (pkg:Target). `make test` replays their corpora (the seeds
# and every input a campaign ever found, under testdata/fuzz) as unit
# tests, the same on every run; `make fuzz` explores for FUZZ_TIME each and
# is run by hand or on a schedule: an exploration that finds something new
# is a bug report, not a verdict on the change under test.
FUZZ_TIME  ?= 10s
FUZZ       := ./tunnel:FuzzReadRequest ./tunnel:FuzzReadReply ./tunnel:FuzzReadElectionRequest ./tunnel:FuzzReadElectionReply \
              ./tunnel:FuzzServiceRequest \
              ./gateway/dns:FuzzServeDNS ./gateway/proxy:FuzzSniff ./poolstore:FuzzReplicationStream \
              ./internal/localapi:FuzzParseRequest ./edgeproxy/apiproxy:FuzzParseRequest \
              ./edgeproxy/cache:FuzzRecord ./edgeproxy/cache:FuzzResourceInfo ./edgeproxy/cache:FuzzQueuedWrite \
              ./gateway/heartbeat:FuzzParseLease ./gateway/election:FuzzParseConfigMap ./edgeproxy/apiproxy:FuzzOfflineWrite \
              ./internal/boltfile:FuzzOpen
CACHE      ?= $(or $(TETHER_CACHE_DIR),$(HOME)/.cache/tether)
STATICCHECK_VERSION := $(shell awk '$$1 == "require" && $$2 == "honnef.co/go/tools" {print $$3}' tools/lint/go.mod)
STATICCHECK := $(CACHE)/staticcheck-$(STATICCHECK_VERSION)/staticcheck
DEB_PKGS   := iproute2 nftables iptables conntrack curl dnsutils openssl psmisc util-linux ca-certificates \
              rpm podman runc systemd containerd containernetworking-plugins busybox-static

.PHONY: all build test test-short unit e2e fuzz bench lint deps testbins demo clean package image

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# deps installs the Debian packages the tests use (only what is missing).
deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "deps: installing" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: Debian packages present"; fi

# testbins builds kube-apiserver, kube-proxy, kube-controller-manager, etcd, Pebble,
# promtool and Prometheus from their Go modules into ~/.cache/tether (about 15 minutes cold
# on 2 cores, nothing when warm).
testbins:
	@tools/build-testbins.sh >/dev/null

test: deps testbins lint unit e2e

# test-short: the tests that need no root, namespace or control plane, in under 2 minutes.
test-short:
	$(GO) test -short -count=1 ./...

unit:
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v /e2e)

e2e: build
	$(GO) test $(TEST_FLAGS) ./e2e/...

fuzz:
	@for f in $(FUZZ); do pkg=$${f%%:*}; name=$${f##*:}; \
		echo "fuzz: $$name in $$pkg for $(FUZZ_TIME)"; \
		GO=$(GO) tools/fuzz.sh $$pkg $$name $(FUZZ_TIME) || exit 1; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# bench-tunnel measures the tunnel (to the node's address, to a pod's
# address, --pod, and from a pod to a marked cloud Service, --service)
# against a direct connection, bare quic-go
# and Konnectivity (built once by tools/build-konnectivity.sh) in namespaces
# on this machine, on a clean and on shaped WAN links, through a link cut and
# a NAT rebinding (issues 9, 19), and prints tables and a last `wan:` line; it
# writes that text and SVG plots of the head-of-line p99 and the bulk
# throughput per link scenario, Tether beside Konnectivity, into
# tunnelbench-<date>/ (--out). It needs root and takes about 10 minutes.
# BENCH_TUNNEL_FLAGS: see --help (--scenarios, --runs, --wan-time, --pod, --service, --out).
.PHONY: bench-tunnel
BENCH_TUNNEL_FLAGS ?=
bench-tunnel: build testbins
	$(GO) run ./e2e/tunnelbench --bin-dir $(BIN) $(BENCH_TUNNEL_FLAGS)

# soak runs Tether through faults (issue 17): relayed connections and kubelet
# requests through tether-edge while the site's uplink is cut and healed
# every 20 s and tether-edge is killed (SIGKILL) every 2 minutes; then checks
# that no acknowledged status write was lost, that the queue's ledger balances
# across the kills (applied, coalesced, obsolete or rejected; resent counted),
# that goroutines, open files and
# RSS are back within 10 % of their warm level and that no log has a panic.
# Needs root; about 12 minutes. SOAK_FLAGS: see --help.
.PHONY: soak
SOAK_FLAGS ?=
soak: build testbins
	$(GO) run ./e2e/soak --bin-dir $(BIN) $(SOAK_FLAGS)

# bench-pool measures the node pool (10 edges, 1,000 EndpointSlices changed):
# uplink bytes with and without it, replication lag and RSS per node, in
# namespaces on this machine, and a pool of 100 (one tether-edge leading 99
# simulated followers: the leader's CPU and RSS, lag, LAN bytes per
# follower); it prints tables and writes them with an SVG plot of the
# replication lag's distribution into poolbench-<date>/ (--out); it needs
# root and takes a few minutes.
# BENCH_POOL_FLAGS: see --help (--phases members --members 100, --out).
.PHONY: bench-pool
BENCH_POOL_FLAGS ?=
bench-pool: build testbins
	$(GO) run ./e2e/poolbench --bin-dir $(BIN) $(BENCH_POOL_FLAGS)

# bench-kubelet measures one edge node running the kubelet's own code
# (kubemark's hollow node) with 30 pods, through tether-edge and straight to
# kube-apiserver (the baseline, in the same run): requests per minute from
# the node in steady state and after an online restart of the kubelet, as
# kube-apiserver's audit log counts them; tether-edge's RSS and CPU online
# and offline; the seconds from the kubelet's start to all pods running
# after an offline restart (kubelet and tether-edge killed with the uplink
# cut), with and without service-account tokens. It prints tables ending in
# a machine-readable "kubelet:" line and writes them with SVG plots into
# kubeletbench-<date>/ (--out). It needs root and takes about 10 minutes.
# BENCH_KUBELET_FLAGS: see --help (--pods, --steady, --offline-bound, --out).
.PHONY: bench-kubelet
BENCH_KUBELET_FLAGS ?=
bench-kubelet: build testbins
	$(GO) run ./e2e/kubeletbench --bin-dir $(BIN) $(BENCH_KUBELET_FLAGS)

# bench-scale measures one gateway serving a fleet of simulated edges
# (default 10,000): cold start, steady RSS and CPU, routing, restart storm,
# delegated heartbeats, Node churn, 3 replicas (3,000 of the edges), in
# namespaces on this machine, and prints a table ending in a
# machine-readable "scale:" line that names each phase's fleet; it writes
# that text and a plot of edges registered against time (SVG) into
# scalebench-<date>/ (--out). It needs root and takes about 10 minutes
# (--edges 200 for a quick run). BENCH_SCALE_FLAGS: see --help.
.PHONY: bench-scale
BENCH_SCALE_FLAGS ?=
bench-scale: build testbins
	$(GO) run ./e2e/scalebench --bin-dir $(BIN) $(BENCH_SCALE_FLAGS)

# generate writes what is generated from the code: the flag and metric
# tables of docs/reference/ (flags.md, metrics.md) and packaging/config/*.yaml
# (from the flags and the metric registrations; `make unit` fails when they
# differ). The metric table is read from the programs' own registrations:
# it needs root and testbins.
.PHONY: generate
generate: testbins
	$(GO) generate ./...

lint: $(STATICCHECK)
	$(GO) vet ./...
	$(STATICCHECK) ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:" $$unformatted; exit 1; fi

# staticcheck is pinned in tools/lint and built once into the cache.
$(STATICCHECK):
	cd tools/lint && $(GO) build -o $@ honnef.co/go/tools/cmd/staticcheck

# package builds the deb and rpm packages of tether-edge and tether-gateway
# into $(PKG_DIR) with nfpm (pinned in tools/nfpm, built once into
# ~/.cache/tether); the package version is derived from VERSION.
PKG_DIR    ?= $(BIN)/packages
package: build
	@VERSION='$(VERSION)' packaging/build.sh $(BIN) $(PKG_DIR)

# image builds the container images tether-gateway:$(IMAGE_TAG) and
# tether-edge:$(IMAGE_TAG) from packaging/docker/Dockerfile with podman.
IMAGE_TAG  ?= $(VERSION)
image: build
	@for p in tether-gateway tether-edge; do \
		VERSION='$(VERSION)' packaging/docker/build-image.sh $(BIN) $$p $$p:$(IMAGE_TAG) || exit 1; \
	done

demo: build testbins
	$(GO) run ./e2e/demo

# demo-tour goes on after the tunnel: a real kube-proxy behind tether-edge
# (service topology), a node cut from the cloud kept Ready by its pool,
# kubectl logs through kube-apiserver. About a minute; Enter between
# steps; Ctrl-C stops it and cleans up. DEMO_FLAGS=--once runs it through.
.PHONY: demo-tour
DEMO_FLAGS ?=
demo-tour: build testbins
	$(GO) run ./e2e/demo --tour $(DEMO_FLAGS)

clean:
	rm -rf $(BIN)
