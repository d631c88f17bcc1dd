package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The control-plane helper runs kube-apiserver on any host like this.
var _ interface {
	Command(ctx context.Context, name string, args ...string) *exec.Cmd
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
} = (*Host)(nil)

// netnsNames lists the named namespaces, as `ip netns list` shows them.
func netnsNames(t *testing.T) []string {
	t.Helper()
	// Stdout only: while another process deletes a namespace, ip may
	// complain on stderr about its peer reference.
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// ownNetns lists the namespaces this test process has made and not yet
// deleted. Other processes may create and delete theirs meanwhile.
func ownNetns(t *testing.T) []string {
	t.Helper()
	prefix := fmt.Sprintf("%s%dx", namePrefix, os.Getpid())
	var own []string
	for _, n := range netnsNames(t) {
		if strings.HasPrefix(n, prefix) {
			own = append(own, n)
		}
	}
	slices.Sort(own)
	return own
}

// echoServer accepts connections on l and echoes one line back, until l is
// closed.
func echoServer(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			io.WriteString(c, line)
		}()
	}
}

// listenEcho starts an echo server on h at addr (port 0 picks one) and
// returns its address.
func listenEcho(t *testing.T, h *Host, addr string) netip.AddrPort {
	t.Helper()
	l, err := h.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go echoServer(l)
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// echo dials addr from h within timeout and checks that a line comes back.
func echo(h *Host, addr netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := h.DialContext(ctx, "tcp4", addr.String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	msg := fmt.Sprintf("hello from %s\n", h.Label)
	if _, err := io.WriteString(c, msg); err != nil {
		return fmt.Errorf("write to %s: %w", addr, err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read from %s: %w", addr, err)
	}
	if got != msg {
		return fmt.Errorf("echo from %s: got %q, want %q", addr, got, msg)
	}
	return nil
}

func TestHostLoopback(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	h := NewHost(t, "lone")

	if !slices.Contains(netnsNames(t), h.Name) {
		t.Fatalf("namespace %s not in ip netns list", h.Name)
	}
	out := h.Run(t, "ip", "-o", "link", "show")
	if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != 1 || !strings.Contains(out, "lo:") || !strings.Contains(out, "UP") {
		t.Fatalf("want only loopback, up; got:\n%s", out)
	}

	// A socket made inside the namespace is reachable only there.
	addr := listenEcho(t, h, "127.0.0.1:0")
	if err := echo(h, addr, 5*time.Second); err != nil {
		t.Fatalf("loopback echo inside the namespace: %v", err)
	}
	var d net.Dialer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := d.DialContext(ctx, "tcp4", addr.String()); err == nil {
		// The port may by chance be open in the test's own namespace;
		// the echo must not come from our server then.
		c.Close()
		t.Logf("port %d also open outside the namespace (another listener)", addr.Port())
	}

	// Do switches the thread into the namespace and back.
	var inside, outside string
	if err := h.Do(func() error {
		b, err := os.Readlink("/proc/thread-self/ns/net")
		inside = b
		return err
	}); err != nil {
		t.Fatal(err)
	}
	outside, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if inside == outside {
		t.Fatalf("Do ran in the test's own namespace %s", outside)
	}
	st, err := os.Stat("/run/netns/" + h.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", st.Sys().(*syscall.Stat_t).Ino); inside != want {
		t.Fatalf("Do ran in %s, want %s", inside, want)
	}

	// Sysctl writes the namespace's own value and leaves the host's. A new
	// namespace starts with the host's IPv4 settings
	// (net.core.devconf_inherit_init_net=0), so flip whatever it has.
	hostBefore, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	want := "1"
	if strings.TrimSpace(h.Run(t, "cat", "/proc/sys/net/ipv4/ip_forward")) == "1" {
		want = "0"
	}
	if err := h.Sysctl("net.ipv4.ip_forward", want); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(h.Run(t, "cat", "/proc/sys/net/ipv4/ip_forward")); got != want {
		t.Fatalf("ip_forward after Sysctl = %s, want %s", got, want)
	}
	if hostAfter, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(hostAfter) != string(hostBefore) {
		t.Fatalf("Sysctl in a namespace changed the host's ip_forward from %q to %q", hostBefore, hostAfter)
	}

	// UDP sockets too.
	pc, err := h.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	uc, err := h.DialContext(ctx, "udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if _, err := uc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := pc.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("udp read: %q, %v", buf[:n], err)
	}

	// Names are not resolved inside a namespace.
	if _, err := h.DialContext(ctx, "tcp", "example.com:80"); err == nil {
		t.Fatal("DialContext resolved a name")
	}
}

func TestHostStartStop(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	h := NewHost(t, "procs")

	var pid int
	t.Run("sub", func(t *testing.T) {
		cmd := h.Start(t, "sh", "-c", "echo started; ip -o link show lo; exec sleep 300")
		pid = cmd.Process.Pid
		Eventually(t, "the link listed", func() bool { return strings.Contains(h.Log(cmd), "lo:") })
		if log := h.Log(cmd); !strings.Contains(log, "started") || !strings.Contains(log, "lo:") {
			t.Fatalf("log = %q", log)
		}
		if h.Exited(cmd) {
			t.Fatal("exited early")
		}
	})
	// The subtest's cleanup stopped the process.
	if pidAlive(pid) {
		t.Fatalf("pid %d still alive after its test ended", pid)
	}

	// Stop ends a process early; Wait reports how it ended.
	cmd := h.Start(t, "sleep", "300")
	start := time.Now()
	if err := h.Stop(cmd); err == nil {
		t.Fatal("Stop: sleep exited cleanly, want killed by SIGTERM")
	}
	if d := time.Since(start); d > procStopGrace {
		t.Errorf("Stop took %v; sleep should end on SIGTERM", d)
	}
	if err := h.Wait(context.Background(), cmd); err == nil || !h.Exited(cmd) {
		t.Fatalf("Wait after Stop = %v, exited %v", err, h.Exited(cmd))
	}

	// A process that ignores SIGTERM gets SIGKILL.
	cmd = h.Start(t, "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done")
	Eventually(t, "the process ready", func() bool { return strings.Contains(h.Log(cmd), "ready") })
	start = time.Now()
	h.Stop(cmd)
	if d := time.Since(start); d < procStopGrace || d > 3*procStopGrace {
		t.Errorf("stopping a process that ignores SIGTERM took %v, want about %v", d, procStopGrace)
	}
}

func TestHostCleanupAndSweep(t *testing.T) {
	RequireRoot(t)

	// A namespace whose PID is dead, as a killed test run leaves behind.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%dx1-stale", namePrefix, dead.Process.Pid)
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", stale, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", stale).Run() })
	// One of this process's own namespaces must survive the sweep.
	keep := NewHost(t, "keep")

	before := ownNetns(t)
	var created []string
	var pid int
	t.Run("host", func(t *testing.T) {
		h := NewHost(t, "gone")
		created = append(created, h.Name)
		// Something started with Command, not Start, is also killed.
		cmd := h.Command(context.Background(), "sleep", "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		pid = cmd.Process.Pid
		// Start returns once ip runs, before it has entered the
		// namespace; what the cleanup promises is for what runs inside.
		waitInNetns(t, pid, h.Name)
	})

	if after := ownNetns(t); !slices.Equal(before, after) {
		t.Errorf("namespaces of this process before: %v, after: %v", before, after)
	}
	names := netnsNames(t)
	if slices.Contains(names, stale) {
		t.Errorf("stale namespace %s not swept", stale)
	}
	if !slices.Contains(names, keep.Name) {
		t.Errorf("live namespace %s swept", keep.Name)
	}
	for _, n := range created {
		if slices.Contains(names, n) {
			t.Errorf("namespace %s left after its test ended", n)
		}
	}
	// Killed at once; reaped by cmd.Wait's goroutine, which a loaded
	// machine may run late.
	Eventually(t, fmt.Sprintf("process %d in a deleted namespace to end", pid), func() bool { return !pidAlive(pid) })
}

// waitInNetns waits until process pid runs in the named namespace.
func waitInNetns(t *testing.T, pid int, name string) {
	t.Helper()
	var ns syscall.Stat_t
	if err := syscall.Stat(filepath.Join(netnsDir, name), &ns); err != nil {
		t.Fatal(err)
	}
	Eventually(t, fmt.Sprintf("process %d in namespace %s", pid, name), func() bool {
		var st syscall.Stat_t
		return syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Ino == ns.Ino && st.Dev == ns.Dev
	})
}

// whoamiServer answers each connection on l with the address it came from.
func whoamiServer(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().String()+"\n")
		c.Close()
	}
}

