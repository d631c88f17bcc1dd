package netrules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tether-edge/tether/internal/testenv"
)

// backendCase is one backend as the kernel tests drive it. Every function
// that touches the kernel runs in the lab's gateway namespace.
type backendCase struct {
	name string
	// new makes the backend (in the gateway namespace).
	new func(*slog.Logger) (Rules, error)
	// mode is the iptables mode whose commands the case's foreign rules
	// and listings use.
	mode string
	// list returns what the kernel holds of ours, as the golden files
	// spell it; render returns what it should be for st.
	list   func(t *testing.T, l *lab) string
	render func(st *state) string
	golden []string // golden files whose concatenation render gives for goldenDesired
	// drifts are edits someone else might make to our rules.
	drifts [][]string
}

var backendCases = []backendCase{
	{
		name: "nftables",
		new:  func(log *slog.Logger) (Rules, error) { return New(KindNFTables, Options{Logger: log}) },
		mode: "nft",
		list: func(t *testing.T, l *lab) string {
			// Not Run: a missing table is an answer here.
			out, _ := l.gw.Command(context.Background(), "nft", "list", "table", "inet", nftTableName).CombinedOutput()
			return string(out)
		},
		render: renderNFT,
		golden: []string{"nftables.golden"},
		drifts: [][]string{
			{"nft", "flush", "table", "inet", "tether"},
			{"nft", "delete", "table", "inet", "tether"},
			{"nft", "delete", "element", "inet", "tether", "edges4", "{ 10.20.0.6 }"},
			{"nft", "add", "element", "inet", "tether", "edges6", "{ fd00:20::77 }"},
			{"nft", "delete", "chain", "inet", "tether", "output"},
			{"nft", "delete", "element", "inet", "tether", "pods4", "{ 10.244.5.0/24 }"},
			{"nft", "add", "element", "inet", "tether", "pods6", "{ fd00:244:0:7::/64 }"},
		},
	},
	iptCase("nft"),
	iptCase("legacy"),
}

func iptCase(mode string) backendCase {
	return backendCase{
		name: "iptables-" + mode,
		new:  func(log *slog.Logger) (Rules, error) { return newIPTRules(log, mode) },
		mode: mode,
		list: func(t *testing.T, l *lab) string {
			return ourSaveLines(l.gw.Run(t, "iptables-"+mode+"-save", "-t", "nat")) +
				ourSaveLines(l.gw.Run(t, "ip6tables-"+mode+"-save", "-t", "nat"))
		},
		render: func(st *state) string { return renderIPTSave(st, 4) + renderIPTSave(st, 6) },
		golden: []string{"iptables.golden", "ip6tables.golden"},
		drifts: [][]string{
			{"iptables-" + mode, "-t", "nat", "-F", iptChainEdges},
			{"iptables-" + mode, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "tether: routed edge traffic", "-j", iptChainPrerouting},
			{"ip6tables-" + mode, "-t", "nat", "-I", "OUTPUT", "-m", "comment", "--comment", "tether: local edge traffic", "-j", iptChainOutput},
			{"ip6tables-" + mode, "-t", "nat", "-A", iptChainEdges, "-d", "fd00:20::77", "-j", "RETURN"},
			{"iptables-" + mode, "-t", "nat", "-F", iptChainPods},
			{"ip6tables-" + mode, "-t", "nat", "-D", iptChainOutput, "-p", "tcp", "-m", "comment", "--comment", "tether: pod ranges", "-j", iptChainPods},
		},
	}
}

