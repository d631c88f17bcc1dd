package netrules

// Benchmarks, each in a fresh network namespace (root only):
//
//	go test ./netrules -run '^$' -bench . -benchtime=1x
//
// -benchtime=1x keeps BenchmarkYurtTunnelWay to one pass, which costs one
// iptables exec per rule (about 5 ms each, more as the table grows); it
// applies -yurt.rules rules (default 1500, the first 500 nodes) and
// reports the per-rule cost and the linear extrapolation to all 30,000
// rules, which understates the real figure since each exec slows as the
// table grows. Pass -yurt.rules=30000 for the real thing (minutes).

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/tether-edge/tether/internal/testenv"
	"golang.org/x/sys/unix"
)

const benchNodes = 10000

var benchPorts = []uint16{10250, 10255, 9100}

var yurtRules = flag.Int("yurt.rules", 1500, "rules BenchmarkYurtTunnelWay applies (one iptables exec each)")

// benchDesired returns n edge nodes with one IPv4 address each, and 3
// proxied ports.
func benchDesired(n int) Desired {
	d := Desired{Edges: make(map[string][]netip.Addr, n), Ports: benchPorts, ProxyPort: 10263}
	for i := range n {
		d.Edges[fmt.Sprintf("edge-%05d", i)] = []netip.Addr{netip.AddrFrom4([4]byte{10, 64 + byte(i>>16), byte(i >> 8), byte(i)})}
	}
	return d
}

// benchDesiredPods returns benchDesired(n) with a pod range per node: a
// /24 each, and a /64 for every other node. Ranges are one apart, not
// adjacent (the nftables backend merges adjacent ones into one
// interval), so the sets hold two elements per range, their most.
func benchDesiredPods(n int) Desired {
	d := benchDesired(n)
	d.PodRanges = make(map[string][]netip.Prefix, n)
	for i := range n {
		j := 2 * i
		r := []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + byte(j>>8), byte(j), 0}), 24)}
		if i%2 == 0 {
			r = append(r, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, byte(j >> 8), byte(j)}), 64))
		}
		d.PodRanges[fmt.Sprintf("edge-%05d", i)] = r
	}
	return d
}

// benchBackends make each backend inside the benchmark's namespace.
var benchBackends = []struct {
	name string
	new  func() (Rules, error)
}{
	{"nftables", func() (Rules, error) { return newNFTRules(slog.New(slog.DiscardHandler)) }},
	{"iptables-nft", func() (Rules, error) { return newIPTRules(slog.New(slog.DiscardHandler), "nft") }},
	{"iptables-legacy", func() (Rules, error) { return newIPTRules(slog.New(slog.DiscardHandler), "legacy") }},
}

// benchHost makes a namespace and the backend in it.
func benchHost(b *testing.B, newRules func() (Rules, error)) (*testenv.Host, Rules) {
	testenv.RequireRoot(b)
	h := testenv.NewHost(b, "nr-bench")
	var r Rules
	if err := h.Do(func() (err error) { r, err = newRules(); return err }); err != nil {
		b.Fatal(err)
	}
	return h, r
}

func benchDo(b *testing.B, h *testenv.Host, fn func() error) {
	if err := h.Do(fn); err != nil {
		b.Fatal(err)
	}
}

// cpuMeter adds up the CPU time (user and system, of this process and of
// the commands it ran) of the timed part of a benchmark, reported as
// cpu-ms/op: unlike ns/op, it does not grow when other processes share
// the CPUs.
type cpuMeter struct{ total time.Duration }

func cpuNow() time.Duration {
	var d time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if err := unix.Getrusage(who, &ru); err == nil {
			d += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return d
}

// do runs fn in h as benchDo does, counting its CPU time.
func (m *cpuMeter) do(b *testing.B, h *testenv.Host, fn func() error) {
	start := cpuNow()
	benchDo(b, h, fn)
	m.total += cpuNow() - start
}

func (m *cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(m.total.Microseconds())/1000/float64(b.N), "cpu-ms/op")
}

// BenchmarkFullSync applies 10,000 nodes × 3 ports to a namespace without
// rules: the gateway's first Apply.
func BenchmarkFullSync(b *testing.B) {
	d := benchDesired(benchNodes)
	ctx := context.Background()
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			h, r := benchHost(b, be.new)
			var cpu cpuMeter
			for range b.N {
				b.StopTimer()
				benchDo(b, h, func() error { return r.Cleanup(ctx) })
				b.StartTimer()
				cpu.do(b, h, func() error { return r.Apply(ctx, d) })
			}
			cpu.report(b)
		})
	}
}

// BenchmarkResync rewrites all 10,000 nodes × 3 ports over an existing
// ruleset: the Apply after a failure or after someone flushed our rules.
func BenchmarkResync(b *testing.B) {
	d := benchDesired(benchNodes)
	ctx := context.Background()
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			h, r := benchHost(b, be.new)
			benchDo(b, h, func() error { return r.Apply(ctx, d) })
			var cpu cpuMeter
			for range b.N {
				b.StopTimer()
				switch r := r.(type) {
				case *nftRules:
					r.needFull = true
				case *iptRules:
					h.Run(b, "iptables-"+r.mode, "-t", "nat", "-F", iptChainEdges)
				}
				b.StartTimer()
				cpu.do(b, h, func() error { return r.Apply(ctx, d) })
			}
			cpu.report(b)
		})
	}
}

