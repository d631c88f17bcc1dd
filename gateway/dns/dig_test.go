package dns_test

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
)

// digResult is what a dig run printed.
type digResult struct {
	status  string   // NOERROR, NXDOMAIN, REFUSED...
	flags   []string // qr, aa, rd...
	answer  []string // "name ttl class type data", whitespace normalised
	auth    []string
	server  string // "(UDP)" or "(TCP)"
	retried bool   // dig saw TC and retried over TCP
	raw     string
}

var (
	statusRE = regexp.MustCompile(`status: ([A-Z]+)`)
	flagsRE  = regexp.MustCompile(`;; flags: ([a-z ]*);`)
	serverRE = regexp.MustCompile(`;; SERVER: \S+ \((UDP|TCP)\)`)
)

// dig runs dig inside h against 127.0.0.1:port and parses its output.
func dig(t *testing.T, h *testenv.Host, port int, args ...string) digResult {
	t.Helper()
	all := append([]string{"@127.0.0.1", "-p", fmt.Sprint(port), "+time=2", "+tries=1"}, args...)
	out := h.Run(t, "dig", all...)
	r := digResult{raw: out}
	if m := statusRE.FindStringSubmatch(out); m != nil {
		r.status = m[1]
	}
	if m := flagsRE.FindStringSubmatch(out); m != nil {
		r.flags = strings.Fields(m[1])
	}
	if m := serverRE.FindStringSubmatch(out); m != nil {
		r.server = m[1]
	}
	r.retried = strings.Contains(out, "Truncated, retrying in TCP mode")
	var section *[]string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, ";; ANSWER SECTION:"):
			section = &r.answer
		case strings.HasPrefix(line, ";; AUTHORITY SECTION:"):
			section = &r.auth
		case line == "" || strings.HasPrefix(line, ";"):
			section = nil
		case section != nil:
			*section = append(*section, strings.Join(strings.Fields(line), " "))
		}
	}
	return r
}