// addForeignRules installs rules like kube-proxy's and Docker's: a table
// ip kube-proxy in nftables, and KUBE-SERVICES and DOCKER chains in
// iptables of the given mode, jumped to from PREROUTING and OUTPUT.
func addForeignRules(t *testing.T, l *lab, mode string) {
	t.Helper()
	cmd := l.gw.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(`table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		elements = { 10.96.0.1 }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain services {
		ip daddr 10.96.0.1 tcp dport 443 dnat to 10.99.0.2:6443
	}
}
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	for _, ipt := range []string{"iptables-" + mode, "ip6tables-" + mode} {
		for _, args := range []string{
			"-t nat -N KUBE-SERVICES",
			"-t nat -A PREROUTING -m comment --comment kubernetes-service-portals -j KUBE-SERVICES",
			"-t nat -A OUTPUT -m comment --comment kubernetes-service-portals -j KUBE-SERVICES",
			"-t nat -N DOCKER",
			"-t nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER",
			"-t nat -A DOCKER -i docker0 -j RETURN",
		} {
			l.gw.Run(t, ipt, strings.Fields(args)...)
		}
	}
}

// foreignRules returns the rules addForeignRules installed, as listed now.
func foreignRules(t *testing.T, l *lab, mode string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(l.gw.Run(t, "nft", "list", "table", "ip", "kube-proxy"))
	for _, cmd := range []string{"iptables-" + mode + "-save", "ip6tables-" + mode + "-save"} {
		for line := range strings.Lines(l.gw.Run(t, cmd, "-t", "nat")) {
			if strings.Contains(line, "KUBE-") || strings.Contains(line, "DOCKER") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// conntrackEntries counts the conntrack entries of TCP connections to dst
// in the gateway namespace: those redirected to the transparent listener
// (replies from labProxyPort) and those that went to dst directly.
func conntrackEntries(t *testing.T, l *lab, dst netip.AddrPort) (redirected, direct int) {
	t.Helper()
	out := l.gw.Run(t, "conntrack", "-L", "-p", "tcp", "--orig-dst", dst.Addr().String(), "--dport", fmt.Sprint(dst.Port()))
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "tcp") {
			continue
		}
		// The second sport= is the reply's source port.
		var sports []string
		for _, f := range strings.Fields(line) {
			if p, ok := strings.CutPrefix(f, "sport="); ok {
				sports = append(sports, p)
			}
		}
		if len(sports) == 2 && sports[1] == fmt.Sprint(labProxyPort) {
			redirected++
		} else {
			direct++
		}
	}
	return redirected, direct
}

// hostTetherLines returns what the test process's own namespace holds of
// Tether's, read only, to show that the tests never write there.
func hostTetherLines(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, _ := exec.Command(cmd, "-t", "nat").Output()
		b.WriteString(ourSaveLines(string(out)))
	}
	out, _ := exec.Command("nft", "list", "tables").Output()
	b.WriteString(string(out))
	return b.String()
}

func TestKernel(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			testBackend(t, bc)
		})
	}
}

func testBackend(t *testing.T, bc backendCase) {
	l := newLab(t)
	ctx := context.Background()
	addForeignRules(t, l, bc.mode)
	before := l.snapshot(t)
	foreign := foreignRules(t, l, bc.mode)
	host := hostTetherLines(t)

	var r Rules
	l.do(t, func() (err error) { r, err = bc.new(testLogger(t)); return err })
	apply := func(d Desired) {
		t.Helper()
		l.do(t, func() error { return r.Apply(ctx, d) })
	}
	expectListed := func(d Desired) {
		t.Helper()
		if diff := cmp.Diff(bc.render(mustNormalize(t, d)), bc.list(t, l)); diff != "" {
			t.Fatalf("kernel holds (-want +got):\n%s", diff)
		}
	}

	// The kernel lists exactly the golden text.
	apply(goldenDesired)
	got := bc.list(t, l)
	var golden strings.Builder
	for _, g := range bc.golden {
		golden.WriteString(readGolden(t, g))
	}
	if diff := cmp.Diff(golden.String(), got); diff != "" {
		t.Fatalf("kernel listing differs from %v (-golden +kernel):\n%s", bc.golden, diff)
	}
	if got := hostTetherLines(t); got != host {
		t.Errorf("the test process's own namespace changed:\nbefore:\n%s\nafter:\n%s", host, got)
	}

	// Routed and local clients reach the listener, which reads the
	// original destination; other ports are not redirected.
	for _, dst := range []string{"10.20.0.5:10250", "[fd00:20::5]:10255", "192.168.7.10:8080", "[fd00:20::1:9]:10250", "10.20.1.1:10250", "10.20.0.6:10250"} {
		l.expectRedirected(t, ap(dst))
	}
	l.expectDirect(t, ap("10.20.0.5:10251"))
	l.expectDirect(t, ap("[fd00:20::5]:10251"))
	if got := foreignRules(t, l, bc.mode); got != foreign {
		t.Errorf("foreign rules changed (-before +after):\n%s", cmp.Diff(foreign, got))
	}

	// Applying the same state again changes nothing.
	apply(goldenDesired)
	expectListed(goldenDesired)

	// A removed node is no longer redirected. Apply leaves the conntrack
	// entries of its redirected connections to FlushConntrack, which
	// deletes them and only them: the entries of direct connections made
	// in between stay.
	if n, _ := conntrackEntries(t, l, ap("10.20.0.5:10250")); n == 0 {
		t.Fatal("no conntrack entries for 10.20.0.5 before removing edge-a")
	}
	d := goldenDesired
	d.Edges = maps.Clone(d.Edges)
	delete(d.Edges, "edge-a")
	apply(d)
	expectListed(d)
	if n, _ := conntrackEntries(t, l, ap("10.20.0.5:10250")); n == 0 {
		t.Error("Apply flushed the conntrack entries of 10.20.0.5 itself; FlushConntrack should")
	}
	l.expectDirect(t, ap("10.20.0.5:10250"))
	l.expectDirect(t, ap("[fd00:20::5]:10255"))
	l.do(t, func() error { return r.FlushConntrack(ctx) })
	for _, dst := range []netip.AddrPort{ap("10.20.0.5:10250"), ap("[fd00:20::5]:10255")} {
		redirected, direct := conntrackEntries(t, l, dst)
		if redirected != 0 {
			t.Errorf("%d conntrack entries of redirected connections to %v left after FlushConntrack", redirected, dst)
		}
		if direct == 0 {
			t.Errorf("FlushConntrack deleted the entries of direct connections to %v", dst)
		}
	}
	l.expectRedirected(t, ap("10.20.0.6:10250"))

	// Drift: whatever someone else did to our rules, the next Apply repairs.
	for _, edit := range bc.drifts {
		l.gw.Run(t, edit[0], edit[1:]...)
		if diff := cmp.Diff(bc.render(mustNormalize(t, d)), bc.list(t, l)); diff == "" {
			t.Fatalf("%v changed nothing", edit)
		}
		apply(d)
		expectListed(d)
	}
	l.expectRedirected(t, ap("10.20.0.6:10250"))
	l.expectRedirected(t, ap("[fd00:20::1:9]:10255"))

	// Cleanup leaves the ruleset as it found it, and flushes the entries
	// of what it redirected.
	if n, _ := conntrackEntries(t, l, ap("10.20.0.6:10250")); n == 0 {
		t.Fatal("no conntrack entries for 10.20.0.6 before Cleanup")
	}
	l.do(t, func() error { return r.Cleanup(ctx) })
	if diff := cmp.Diff(before, l.snapshot(t)); diff != "" {
		t.Errorf("ruleset after Cleanup differs from before Apply (-before +after):\n%s", diff)
	}
	if n, _ := conntrackEntries(t, l, ap("10.20.0.6:10250")); n != 0 {
		t.Errorf("%d conntrack entries of redirected connections to 10.20.0.6 left after Cleanup", n)
	}
	l.expectDirect(t, ap("10.20.0.6:10250"))
	l.do(t, func() error { return r.Cleanup(ctx) }) // nothing left to remove

	// And a new Apply after Cleanup starts over.
	apply(d)
	expectListed(d)
}

// TestKernelPodRanges checks the pod range rules on every backend: TCP to
// any port of an address in a range reaches the listener, from a routed
// client and from the gateway host, IPv4 and IPv6; an address just outside
// does not; ranges that repeat or nest across nodes apply; a removed range
// stops being redirected and FlushConntrack deletes the entries of its
// redirected connections only; Cleanup removes everything.
func TestKernelPodRanges(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.name, func(t *testing.T) {
			testPodRanges(t, bc)
		})
	}
}

func testPodRanges(t *testing.T, bc backendCase) {
	l := newLab(t)
	ctx := context.Background()
	// Addresses in and just outside the ranges below are the gateway's
	// own, where the direct listeners answer when nothing redirects;
	// the client routes them to the gateway.
	for _, a := range []string{
		"10.20.63.255", "10.20.64.1", "10.20.64.200", "10.20.65.0",
		"fd00:21::ffff:ffff:ffff:ffff", "fd00:21:0:1::1", "fd00:21:0:1::ffff", "fd00:21:0:2::",
	} {
		p := netip.PrefixFrom(netip.MustParseAddr(a), netip.MustParseAddr(a).BitLen()).String()
		l.gw.Run(t, "ip", "addr", "add", p, "dev", "edges0", "nodad")
	}
	l.client.Run(t, "ip", "route", "add", "fd00:21::/48", "via", "fd99::1")
	for _, p := range []uint16{9100, 443} {
		l.serve(t, p, func(*net.TCPConn) string { return "direct" })
	}
	addForeignRules(t, l, bc.mode)
	before := l.snapshot(t)

	pfx := netip.MustParsePrefix
	// An edge address of each family keeps a REDIRECT rule of each family
	// in place without pod ranges: iptables' REDIRECT target is what
	// turns on connection tracking in the namespace, and the test reads
	// the entries of direct connections too.
	base := Desired{
		Edges:     map[string][]netip.Addr{"edge-a": {netip.MustParseAddr("10.20.0.5"), netip.MustParseAddr("fd00:20::5")}},
		Ports:     []uint16{10250},
		ProxyPort: labProxyPort,
	}
	all := base
	all.PodRanges = map[string][]netip.Prefix{
		"edge-a": {pfx("10.20.64.0/24"), pfx("fd00:21:0:1::/64")},
		"edge-b": {pfx("10.20.64.128/25"), pfx("fd00:21:0:1::/64")},       // inside edge-a's, and the same
		"edge-c": {pfx("10.20.64.0/24"), pfx("ffff:ffff:ffff:ffff::/64")}, // edge-a's again; the last /64
	}
	// edge-d's range starts where edge-b's ends: the kernel holds an
	// interval end and an interval start of the same address.
	onlyB := base
	onlyB.PodRanges = map[string][]netip.Prefix{"edge-b": all.PodRanges["edge-b"], "edge-d": {pfx("10.20.65.0/24")}}

	var r Rules
	l.do(t, func() (err error) { r, err = bc.new(testLogger(t)); return err })
	apply := func(d Desired) {
		t.Helper()
		l.do(t, func() error { return r.Apply(ctx, d) })
		if diff := cmp.Diff(bc.render(mustNormalize(t, d)), bc.list(t, l)); diff != "" {
			t.Fatalf("kernel holds (-want +got):\n%s", diff)
		}
	}
	flushed := func(dst netip.AddrPort) {
		t.Helper()
		redirected, direct := conntrackEntries(t, l, dst)
		if redirected != 0 {
			t.Errorf("%d conntrack entries of redirected connections to %v left after FlushConntrack", redirected, dst)
		}
		if direct == 0 {
			t.Errorf("FlushConntrack deleted the entries of direct connections to %v", dst)
		}
	}

	apply(all)
	for _, dst := range []string{"10.20.64.1:9100", "10.20.64.1:443", "10.20.64.200:9100", "[fd00:21:0:1::1]:9100", "[fd00:21:0:1::ffff]:443"} {
		l.expectRedirected(t, ap(dst))
	}
	for _, dst := range []string{"10.20.63.255:9100", "10.20.65.0:443", "[fd00:21::ffff:ffff:ffff:ffff]:9100", "[fd00:21:0:2::]:443"} {
		l.expectDirect(t, ap(dst))
	}
	l.expectRedirected(t, ap("10.20.0.5:10250")) // an edge address: proxied ports only
	l.expectDirect(t, ap("10.20.0.5:9100"))

	// edge-a's and edge-c's ranges go; edge-b's half of 10.20.64.0/24
	// and its IPv6 range stay; edge-d's comes.
	apply(onlyB)
	l.expectDirect(t, ap("10.20.64.1:9100"))
	l.expectRedirected(t, ap("10.20.64.200:9100"))
	l.expectRedirected(t, ap("10.20.65.0:443"))
	l.expectRedirected(t, ap("[fd00:21:0:1::1]:9100"))
	l.do(t, func() error { return r.FlushConntrack(ctx) })
	flushed(ap("10.20.64.1:9100"))
	if n, _ := conntrackEntries(t, l, ap("10.20.64.200:9100")); n == 0 {
		t.Error("FlushConntrack deleted the entries of connections to 10.20.64.200, still redirected")
	}

	// No ranges at all.
	apply(base)
	l.expectDirect(t, ap("10.20.64.200:9100"))
	l.expectDirect(t, ap("10.20.65.0:443"))
	l.expectDirect(t, ap("[fd00:21:0:1::1]:9100"))
	l.do(t, func() error { return r.FlushConntrack(ctx) })
	flushed(ap("10.20.64.200:9100"))
	flushed(ap("10.20.65.0:443"))
	flushed(ap("[fd00:21:0:1::1]:9100"))
	l.expectRedirected(t, ap("10.20.0.5:10250"))

	// Back, then Cleanup leaves the ruleset as it found it.
	apply(all)
	l.expectRedirected(t, ap("10.20.64.1:443"))
	l.do(t, func() error { return r.Cleanup(ctx) })
	if diff := cmp.Diff(before, l.snapshot(t)); diff != "" {
		t.Errorf("ruleset after Cleanup differs from before Apply (-before +after):\n%s", diff)
	}
	l.expectDirect(t, ap("10.20.64.1:443"))
	l.expectDirect(t, ap("[fd00:21:0:1::1]:443"))
}

func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(goldenPath(name))
	if err != nil {
		t.Fatalf("read golden file (run TestGolden* with -update to create it): %v", err)
	}
	return string(b)
}

func TestKernelConflict(t *testing.T) {
	t.Run("nftables", func(t *testing.T) {
		testenv.RequireRoot(t)
		h := testenv.NewHost(t, "nr-conflict")
		h.Run(t, "nft", "add", "table", "inet", "tether")
		h.Run(t, "nft", "add", "chain", "inet", "tether", "mine", "{ type filter hook input priority 0; }")
		h.Run(t, "nft", "add", "rule", "inet", "tether", "mine", "tcp", "dport", "22", "accept")
		want := h.Run(t, "nft", "list", "ruleset")
		expectConflict(t, h, func() (Rules, error) { return New(KindNFTables, Options{}) })
		if got := h.Run(t, "nft", "list", "ruleset"); got != want {
			t.Errorf("foreign table changed (-before +after):\n%s", cmp.Diff(want, got))
		}
	})
	t.Run("iptables", func(t *testing.T) {
		testenv.RequireRoot(t)
		h := testenv.NewHost(t, "nr-conflict")
		h.Run(t, "iptables-nft", "-t", "nat", "-N", iptChainEdges)
		h.Run(t, "iptables-nft", "-t", "nat", "-A", iptChainEdges, "-p", "tcp", "-j", "RETURN")
		want := h.Run(t, "iptables-nft-save", "-t", "nat")
		expectConflict(t, h, func() (Rules, error) { return newIPTRules(testLogger(t), "nft") })
		if got := h.Run(t, "iptables-nft-save", "-t", "nat"); generated.ReplaceAllString(got, "") != generated.ReplaceAllString(want, "") {
			t.Errorf("foreign chain changed (-before +after):\n%s", cmp.Diff(want, got))
		}
	})
}

// expectConflict checks that Apply and Cleanup of the backend newRules
// makes fail with ErrConflict in h.
func expectConflict(t *testing.T, h *testenv.Host, newRules func() (Rules, error)) {
	t.Helper()
	ctx := context.Background()
	err := h.Do(func() error {
		r, err := newRules()
		if err != nil {
			return err
		}
		if err := r.Apply(ctx, goldenDesired); !errors.Is(err, ErrConflict) {
			return fmt.Errorf("Apply: got %v, want ErrConflict", err)
		} else {
			t.Logf("Apply: %v", err)
		}
		if err := r.Cleanup(ctx); !errors.Is(err, ErrConflict) {
			return fmt.Errorf("Cleanup: got %v, want ErrConflict", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testLogger logs to t.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