// whoami dials addr from h and returns the source address addr saw.
func whoami(h *Host, addr netip.AddrPort, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := h.DialContext(ctx, "tcp4", addr.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// mustFail checks that h cannot connect to addr within timeout, and that
// it gives up within a bounded time.
func mustFail(t *testing.T, h *Host, addr netip.AddrPort, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	err := echo(h, addr, timeout)
	if err == nil {
		t.Errorf("%s reached %s; want no way through", h, addr)
		return
	}
	if d := time.Since(start); d > timeout+time.Second {
		t.Errorf("%s to %s failed only after %v", h, addr, d)
	}
	t.Logf("%s -> %s fails as it should: %v", h.Label, addr, err)
}

func twoSites(t *testing.T) *Topology {
	t.Helper()
	start := time.Now()
	topo := NewTopology(t, TopologySpec{
		CloudHosts: []string{"gw", "api"},
		Sites: []SiteSpec{
			{Name: "a", Hosts: []string{"e1", "e2"}},
			{Name: "b", Hosts: []string{"e1"}},
		},
	})
	t.Logf("topology of %d hosts built in %v", len(topo.CloudHosts)+len(topo.Sites[0].Hosts)+len(topo.Sites[1].Hosts), time.Since(start))
	return topo
}

func TestTopologyNAT(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	topo := twoSites(t)
	gw, api := topo.Cloud("gw"), topo.Cloud("api")
	a, b := topo.Site("a"), topo.Site("b")
	a1, a2, b1 := a.Host("e1"), a.Host("e2"), b.Host("e1")

	// The address plan.
	for _, c := range []struct {
		h    *Host
		want string
	}{
		{topo.Router, "10.0.0.1"}, {gw, "10.0.0.10"}, {api, "10.0.0.11"},
		{a.Router(), "192.168.1.1"}, {a1, "192.168.1.10"}, {a2, "192.168.1.11"},
		{b.Router(), "192.168.1.1"}, {b1, "192.168.1.10"},
	} {
		if c.h.Addr.String() != c.want {
			t.Errorf("%s: Addr %s, want %s", c.h, c.h.Addr, c.want)
		}
	}
	if a.PublicAddr.String() != "100.64.0.2" || b.PublicAddr.String() != "100.64.1.2" {
		t.Errorf("public addresses %s, %s; want 100.64.0.2, 100.64.1.2", a.PublicAddr, b.PublicAddr)
	}

	// Both sites, with the same LAN range, reach the cloud, NATed to
	// their public address.
	l, err := gw.Listen("tcp4", netip.AddrPortFrom(gw.Addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go whoamiServer(l)
	gwAddr := l.Addr().(*net.TCPAddr).AddrPort()
	for _, c := range []struct {
		h    *Host
		want netip.Addr
	}{{a1, a.PublicAddr}, {a2, a.PublicAddr}, {b1, b.PublicAddr}, {api, api.Addr}} {
		src, err := whoami(c.h, gwAddr, 5*time.Second)
		if err != nil {
			t.Errorf("%s -> gw: %v", c.h, err)
		} else if src != c.want.String() {
			t.Errorf("%s -> gw: seen from %s, want %s", c.h, src, c.want)
		}
	}

	// Hosts of a site reach each other directly.
	a1Addr := listenEcho(t, a1, netip.AddrPortFrom(a1.Addr, 0).String())
	if err := echo(a2, a1Addr, 5*time.Second); err != nil {
		t.Errorf("a/e2 -> a/e1: %v", err)
	}

	// The cloud reaches no edge: not the LAN address (no route), not the
	// router's public address (dropped), and neither does another site.
	mustFail(t, gw, a1Addr, time.Second)
	mustFail(t, topo.Router, a1Addr, time.Second)
	pub := listenEcho(t, a.Router(), "0.0.0.0:0")
	mustFail(t, gw, netip.AddrPortFrom(a.PublicAddr, pub.Port()), time.Second)
	mustFail(t, b1, netip.AddrPortFrom(a.PublicAddr, pub.Port()), time.Second)
	if err := echo(a2, netip.AddrPortFrom(a.Router().Addr, pub.Port()), 5*time.Second); err != nil {
		t.Errorf("a/e2 -> its router: %v", err)
	}
}

func TestTopologyCutHeal(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	topo := twoSites(t)
	gw := topo.Cloud("gw")
	a, b := topo.Site("a"), topo.Site("b")
	a1, a2 := a.Host("e1"), a.Host("e2")

	gwAddr := listenEcho(t, gw, netip.AddrPortFrom(gw.Addr, 0).String())
	a1Addr := listenEcho(t, a1, netip.AddrPortFrom(a1.Addr, 0).String())
	if err := echo(a1, gwAddr, 5*time.Second); err != nil {
		t.Fatalf("before Cut: %v", err)
	}
	// A connection open across the Cut.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	old, err := a2.DialContext(ctx, "tcp4", gwAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldR := bufio.NewReader(old)

	a.Cut()
	a.Cut() // idempotent
	mustFail(t, a1, gwAddr, time.Second)
	if err := echo(a2, a1Addr, 5*time.Second); err != nil {
		t.Errorf("site LAN broken by Cut: %v", err)
	}
	if err := echo(b.Host("e1"), gwAddr, 5*time.Second); err != nil {
		t.Errorf("Cut of site a broke site b: %v", err)
	}
	io.WriteString(old, "across the cut\n")
	old.SetReadDeadline(time.Now().Add(time.Second))
	if line, err := oldR.ReadString('\n'); err == nil {
		t.Errorf("existing connection still carries data after Cut: %q", line)
	}

	a.Heal()
	a.Heal() // idempotent
	if err := echo(a1, gwAddr, 5*time.Second); err != nil {
		t.Errorf("after Heal: %v", err)
	}
	// The stalled connection resumes: TCP retransmits, NAT state was kept.
	old.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := oldR.ReadString('\n'); err != nil || line != "across the cut\n" {
		t.Errorf("existing connection after Heal: %q, %v", line, err)
	}
}

func TestTopologySetLatency(t *testing.T) {
	RequireRoot(t)
	t.Parallel()
	topo := NewTopology(t, TopologySpec{
		CloudHosts: []string{"gw"},
		Sites:      []SiteSpec{{Name: "far", Hosts: []string{"e1"}}},
	})
	site := topo.Site("far")
	err := site.SetLatency(50 * time.Millisecond)
	if errors.Is(err, ErrNetemUnavailable) {
		t.Skipf("SetLatency: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	gw := topo.Cloud("gw")
	addr := listenEcho(t, gw, netip.AddrPortFrom(gw.Addr, 0).String())
	start := time.Now()
	if err := echo(site.Host("e1"), addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Connect and one exchange: two round trips of at least 100ms.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("echo took %v with 50ms each way; want at least 200ms", d)
	}
	if err := site.SetLatency(0); err != nil {
		t.Fatal(err)
	}
	if err := site.SetLatency(0); err != nil {
		t.Fatalf("removing no latency: %v", err)
	}
}

// TestTopologyCleanup runs before the parallel tests, alone in this
// process, so that it can compare the whole list of its namespaces.
func TestTopologyCleanup(t *testing.T) {
	RequireRoot(t)
	before := ownNetns(t)
	var names []string
	var pid int
	t.Run("build", func(t *testing.T) {
		topo := twoSites(t)
		names = append(names, topo.Router.Name)
		for _, h := range topo.CloudHosts {
			names = append(names, h.Name)
		}
		for _, s := range topo.Sites {
			names = append(names, s.Router().Name)
			for _, h := range s.Hosts {
				names = append(names, h.Name)
			}
		}
		pid = topo.Cloud("gw").Start(t, "sleep", "300").Process.Pid
		if got := netnsNames(t); len(got) < len(names) {
			t.Fatalf("ip netns list has %d names, topology made %d", len(got), len(names))
		}
	})
	if len(names) != 8 {
		t.Fatalf("topology made %d namespaces, want 8", len(names))
	}
	after := netnsNames(t)
	for _, n := range names {
		if slices.Contains(after, n) {
			t.Errorf("namespace %s left behind", n)
		}
	}
	if pidAlive(pid) {
		t.Errorf("process %d started in the topology still runs", pid)
	}
	if after := ownNetns(t); !slices.Equal(before, after) {
		t.Errorf("namespaces of this process before: %v, after: %v", before, after)
	}
}

func TestTopologySpecErrors(t *testing.T) {
	t.Parallel()
	for _, spec := range []TopologySpec{
		{CloudHosts: []string{"gw", "gw"}},
		{Sites: []SiteSpec{{Name: "a"}, {Name: "a"}}},
		{Sites: []SiteSpec{{Name: ""}}},
		{Sites: []SiteSpec{{Name: "a", LAN: netip.MustParsePrefix("10.0.0.0/16")}}},
		{Sites: []SiteSpec{{Name: "a", LAN: netip.MustParsePrefix("192.168.1.0/28"), Hosts: []string{"1", "2", "3", "4", "5"}}}},
		{Sites: []SiteSpec{{Name: "a", LAN: netip.MustParsePrefix("fd00::/64")}}},
		{CloudLAN: netip.MustParsePrefix("100.64.0.0/24")},
	} {
		if err := spec.setDefaults(); err == nil {
			t.Errorf("spec %+v accepted", spec)
		}
	}
	spec := TopologySpec{Sites: []SiteSpec{{Name: "a", Hosts: []string{"x"}}}}
	if err := spec.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if spec.CloudLAN != defaultCloudLAN || spec.Sites[0].LAN != defaultSiteLAN {
		t.Errorf("defaults not set: %+v", spec)
	}
}
