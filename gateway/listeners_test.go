package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/accept/accepttest"
	"github.com/tether-edge/tether/internal/testenv"
)

// outOfFilesEnv makes TestAcceptErrors the gateway process of its "out of
// files" case: the value is the kubeconfig to use.
const outOfFilesEnv = "TETHER_TEST_OUT_OF_FILES_KUBECONFIG"

// TestAcceptErrors runs the whole gateway against a real kube-apiserver
// while its listeners cannot accept, and checks that gateway.Run goes on:
// DNS over UDP is answered throughout, and the DNS TCP and admin clients
// that connected meanwhile are answered once accepting works again.
//
//   - accept failing with EMFILE on the DNS TCP listener (accepttest),
//   - the gateway process out of file descriptors for real (RLIMIT_NOFILE
//     lowered and every descriptor taken, in a child process so that this
//     one's limits stay as they are): the DNS TCP and admin listeners both
//     fail to accept until the descriptors are given back.
func TestAcceptErrors(t *testing.T) {
	if kubeconfig := os.Getenv(outOfFilesEnv); kubeconfig != "" {
		outOfFilesGateway(t, kubeconfig)
		return
	}
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Labels: map[string]string{nodewatch.EdgeLabel: "true"}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.20.0.1"}}},
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("EMFILE", func(t *testing.T) {
		cfg, _ := testConfig(t, cp.AdminKubeconfig)
		cfg.DNSListen = "127.0.0.1:0"
		g, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		fl := accepttest.New(g.dnsLn, true)
		g.dnsLn = fl
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		dnsAddr := g.DNSAddr().String()
		testenv.Eventually(t, "edge-1 is answered over UDP", func() bool { return askEdge1("udp", dnsAddr) == nil })

		tc, err := dns.Dial("tcp", dnsAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(60 * time.Second))
		if err := tc.WriteMsg(edge1Query()); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "three accepts failed", func() bool { return fl.Failures() >= 3 })
		if err := askEdge1("udp", dnsAddr); err != nil {
			t.Fatalf("UDP while TCP accepts fail: %v", err)
		}
		fl.SetFailing(false)
		if err := readEdge1(tc); err != nil {
			t.Fatalf("the TCP query sent while accepts failed: %v", err)
		}
		if err := askEdge1("tcp", dnsAddr); err != nil {
			t.Fatalf("TCP after: %v", err)
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned %v", err)
		default:
		}
		metrics := httpGet(t, "http://"+g.AdminAddr().String()+"/metrics")
		want := fmt.Sprintf("tether_gateway_accept_errors_total{listener=%q} %d\n", "dns_tcp", fl.Failures())
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
		for _, l := range []string{"proxy", "admin", "dns_udp"} {
			if want := fmt.Sprintf("tether_gateway_accept_errors_total{listener=%q} 0\n", l); !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("out of files", func(t *testing.T) {
		gw := startOutOfFilesGateway(t, cp.AdminKubeconfig)
		dnsAddr, adminAddr := gw.ready()

		gw.say("exhaust")
		gw.expect("exhausted")
		// The clients live in this process, whose descriptors are left alone.
		tc, err := dns.Dial("tcp", dnsAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(60 * time.Second))
		if err := tc.WriteMsg(edge1Query()); err != nil {
			t.Fatal(err)
		}
		healthz := make(chan string, 1)
		go func() {
			c := &http.Client{Timeout: 60 * time.Second}
			resp, err := c.Get("http://" + adminAddr + "/healthz")
			if err != nil {
				healthz <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			healthz <- string(b)
		}()
		testenv.Eventually(t, "the DNS TCP and admin listeners failing to accept", func() bool {
			gw.say("errors")
			var dnsTCP, admin float64
			fmt.Sscanf(gw.expect("errors"), "errors dns_tcp=%g admin=%g", &dnsTCP, &admin)
			return dnsTCP > 0 && admin > 0
		})
		if err := askEdge1("udp", dnsAddr); err != nil {
			t.Fatalf("UDP while out of files: %v", err)
		}

		gw.say("release")
		gw.expect("released")
		if err := readEdge1(tc); err != nil {
			t.Fatalf("the TCP query sent while out of files: %v", err)
		}
		if got := <-healthz; got != "ok\n" {
			t.Fatalf("/healthz asked while out of files: %q", got)
		}
		if err := askEdge1("tcp", dnsAddr); err != nil {
			t.Fatalf("TCP after: %v", err)
		}
		gw.say("running")
		if got := gw.expect("running"); got != "running" {
			t.Fatalf("the gateway: %s", got)
		}
		gw.say("stop")
		if got := gw.expect("stopped"); got != "stopped <nil>" {
			t.Fatalf("Run: %s", got)
		}
	})
}

func edge1Query() *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion("edge-1.", dns.TypeA)
	return q
}

// askEdge1 asks addr for edge-1 over network.
func askEdge1(network, addr string) error {
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(edge1Query(), addr)
	if err != nil {
		return err
	}
	return checkEdge1(r)
}

func readEdge1(c *dns.Conn) error {
	r, err := c.ReadMsg()
	if err != nil {
		return err
	}
	return checkEdge1(r)
}

func checkEdge1(r *dns.Msg) error {
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.20.0.1" {
		return fmt.Errorf("edge-1. A = %v, want 10.20.0.1", r.Answer)
	}
	return nil
}

// outOfFilesProcess is the child process that runs the gateway, driven by
// one-line commands on its stdin; it answers each on stdout with a line
// that starts with protoPrefix.
type outOfFilesProcess struct {
	t     *testing.T
	stdin io.Writer
	lines chan string
}

const protoPrefix = "gateway-child: "

func startOutOfFilesGateway(t *testing.T, kubeconfig string) *outOfFilesProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptErrors$", "-test.count=1")
	cmd.Env = append(os.Environ(), outOfFilesEnv+"="+kubeconfig)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.LogBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), protoPrefix); ok {
				lines <- l
			} else {
				stderr.Write([]byte(sc.Text() + "\n"))
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("gateway process output:\n%s", stderr.String())
		}
	})
	return &outOfFilesProcess{t: t, stdin: stdin, lines: lines}
}