// TestDig runs the server in a network namespace, as the gateway runs it,
// and queries it with dig.
func TestDig(t *testing.T) {
	testenv.RequireRoot(t)
	h := testenv.NewHost(t, "dns")
	ctx, cancel := context.WithCancel(t.Context())

	many := make([]netip.Addr, 80)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 9, 0, byte(i + 1)})
	}
	snap := &nodewatch.Snapshot{Version: 1, Nodes: map[string]nodewatch.Node{
		"edge-1": {Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")},
			VIP: netip.MustParseAddr("100.64.0.1")},
		"many": {Name: "many", Edge: true, InternalIPs: many},
	}}

	// One server per address mode, each on UDP and TCP port 53 or 54.
	servers := map[nodewatch.Mode]int{nodewatch.ModeNodeIP: 53, nodewatch.ModeVIP: 54}
	done := make(chan error, len(servers))
	var nodeIP *dns.Server
	for mode, port := range servers {
		s, err := dns.New(dns.Options{Zones: []string{"tether.internal."}, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		s.Update(snap)
		if mode == nodewatch.ModeNodeIP {
			nodeIP = s
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		pc, err := h.ListenPacket("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := h.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- s.Serve(ctx, pc, ln) }()
	}
	t.Cleanup(func() {
		cancel()
		for range servers {
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})

	t.Run("A", func(t *testing.T) {
		r := dig(t, h, 53, "edge-1.tether.internal.", "A")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"edge-1.tether.internal. 5 IN A 10.0.0.1"})
		if r.server != "UDP" {
			t.Errorf("answered over %s, want UDP", r.server)
		}
	})
	t.Run("AAAA bare name", func(t *testing.T) {
		r := dig(t, h, 53, "edge-1", "AAAA")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"edge-1. 5 IN AAAA fd00::1"})
	})
	t.Run("A in vip mode", func(t *testing.T) {
		r := dig(t, h, 54, "edge-1.tether.internal.", "A")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"edge-1.tether.internal. 5 IN A 100.64.0.1"})
	})
	t.Run("PTR of a VIP", func(t *testing.T) {
		r := dig(t, h, 54, "-x", "100.64.0.1")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"1.0.64.100.in-addr.arpa. 5 IN PTR edge-1.tether.internal."})
	})
	t.Run("PTR of a node IP refused", func(t *testing.T) {
		r := dig(t, h, 54, "-x", "10.0.0.1")
		want(t, r, "REFUSED", []string{"qr", "rd"}, nil)
	})
	t.Run("NXDOMAIN", func(t *testing.T) {
		r := dig(t, h, 53, "edge-404.tether.internal.", "A")
		want(t, r, "NXDOMAIN", []string{"qr", "aa", "rd"}, nil)
		if len(r.auth) != 1 || !strings.HasPrefix(r.auth[0], "tether.internal. 5 IN SOA ns.dns.tether.internal. hostmaster.tether.internal. ") {
			t.Errorf("authority %q, want the zone's SOA", r.auth)
		}
	})
	t.Run("REFUSED outside", func(t *testing.T) {
		r := dig(t, h, 53, "kubernetes.io.", "A")
		want(t, r, "REFUSED", []string{"qr", "rd"}, nil)
	})
	t.Run("norec", func(t *testing.T) {
		r := dig(t, h, 53, "+norec", "edge-1.tether.internal.", "A")
		want(t, r, "NOERROR", []string{"qr", "aa"}, []string{"edge-1.tether.internal. 5 IN A 10.0.0.1"})
	})
	t.Run("tcp", func(t *testing.T) {
		r := dig(t, h, 53, "+tcp", "edge-1.tether.internal.", "A")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"edge-1.tether.internal. 5 IN A 10.0.0.1"})
		if r.server != "TCP" {
			t.Errorf("answered over %s, want TCP", r.server)
		}
	})
	for _, opt := range []string{"+bufsize=512", "+noedns", "+bufsize=1232"} {
		t.Run("TCP fallback "+opt, func(t *testing.T) {
			// 80 A records: 1,300 bytes compressed.
			r := dig(t, h, 53, opt, "many.tether.internal.", "A")
			if !r.retried || r.server != "TCP" {
				t.Errorf("retried over TCP: %v, answered over %s; want a TC answer and a TCP retry\n%s", r.retried, r.server, r.raw)
			}
			if r.status != "NOERROR" || len(r.answer) != 80 {
				t.Errorf("status %s with %d answers, want NOERROR with 80", r.status, len(r.answer))
			}
		})
	}
	t.Run("SOA and NS", func(t *testing.T) {
		r := dig(t, h, 53, "tether.internal.", "NS")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"tether.internal. 5 IN NS ns.dns.tether.internal."})
		r = dig(t, h, 53, "tether.internal.", "SOA")
		if r.status != "NOERROR" || len(r.answer) != 1 || !strings.Contains(r.answer[0], " IN SOA ") {
			t.Errorf("SOA: status %s answer %q", r.status, r.answer)
		}
	})
	t.Run("update", func(t *testing.T) {
		next := &nodewatch.Snapshot{Version: 2, Nodes: map[string]nodewatch.Node{
			"edge-2": {Name: "edge-2", Edge: true, InternalIPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
		}}
		nodeIP.Update(next)
		r := dig(t, h, 53, "edge-2.tether.internal.", "A")
		want(t, r, "NOERROR", []string{"qr", "aa", "rd"}, []string{"edge-2.tether.internal. 5 IN A 10.0.0.2"})
		r = dig(t, h, 53, "edge-1.tether.internal.", "A")
		want(t, r, "NXDOMAIN", []string{"qr", "aa", "rd"}, nil)
	})
}

func want(t *testing.T, r digResult, status string, flags, answer []string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %s, want %s\n%s", r.status, status, r.raw)
	}
	if !slices.Equal(r.flags, flags) {
		t.Errorf("flags %q, want %q (never ra)", r.flags, flags)
	}
	if !slices.Equal(r.answer, answer) {
		t.Errorf("answer %q, want %q", r.answer, answer)
	}
}
