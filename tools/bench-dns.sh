#!/usr/bin/env bash
# Benchmarks the gateway's node-name DNS server (gateway/dns) against
# CoreDNS's hosts plugin serving the same names, in the same run, with
# dnsperf from Debian's packages as the load generator (a separate process).
# Everything listens on loopback only.
#
#   tools/bench-dns.sh                 10,000 names, 2 rounds of 10 s per server
#   NODES=1000 SECONDS_PER_RUN=5 ROUNDS=1 tools/bench-dns.sh
#   LATENCY_QPS=0 tools/bench-dns.sh   skip the fixed-rate latency run
#
# Per round, each server gets a saturating run (dnsperf -c CLIENTS -T THREADS
# -q OUTSTANDING, no rate limit) that measures throughput, then a fixed-rate
# run (-Q LATENCY_QPS, -v) whose per-query latencies give p50/p99. Servers
# alternate within a round so that background load hits both alike.
#
# CoreDNS is built from its Go module (pinned in tools/coredns) into
# $TETHER_CACHE_DIR/coredns-<version>/ (default ~/.cache/tether), about
# 4 minutes cold. Needs: go, dnsperf, dig, awk, sort.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
NODES=${NODES:-10000}
ZONE=${ZONE:-tether.internal.}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-4}
THREADS=${THREADS:-2}
OUTSTANDING=${OUTSTANDING:-200}
LATENCY_QPS=${LATENCY_QPS:-20000}
LATENCY_SECONDS=${LATENCY_SECONDS:-5}
OUR_PORT=${OUR_PORT:-25353}
COREDNS_PORT=${COREDNS_PORT:-25354}