func (p *outOfFilesProcess) say(cmd string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("tell the gateway process %s: %v", cmd, err)
	}
}

// expect returns the next answer, which must start with word.
func (p *outOfFilesProcess) expect(word string) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("the gateway process ended before it said %s", word)
		}
		if !strings.HasPrefix(l, word) {
			p.t.Fatalf("the gateway process said %q, want %s", l, word)
		}
		return l
	case <-time.After(90 * time.Second):
		p.t.Fatalf("the gateway process did not say %s", word)
	}
	return ""
}

// ready returns the DNS and admin addresses once edge-1 is answered.
func (p *outOfFilesProcess) ready() (dnsAddr, adminAddr string) {
	p.t.Helper()
	fmt.Sscanf(p.expect("ready"), "ready dns=%s admin=%s", &dnsAddr, &adminAddr)
	return dnsAddr, adminAddr
}

// outOfFilesGateway is the child process: it runs the gateway and, on
// command, takes every file descriptor it may open, reports the accept
// errors counted, gives them back, says whether Run is still running, and
// stops it.
func outOfFilesGateway(t *testing.T, kubeconfig string) {
	say := func(format string, args ...any) { fmt.Printf(protoPrefix+format+"\n", args...) }
	cfg, _ := testConfig(t, kubeconfig)
	cfg.DNSListen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	testenv.Eventually(t, "edge-1 is answered over UDP", func() bool { return askEdge1("udp", g.DNSAddr().String()) == nil })
	// Every part started and synced (its informers' and the pool feed's
	// first lists done, their connections open) before the descriptors
	// are taken: a part still starting could close one it had while the
	// listeners are meant to have none, and the admin listener would
	// take it.
	testenv.Eventually(t, "the gateway's parts synced", func() bool {
		return g.Ready() == nil && (g.poolFeed == nil || g.poolFeed.Synced())
	})
	say("ready dns=%s admin=%s", g.DNSAddr(), g.AdminAddr())

	var fds fillers
	defer fds.release()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "exhaust":
			if err := fds.exhaust(); err != nil {
				t.Fatal(err)
			}
			say("exhausted")
		case "errors":
			fds.fill() // whatever the gateway closed meanwhile
			errs := acceptErrors(g.Metrics())
			say("errors dns_tcp=%g admin=%g", errs["dns_tcp"], errs["admin"])
		case "release":
			fds.release()
			say("released")
		case "running":
			select {
			case err := <-done:
				say("stopped %v", err)
			default:
				say("running")
			}
		case "stop":
			cancel()
			say("stopped %v", <-done)
			return
		}
	}
}

// fillers are file descriptors taken so that the process has none left.
type fillers struct{ fds []int }

// exhaust lowers the soft RLIMIT_NOFILE to a little above the descriptors
// open now and takes the rest.
func (f *fillers) exhaust() error {
	open, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = uint64(len(open) + 32)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if f.fill() == 0 {
		return errors.New("no descriptor taken")
	}
	return nil
}

// fill opens /dev/null until the process may open no more; it returns how
// many it opened.
func (f *fillers) fill() int {
	n := 0
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return n
		}
		f.fds = append(f.fds, fd)
		n++
	}
}

func (f *fillers) release() {
	for _, fd := range f.fds {
		syscall.Close(fd)
	}
	f.fds = nil
}

// acceptErrors returns tether_gateway_accept_errors_total by listener.
// Out of descriptors, the process collector fails; the rest is gathered.
func acceptErrors(reg *prometheus.Registry) map[string]float64 {
	mfs, _ := reg.Gather()
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tether_gateway_accept_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}
