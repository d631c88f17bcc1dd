package netrules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/internal/testenv"
)

// goldenEdge is the fixed state of the edge golden file: pod ranges of
// both families (one inside another, one with host bits), marked
// Services of both families, unsorted and repeated, and node addresses
// of both families after a loopback and a link-local one (skipped).
var goldenEdge = EdgeDesired{
	PodNets: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.1.64/26"),
		netip.MustParsePrefix("fd00:244:0:1::5/64")},
	Services: []netip.AddrPort{
		netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("10.96.0.10:443"),
		netip.MustParseAddrPort("10.96.12.1:8080"), netip.MustParseAddrPort("10.96.0.10:80"),
		netip.MustParseAddrPort("[fd00:96::10]:80"),
	},
	NodeAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("fe80::1"),
		netip.MustParseAddr("192.168.50.10"), netip.MustParseAddr("fd00:50::10"), netip.MustParseAddr("192.168.50.11")},
	ListenPort: 10271,
}

func mustNormalizeEdge(t testing.TB, d EdgeDesired) *edgeState {
	t.Helper()
	st, err := normalizeEdge(d)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestGoldenEdgeNFT(t *testing.T) {
	checkGolden(t, "edge-nftables.golden", renderEdgeNFT(mustNormalizeEdge(t, goldenEdge)))
}

func TestGoldenEdgeIPTables(t *testing.T) {
	st := mustNormalizeEdge(t, goldenEdge)
	checkGolden(t, "edge-iptables.golden", renderEdgeIPTSave(st, 4))
	checkGolden(t, "edge-ip6tables.golden", renderEdgeIPTSave(st, 6))
}

// Without a node address of a family, pods' connections of that family
// are not redirected (there is no address to dnat to); the node's own
// still are.
func TestRenderEdgeNoNodeAddress(t *testing.T) {
	d := goldenEdge
	d.NodeAddrs = []netip.Addr{netip.MustParseAddr("192.168.50.10")}
	got := renderEdgeNFT(mustNormalizeEdge(t, d))
	if strings.Contains(got, "ip6 saddr") || !strings.Contains(got, "ip saddr @podnets4") ||
		!strings.Contains(got, "ip6 daddr . tcp dport @services6 redirect") {
		t.Errorf("with only an IPv4 node address:\n%s", got)
	}
}

func TestNormalizeEdgeRefuses(t *testing.T) {
	for _, d := range []EdgeDesired{
		{},
		{ListenPort: 1, PodNets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
		{ListenPort: 1, Services: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:0")}},
		{ListenPort: 1, Services: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:80")}},
	} {
		if _, err := normalizeEdge(d); err == nil {
			t.Errorf("normalizeEdge(%+v) accepted", d)
		}
	}
}

// The kernel lists exactly the rendered table; applying the same state
// again writes nothing; a changed state or a table edited by someone
// else is rewritten; Cleanup removes the table and nothing else; a table
// of that name that is not Tether's is left alone.
func TestKernelEdge(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "nr-edge")
	ctx := context.Background()
	var r EdgeRules
	do := func(f func() error) {
		t.Helper()
		if err := h.Do(f); err != nil {
			t.Fatal(err)
		}
	}
	do(func() (err error) { r, err = NewEdge(KindNFTables, Options{Logger: testLogger(t)}); return err })
	list := func() string {
		return sortConcatElements(t, h.Run(t, "nft", "list", "table", "inet", edgeTableName))
	}
	do(func() error { return r.Apply(ctx, goldenEdge) })
	if diff := cmp.Diff(readGolden(t, "edge-nftables.golden"), list()); diff != "" {
		t.Fatalf("kernel listing differs from edge-nftables.golden (-golden +kernel):\n%s", diff)
	}
	handle := h.Run(t, "nft", "-a", "list", "chain", "inet", edgeTableName, "prerouting")
	do(func() error { return r.Apply(ctx, goldenEdge) })
	if got := h.Run(t, "nft", "-a", "list", "chain", "inet", edgeTableName, "prerouting"); got != handle {
		t.Errorf("the same state was written again:\nbefore:\n%s\nafter:\n%s", handle, got)
	}

	changed := goldenEdge
	changed.Services = changed.Services[:1]
	do(func() error { return r.Apply(ctx, changed) })
	if diff := cmp.Diff(renderEdgeNFT(mustNormalizeEdge(t, changed)), list()); diff != "" {
		t.Fatalf("after a change (-want +kernel):\n%s", diff)
	}
	h.Run(t, "nft", "flush", "set", "inet", edgeTableName, "services4")
	do(func() error { return r.Apply(ctx, changed) })
	if diff := cmp.Diff(renderEdgeNFT(mustNormalizeEdge(t, changed)), list()); diff != "" {
		t.Fatalf("after a drift (-want +kernel):\n%s", diff)
	}

	h.Run(t, "nft", "add", "table", "ip", "other")
	do(func() error { return r.Cleanup(ctx) })
	if got := h.Run(t, "nft", "list", "tables"); got != "table ip other\n" {
		t.Errorf("after Cleanup: %q", got)
	}

	// A table of the name that is not Tether's.
	h.Run(t, "nft", "add", "table", "inet", edgeTableName)
	h.Run(t, "nft", "add", "chain", "inet", edgeTableName, "mine")
	var err error
	_ = h.Do(func() error { err = r.Apply(ctx, goldenEdge); return nil })
	if !errors.Is(err, ErrConflict) {
		t.Errorf("Apply over a foreign table: %v, want ErrConflict", err)
	}
	_ = h.Do(func() error { err = r.Cleanup(ctx); return nil })
	if !errors.Is(err, ErrConflict) {
		t.Errorf("Cleanup of a foreign table: %v, want ErrConflict", err)
	}
}

// concatElements matches the elements of a set of address . port.
var concatElements = regexp.MustCompile(`elements = \{ ([^}]* \. [^}]*) \}`)

// sortConcatElements sorts the elements of the address . port sets in an
// nft listing, which lists them in the hash order of the kernel's set.
func sortConcatElements(t *testing.T, listing string) string {
	t.Helper()
	return concatElements.ReplaceAllStringFunc(listing, func(m string) string {
		inner := concatElements.FindStringSubmatch(m)[1]
		var aps []netip.AddrPort
		for e := range strings.SplitSeq(inner, ",") {
			addr, port, ok := strings.Cut(strings.TrimSpace(e), " . ")
			p, err := strconv.ParseUint(port, 10, 16)
			if !ok || err != nil {
				t.Fatalf("element %q", e)
			}
			aps = append(aps, netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(p)))
		}
		slices.SortFunc(aps, netip.AddrPort.Compare)
		var texts []string
		for _, ap := range aps {
			texts = append(texts, fmt.Sprintf("%s . %d", ap.Addr(), ap.Port()))
		}
		return "elements = { " + strings.Join(texts, ",\n\t\t\t     ") + " }"
	})
}

// The hook order on the edge host (docs/proposals/pods-both-ways.md
// §2.2): beside a kube-proxy-like table that DNATs every ClusterIP to an
// endpoint at priority dstnat, the edge table at dstnat - 5 takes a pod's
// connection to a marked ClusterIP and port to the service listener,
// which reads the ClusterIP as the original destination; an unmarked
// ClusterIP, another port of a marked one, and a LAN host's connection to
// the marked one reach kube-proxy's endpoint. The node's own connection
// (a hostNetwork pod) to the marked one reaches the listener too.
//
//	pod ns                  node ns                             lan ns
//	veth 10.244.1.2  <--->  veth 10.244.1.1 (pod range /24)
//	                        lan0 192.168.50.10  <------------>  lan0 192.168.50.20
//	                        :10271 listener ("listener <origdst>")
//	                        :8080  endpoint ("kube-proxy")
//
// kube-proxy's rules come in its three forms: its nftables mode's table,
// and its iptables mode's nat rules through iptables-nft and
// iptables-legacy. nft's nat chains and iptables' share the kernel's list
// of nat hooks, so the edge's nftables table comes first beside each.
//
// The edge's iptables backend, for hosts without nf_tables, is checked
// beside kube-proxy's iptables rules of its own mode, its jumps put
// first in PREROUTING and OUTPUT.
func TestEdgeHookOrder(t *testing.T) {
	for _, mode := range []string{"nftables", "iptables-nft", "iptables-legacy"} {
		t.Run(mode, func(t *testing.T) {
			testEdgeHookOrder(t, mode, func(log *slog.Logger) (EdgeRules, error) { return NewEdge(KindNFTables, Options{Logger: log}) })
		})
	}
	for _, mode := range []string{"nft", "legacy"} {
		t.Run("edge-iptables-"+mode, func(t *testing.T) {
			testEdgeHookOrder(t, "iptables-"+mode, func(log *slog.Logger) (EdgeRules, error) { return newEdgeIPT(log, mode) })
		})
	}
}

func testEdgeHookOrder(t *testing.T, mode string, newRules func(*slog.Logger) (EdgeRules, error)) {
	testenv.RequireRoot(t)
	node, pod, lan := testenv.NewHost(t, "nr-node"), testenv.NewHost(t, "nr-pod"), testenv.NewHost(t, "nr-lan")
	for _, link := range []struct {
		peer *testenv.Host
		name string
	}{{pod, "pod0"}, {lan, "lan0"}} {
		if out, err := exec.Command("ip", "link", "add", link.name, "netns", node.Name, "type", "veth",
			"peer", "name", link.name, "netns", link.peer.Name).CombinedOutput(); err != nil {
			t.Fatalf("veth: %v: %s", err, out)
		}
	}
	for _, step := range []struct {
		h    *testenv.Host
		args string
	}{
		{node, "addr add 10.244.1.1/24 dev pod0"}, {node, "link set pod0 up"},
		{node, "addr add 192.168.50.10/24 dev lan0"}, {node, "link set lan0 up"}, {node, "route add default via 192.168.50.20"},
		{pod, "addr add 10.244.1.2/24 dev pod0"}, {pod, "link set pod0 up"}, {pod, "route add default via 10.244.1.1"},
		{lan, "addr add 192.168.50.20/24 dev lan0"}, {lan, "link set lan0 up"}, {lan, "route add 10.96.0.0/16 via 192.168.50.10"},
	} {
		step.h.Run(t, "ip", strings.Fields(step.args)...)
	}
	if err := node.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	// kube-proxy's part: ClusterIPs to an endpoint at priority dstnat, at
	// prerouting and output.
	var kubeProxyRules func() string
	switch mode {
	case "nftables":
		cmd := node.Command(context.Background(), "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(`table ip kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.0/16 tcp dport 80 dnat to 192.168.50.10:8080
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.0/16 tcp dport 80 dnat to 192.168.50.10:8080
	}
}
`)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy's table: %v: %s", err, out)
		}
		kubeProxyRules = func() string { return node.Run(t, "nft", "list", "table", "ip", "kube-proxy") }
	default:
		for _, chain := range []string{"PREROUTING", "OUTPUT"} {
			node.Run(t, mode, "-t", "nat", "-A", chain, "-d", "10.96.0.0/16", "-p", "tcp", "--dport", "80",
				"-j", "DNAT", "--to-destination", "192.168.50.10:8080")
		}
		kubeProxyRules = func() string {
			save := chainCounters.ReplaceAllString(generated.ReplaceAllString(node.Run(t, mode+"-save", "-t", "nat"), ""), "[0:0]")
			var b strings.Builder
			for line := range strings.Lines(save) {
				if !strings.Contains(line, edgeIPTChainPrefix) { // the edge's own, with its iptables backend
					b.WriteString(line)
				}
			}
			return b.String()
		}
	}
	kubeProxy := kubeProxyRules()
	serve := func(port int, answer func(*net.TCPConn) string) {
		ln, err := node.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					fmt.Fprintln(c, answer(c.(*net.TCPConn)))
				}()
			}
		}()
	}
	serve(10271, func(c *net.TCPConn) string {
		dst, err := OriginalDst(c)
		if err != nil {
			return "error " + err.Error()
		}
		return "listener " + dst.String()
	})
	serve(8080, func(*net.TCPConn) string { return "kube-proxy" })

	ctx := context.Background()
	var r EdgeRules
	if err := node.Do(func() (err error) {
		if r, err = newRules(testLogger(t)); err != nil {
			return err
		}
		return r.Apply(ctx, EdgeDesired{
			PodNets:    []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
			Services:   []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:80")},
			NodeAddrs:  []netip.Addr{netip.MustParseAddr("192.168.50.10")},
			ListenPort: 10271,
		})
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from *testenv.Host
		dst  string
		want string
	}{
		{pod, "10.96.0.10:80", "listener 10.96.0.10:80"},
		{node, "10.96.0.10:80", "listener 10.96.0.10:80"},
		{pod, "10.96.0.11:80", "kube-proxy"},
		{node, "10.96.0.11:80", "kube-proxy"},
		{lan, "10.96.0.10:80", "kube-proxy"},
	} {
		if got := ask(t, tc.from, netip.MustParseAddrPort(tc.dst)); got != tc.want {
			t.Errorf("%s from %s: %q, want %q", tc.dst, tc.from.Label, got, tc.want)
		}
	}
	if got := kubeProxyRules(); got != kubeProxy {
		t.Errorf("kube-proxy's table changed:\n%s", cmp.Diff(kubeProxy, got))
	}
	if err := node.Do(func() error { return r.Cleanup(ctx) }); err != nil {
		t.Fatal(err)
	}
	if got := ask(t, pod, netip.MustParseAddrPort("10.96.0.10:80")); got != "kube-proxy" {
		t.Errorf("after Cleanup, the marked ClusterIP from the pod: %q, want kube-proxy's endpoint", got)
	}
}

// The iptables backend on the kernel, legacy and nft-compat: the lines
// iptables-save prints are the golden ones, its jumps stay first in
// PREROUTING and OUTPUT when kube-proxy inserts its own at the top
// later, a chain edited by someone else is rewritten, Cleanup leaves
// nothing, and a rule in its chain that is not Tether's is left alone.
func TestKernelEdgeIPTables(t *testing.T) {
	for _, mode := range []string{"nft", "legacy"} {
		t.Run(mode, func(t *testing.T) {
			testenv.RequireRoot(t)
			h := testenv.NewHost(t, "nr-edge-ipt")
			ctx := context.Background()
			var r EdgeRules
			do := func(f func() error) {
				t.Helper()
				if err := h.Do(f); err != nil {
					t.Fatal(err)
				}
			}
			do(func() (err error) { r, err = newEdgeIPT(testLogger(t), mode); return err })
			save := func(family string) string {
				return h.Run(t, family+"-"+mode+"-save", "-t", "nat")
			}
			list := func() string { return edgeSaveLines(save("iptables")) + edgeSaveLines(save("ip6tables")) }
			golden := readGolden(t, "edge-iptables.golden") + readGolden(t, "edge-ip6tables.golden")
			do(func() error { return r.Apply(ctx, goldenEdge) })
			if diff := cmp.Diff(golden, list()); diff != "" {
				t.Fatalf("kernel differs from the golden files (-golden +kernel):\n%s", diff)
			}

			// kube-proxy starts later and puts its jump first.
			for _, chain := range []string{"PREROUTING", "OUTPUT"} {
				h.Run(t, "iptables-"+mode, "-t", "nat", "-N", "KUBE-SERVICES-"+chain)
				h.Run(t, "iptables-"+mode, "-t", "nat", "-I", chain, "1", "-j", "KUBE-SERVICES-"+chain)
			}
			do(func() error { return r.Apply(ctx, goldenEdge) })
			if _, first := edgeJumps(save("iptables")); !first {
				t.Errorf("the edge's jumps are not first after kube-proxy's:\n%s", save("iptables"))
			}
			if !strings.Contains(save("iptables"), "-j KUBE-SERVICES-PREROUTING") {
				t.Errorf("kube-proxy's jump is gone:\n%s", save("iptables"))
			}
			h.Run(t, "iptables-"+mode, "-t", "nat", "-F", edgeIPTChainServices)
			do(func() error { return r.Apply(ctx, goldenEdge) })
			if diff := cmp.Diff(golden, list()); diff != "" {
				t.Fatalf("after kube-proxy and a flush (-golden +kernel):\n%s", diff)
			}

			do(func() error { return r.Cleanup(ctx) })
			if got := list(); got != "" {
				t.Errorf("after Cleanup:\n%s", got)
			}

			h.Run(t, "iptables-"+mode, "-t", "nat", "-N", edgeIPTChainServices)
			h.Run(t, "iptables-"+mode, "-t", "nat", "-A", edgeIPTChainServices, "-j", "RETURN")
			var err error
			_ = h.Do(func() error { err = r.Apply(ctx, goldenEdge); return nil })
			if !errors.Is(err, ErrConflict) {
				t.Errorf("Apply over a foreign rule: %v, want ErrConflict", err)
			}
		})
	}
}