say() { printf 'bench-dns: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

for c in go dnsperf dig awk sort; do
	command -v "$c" >/dev/null || die "$c not found (dnsperf: apt-get install -y dnsperf; dig: dnsutils)"
done

coredns_version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$here/coredns/go.mod")
cache=${TETHER_CACHE_DIR:-${HOME:-/root}/.cache/tether}
coredns_dir="$cache/coredns-$coredns_version"
coredns="$coredns_dir/coredns"
mkdir -p "$cache"

# Build CoreDNS once per machine (one builder at a time).
exec 9>"$cache/.coredns.lock"
flock 9
if [ ! -x "$coredns" ]; then
	say "building CoreDNS $coredns_version from its module into $coredns_dir (about 4 minutes cold)"
	start=$SECONDS
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	(cd "$here/coredns" && go build -trimpath -o "$tmp/coredns" github.com/coredns/coredns) ||
		{ rm -rf "$tmp"; die "FAILED to build CoreDNS"; }
	mkdir -p "$coredns_dir"
	mv "$tmp/coredns" "$coredns"
	rm -rf "$tmp"
	say "built CoreDNS in $((SECONDS - start)) s"
fi
flock -u 9

work=$(mktemp -d /tmp/bench-dns.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

for p in "$OUR_PORT" "$COREDNS_PORT"; do
	if ss -Hlun "sport = :$p" | grep -q . || ss -Hltn "sport = :$p" | grep -q .; then
		die "port $p is in use on loopback; set OUR_PORT/COREDNS_PORT"
	fi
done

say "building dnsbench"
(cd "$root" && go build -o "$work/dnsbench" ./tools/dnsbench)
"$work/dnsbench" gen -nodes "$NODES" -zone "$ZONE" -hosts "$work/hosts" -queries "$work/queries"

cat >"$work/Corefile" <<EOF
$ZONE:$COREDNS_PORT {
    bind 127.0.0.1
    hosts $work/hosts {
        ttl 5
        reload 0
        no_reverse
    }
}
EOF

"$work/dnsbench" serve -nodes "$NODES" -zone "$ZONE" -listen "127.0.0.1:$OUR_PORT" 2>"$work/tether.log" &
pids+=($!)
"$coredns" -conf "$work/Corefile" -quiet >"$work/coredns.log" 2>&1 &
pids+=($!)

# Wait until both answer the last name of the set.
last=$(tail -n 1 "$work/queries" | awk '{print $1}')
for port in "$OUR_PORT" "$COREDNS_PORT"; do
	for i in $(seq 100); do
		ans=$(dig +short +time=1 +tries=1 @127.0.0.1 -p "$port" "$last" A 2>/dev/null || true)
		[ -n "$ans" ] && break
		[ "$i" = 100 ] && die "server on port $port does not answer $last (logs in $work)"
		sleep 0.2
	done
done

# field FILE LABEL: the first number after "LABEL:" in a dnsperf report.
field() { awk -v l="$2:" 'i = index($0, l) { s = substr($0, i + length(l)); sub(/^[ \t]+/, "", s); split(s, f, /[ \t]/); print f[1]; exit }' "$1"; }

# run NAME PORT ROUND: one saturating and one fixed-rate dnsperf run.
run() {
	local name=$1 port=$2 round=$3 out="$work/$1.$3"
	say "round $round: $name, ${SECONDS_PER_RUN} s at full rate"
	dnsperf -s 127.0.0.1 -p "$port" -d "$work/queries" -l "$SECONDS_PER_RUN" \
		-c "$CLIENTS" -T "$THREADS" -q "$OUTSTANDING" >"$out.max" 2>&1
	local p50=- p99=-
	if [ "$LATENCY_QPS" != 0 ]; then
		say "round $round: $name, ${LATENCY_SECONDS} s at $LATENCY_QPS qps"
		dnsperf -s 127.0.0.1 -p "$port" -d "$work/queries" -l "$LATENCY_SECONDS" \
			-c "$CLIENTS" -T "$THREADS" -Q "$LATENCY_QPS" -v >"$out.lat" 2>&1
		awk '$1 == ">" {print $NF * 1e6}' "$out.lat" | sort -n >"$out.us"
		local n
		n=$(wc -l <"$out.us")
		if [ "$n" -gt 0 ]; then
			p50=$(sed -n "$(((n + 1) / 2))p" "$out.us")
			p99=$(sed -n "$(((n * 99 + 99) / 100))p" "$out.us")
		fi
	fi
	local avg
	avg=$(field "$out.max" "Average Latency (s)")
	printf '%-8s %5s %10s %10s %8s %10s %9s %9s %9s\n' "$name" "$round" \
		"$(field "$out.max" "Queries sent")" "$(field "$out.max" "Queries completed")" \
		"$(field "$out.max" "Queries lost")" "$(field "$out.max" "Queries per second" | cut -d. -f1)" \
		"$(awk -v a="$avg" 'BEGIN {printf "%.0f", a * 1e6}')" "${p50%.*}" "${p99%.*}" >>"$work/table"
}

say "$NODES names, dnsperf: -c $CLIENTS -T $THREADS -q $OUTSTANDING -l $SECONDS_PER_RUN; latency run: -Q $LATENCY_QPS -l $LATENCY_SECONDS"
for round in $(seq "$ROUNDS"); do
	if [ $((round % 2)) = 1 ]; then
		run tether "$OUR_PORT" "$round"
		run coredns "$COREDNS_PORT" "$round"
	else
		run coredns "$COREDNS_PORT" "$round"
		run tether "$OUR_PORT" "$round"
	fi
done

echo
echo "gateway/dns vs CoreDNS $coredns_version hosts plugin: $NODES names, loopback, $(nproc) CPUs"
echo "full-rate: dnsperf -c $CLIENTS -T $THREADS -q $OUTSTANDING -l $SECONDS_PER_RUN; p50/p99 at -Q $LATENCY_QPS (-v, $LATENCY_SECONDS s)"
printf '%-8s %5s %10s %10s %8s %10s %9s %9s %9s\n' server round sent completed lost qps avg_us p50_us p99_us
sort -k2,2n -k1,1r "$work/table"
echo
awk -v rounds="$ROUNDS" '
	$1 == "tether" { t[$2] = $6; tl[$2] = $5 }
	$1 == "coredns" { c[$2] = $6; cl[$2] = $5 }
	END {
		for (r = 1; r <= rounds; r++) {
			printf "round %d: tether/coredns qps ratio %.2f (lost: tether %d, coredns %d)\n", r, t[r] / c[r], tl[r], cl[r]
			st += t[r]; sc += c[r]
		}
		printf "all rounds: tether/coredns qps ratio %.2f\n", st / sc
	}' "$work/table"
