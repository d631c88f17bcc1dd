package netrules

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// The kernel tests' network: a gateway namespace and a client namespace
// joined by a veth pair. The client routes the edge ranges to the
// gateway, as the VPC does. The edge addresses are also local addresses
// of the gateway (on a dummy interface, as in vip mode),
// where a "direct" listener answers on every proxied port: a connection
// that the rules do not redirect reaches it instead of the transparent
// listener, so "not redirected" is an answer, not a timeout.
//
//	client ns                          gateway ns
//	veth 10.99.0.2, fd99::2  <----->   veth 10.99.0.1, fd99::1
//	routes 10.20.0.0/16,               edges0 (dummy): the edge addresses
//	192.168.7.0/24, fd00:20::/64       :10263 transparent listener ("redirected <origdst>")
//	via the gateway                    :10250 :10255 :8080 :10251 direct listeners ("direct")

const (
	labProxyPort = 10263
	// labOtherPort is a port no Desired proxies.
	labOtherPort = 10251
)

type lab struct {
	gw, client *testenv.Host
}

func newLab(t *testing.T) *lab {
	t.Helper()
	testenv.RequireRoot(t)
	l := &lab{gw: testenv.NewHost(t, "nr-gw"), client: testenv.NewHost(t, "nr-client")}
	if out, err := exec.Command("ip", "link", "add", "nr0", "netns", l.gw.Name, "type", "veth",
		"peer", "name", "nr0", "netns", l.client.Name).CombinedOutput(); err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	for _, step := range []struct {
		h    *testenv.Host
		args string
	}{
		{l.gw, "addr add 10.99.0.1/24 dev nr0"},
		{l.gw, "addr add fd99::1/64 dev nr0 nodad"},
		{l.gw, "link set nr0 up"},
		{l.client, "addr add 10.99.0.2/24 dev nr0"},
		{l.client, "addr add fd99::2/64 dev nr0 nodad"},
		{l.client, "link set nr0 up"},
		{l.client, "route add 10.20.0.0/16 via 10.99.0.1"},
		{l.client, "route add 192.168.7.0/24 via 10.99.0.1"},
		{l.client, "route add fd00:20::/64 via fd99::1"},
	} {
		step.h.Run(t, "ip", strings.Fields(step.args)...)
	}
	// A dummy interface, or an ifb on kernels built without dummy (as vip.Link does).
	if out, err := l.gw.Command(context.Background(), "ip", "link", "add", "edges0", "type", "dummy").CombinedOutput(); err != nil {
		t.Logf("no dummy interfaces (%v: %s); using ifb", err, out)
		l.gw.Run(t, "ip", "link", "add", "edges0", "type", "ifb")
	}
	l.gw.Run(t, "ip", "link", "set", "edges0", "up")
	st := mustNormalize(t, goldenDesired)
	for _, a := range append(st.v4, st.v6...) {
		args := []string{"addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "edges0"}
		if a.Is6() {
			args = append(args, "nodad")
		}
		l.gw.Run(t, "ip", args...)
	}
	l.serve(t, labProxyPort, func(c *net.TCPConn) string {
		dst, err := OriginalDst(c)
		if err != nil {
			return "error " + err.Error()
		}
		return "redirected " + dst.String()
	})
	for _, p := range append([]uint16{labOtherPort}, mustNormalize(t, goldenDesired).ports...) {
		l.serve(t, p, func(*net.TCPConn) string { return "direct" })
	}
	return l
}

// serve answers every connection to port, in the gateway namespace, with
// one line.
func (l *lab) serve(t *testing.T, port uint16, answer func(*net.TCPConn) string) {
	t.Helper()
	ln, err := l.gw.Listen("tcp", fmt.Sprintf(":%d", port))
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

// ask connects from h to dst and returns the line the gateway answers.
func ask(t *testing.T, h *testenv.Host, dst netip.AddrPort) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := h.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		t.Fatalf("dial %v from %s: %v", dst, h.Label, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read answer of %v from %s: %v", dst, h.Label, err)
	}
	return strings.TrimSpace(line)
}

// expectRedirected checks that connections to dst, from the client
// (PREROUTING) and from the gateway itself (OUTPUT), reach the transparent
// listener, which reads dst as their original destination.
func (l *lab) expectRedirected(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	for _, h := range []*testenv.Host{l.client, l.gw} {
		if got, want := ask(t, h, dst), "redirected "+dst.String(); got != want {
			t.Errorf("%v from %s: got %q, want %q", dst, h.Label, got, want)
		}
	}
}

// expectDirect checks that connections to dst are not redirected.
func (l *lab) expectDirect(t *testing.T, dst netip.AddrPort) {
	t.Helper()
	for _, h := range []*testenv.Host{l.client, l.gw} {
		if got := ask(t, h, dst); got != "direct" {
			t.Errorf("%v from %s: got %q, want %q", dst, h.Label, got, "direct")
		}
	}
}

// do runs fn inside the gateway namespace and fails t on error.
func (l *lab) do(t *testing.T, fn func() error) {
	t.Helper()
	if err := l.gw.Do(fn); err != nil {
		t.Fatal(err)
	}
}

var (
	// generated matches the timestamp comments of iptables-save.
	generated = regexp.MustCompile(`(?m)^# (Generated|Completed) .*\n`)
	// chainCounters matches the policy counters of iptables-save.
	chainCounters = regexp.MustCompile(`\[[0-9]+:[0-9]+\]`)
)

// snapshot returns the gateway namespace's whole ruleset, as nft and as
// iptables-save (legacy and nft-compat, IPv4 and IPv6) list it, without
// counters and timestamps.
func (l *lab) snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(l.gw.Run(t, "nft", "--stateless", "list", "ruleset"))
	for _, cmd := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out := generated.ReplaceAllString(l.gw.Run(t, cmd), "")
		fmt.Fprintf(&b, "### %s\n%s", cmd, chainCounters.ReplaceAllString(out, "[0:0]"))
	}
	return b.String()
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