// BenchmarkOneNode adds one node to 10,000, or removes one: the gateway's
// Apply on a node change. The conntrack flush a removal calls for is not
// part of Apply (see BenchmarkConntrackFlush); it runs untimed between
// iterations.
func BenchmarkOneNode(b *testing.B) {
	all, less := benchOneLess()
	ctx := context.Background()
	for _, be := range benchBackends {
		for _, op := range []struct {
			name     string
			from, to Desired
		}{{"add", less, all}, {"remove", all, less}} {
			b.Run(be.name+"/"+op.name, func(b *testing.B) {
				h, r := benchHost(b, be.new)
				var cpu cpuMeter
				for range b.N {
					b.StopTimer()
					benchDo(b, h, func() error { return r.Apply(ctx, op.from) })
					benchDo(b, h, func() error { return r.FlushConntrack(ctx) })
					b.StartTimer()
					cpu.do(b, h, func() error { return r.Apply(ctx, op.to) })
				}
				cpu.report(b)
			})
		}
	}
}

// BenchmarkConntrackFlush is the FlushConntrack after one node of 10,000
// was removed: one walk of the kernel's conntrack table per family the
// removed addresses belong to (here IPv4). "flush" times the flush alone,
// "remove+flush" the removing Apply and the flush, as gateway/dnat runs
// them. The backend does not matter for the flush; nftables is used.
func BenchmarkConntrackFlush(b *testing.B) {
	all, less := benchOneLess()
	ctx := context.Background()
	for _, withApply := range []bool{false, true} {
		name := "flush"
		if withApply {
			name = "remove+flush"
		}
		b.Run(name, func(b *testing.B) {
			h, r := benchHost(b, benchBackends[0].new)
			var cpu cpuMeter
			for range b.N {
				b.StopTimer()
				benchDo(b, h, func() error { return r.Apply(ctx, all) })
				if !withApply {
					benchDo(b, h, func() error { return r.Apply(ctx, less) })
				}
				b.StartTimer()
				cpu.do(b, h, func() error {
					if withApply {
						if err := r.Apply(ctx, less); err != nil {
							return err
						}
					}
					return r.FlushConntrack(ctx)
				})
			}
			cpu.report(b)
		})
	}
}

// benchOneLess returns the 10,000 benchmark nodes, and the same less one.
func benchOneLess() (all, less Desired) {
	return oneLess(benchDesired(benchNodes))
}

// oneLess returns all, and all without one of its nodes.
func oneLess(all Desired) (_, less Desired) {
	less = all
	less.Edges = maps.Clone(all.Edges)
	delete(less.Edges, "edge-04242")
	less.PodRanges = maps.Clone(all.PodRanges)
	delete(less.PodRanges, "edge-04242")
	return all, less
}

// BenchmarkPodRanges is BenchmarkFullSync and BenchmarkOneNode with pod
// ranges: 10,000 nodes, each with one IPv4 address and a /24, half of
// them also with a /64 (benchDesiredPods); 15,000 ranges in all.
func BenchmarkPodRanges(b *testing.B) {
	all, less := oneLess(benchDesiredPods(benchNodes))
	ctx := context.Background()
	for _, be := range benchBackends {
		b.Run("FullSync/"+be.name, func(b *testing.B) {
			h, r := benchHost(b, be.new)
			var cpu cpuMeter
			for range b.N {
				b.StopTimer()
				benchDo(b, h, func() error { return r.Cleanup(ctx) })
				b.StartTimer()
				cpu.do(b, h, func() error { return r.Apply(ctx, all) })
			}
			cpu.report(b)
		})
		for _, op := range []struct {
			name     string
			from, to Desired
		}{{"add", less, all}, {"remove", all, less}} {
			b.Run("OneNode/"+be.name+"/"+op.name, func(b *testing.B) {
				h, r := benchHost(b, be.new)
				var cpu cpuMeter
				for range b.N {
					b.StopTimer()
					benchDo(b, h, func() error { return r.Apply(ctx, op.from) })
					benchDo(b, h, func() error { return r.FlushConntrack(ctx) })
					b.StartTimer()
					cpu.do(b, h, func() error { return r.Apply(ctx, op.to) })
				}
				cpu.report(b)
			})
		}
	}
}

// BenchmarkYurtTunnelWay applies the same nodes the way yurt-tunnel does:
// one `iptables -t nat -A` exec per node and port. See the top of the
// file for why it stops at -yurt.rules rules.
func BenchmarkYurtTunnelWay(b *testing.B) {
	testenv.RequireRoot(b)
	h := testenv.NewHost(b, "nr-bench-yurt")
	d := benchDesired(benchNodes)
	st, err := normalize(d)
	if err != nil {
		b.Fatal(err)
	}
	var rules [][]string
	for _, a := range st.v4 {
		for _, p := range st.ports {
			rules = append(rules, []string{"-p", "tcp", "-d", a.String() + "/32", "--dport", fmt.Sprint(p),
				"-j", "DNAT", "--to-destination", fmt.Sprintf("127.0.0.1:%d", st.proxyPort)})
		}
	}
	n := min(*yurtRules, len(rules))
	var ipt *iptables.IPTables
	benchDo(b, h, func() (err error) { ipt, err = iptables.New(); return err })
	var elapsed time.Duration
	var cpu cpuMeter
	for range b.N {
		b.StopTimer()
		benchDo(b, h, func() error { return ipt.ClearChain("nat", "TUNNEL-PORT") })
		b.StartTimer()
		start := time.Now()
		cpu.do(b, h, func() error {
			for _, r := range rules[:n] {
				if err := ipt.Append("nat", "TUNNEL-PORT", r...); err != nil {
					return err
				}
			}
			return nil
		})
		elapsed += time.Since(start)
	}
	perRule := elapsed / time.Duration(b.N*n)
	b.ReportMetric(float64(perRule.Microseconds())/1000, "ms/rule")
	b.ReportMetric((perRule * time.Duration(len(rules))).Seconds(), "s/30000-rules-extrapolated")
	b.ReportMetric(float64(n), "rules")
	cpu.report(b)
}
