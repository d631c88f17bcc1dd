package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestRealKubelet runs a full kubelet (v1.36) with containerd and runc on
// an edge node behind NAT, its apiserver tether-edge's proxy, and drives
// a real container with kubectl from the cloud: exec (with and without a
// terminal), attach, port-forward, cp both ways and logs -f, each through
// kube-apiserver, tether-gateway and the QUIC tunnel to the kubelet, whose
// serving certificate kube-apiserver verifies (--kubelet-certificate-
// authority). A kubelet with a certificate of another CA, on the other
// edge, is refused.
func TestRealKubelet(t *testing.T) {
	testenv.RequireRoot(t)
	// edge-2 runs no stand-in either: it gets a kubelet of another CA.
	w := world.New(t, bins, world.Options{RealKubelets: []string{"edge-1", "edge-2"}}, t.Logf)
	w.ApplyEdgeRBAC(t)
	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--netrules", "nftables")
	w.RouteSitesVia(t, gw)
	api := w.Topo.Cloud("apiserver")
	for _, s := range w.Topo.Sites {
		api.Run(t, "ip", "route", "replace", s.LAN.String(), "via", gw.Addr.String())
	}
	edge, other := w.Edge("edge-1"), w.Edge("edge-2")
	w.StartEdge(t, edge, w.ProxyArgs(edge)...)
	w.StartEdge(t, other)
	w.StartRealKubelet(t, edge, world.RealKubeletOptions{PodCIDR: netip.MustParsePrefix("10.88.1.0/24")})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod := startBusyboxPod(t, ctx, w, edge.Name)
	t.Logf("pod %s running on %s: %s", pod.Name, edge.Name, pod.Status.PodIP)

	kubectlBin := testenv.Binaries(t).Kubectl
	kubectlArgs := func(args ...string) []string {
		return append([]string{kubectlBin, "--kubeconfig", w.CP.AdminKubeconfig, "--request-timeout", "60s"}, args...)
	}
	kubectl := func(stdin io.Reader, args ...string) (string, error) {
		a := kubectlArgs(args...)
		cmd := w.Client.Command(ctx, a[0], a[1:]...)
		cmd.Stdin = stdin
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// Streams the gateway opened to edge-1's tether-edge through the
	// tunnel, counted by tether-edge as it accepts them.
	tunnelStreams := func() float64 {
		m, err := world.Get(ctx, edge.Host, world.EdgeAdmin("/metrics"))
		if err != nil {
			t.Fatalf("metrics of %s: %v", edge.Name, err)
		}
		return world.Metric(m, `tether_edge_tunnel_streams_total{result="ok"}`)
	}
	streamsBefore := tunnelStreams()

	t.Run("Exec", func(t *testing.T) {
		out, err := kubectl(strings.NewReader("from stdin"), "exec", "-i", pod.Name, "-c", "main", "--", "sh", "-c", "cat; echo; echo hi from $(hostname)")
		if err != nil || out != "from stdin\nhi from "+pod.Name+"\n" {
			t.Errorf("kubectl exec -i: %v: %q", err, out)
		}
	})

	t.Run("ExecWithTerminal", func(t *testing.T) {
		// kubectl gives a terminal only when its stdin is one: script(1)
		// runs it on a pseudo-terminal and types the lines in.
		cmd := strings.Join(quoteAll(kubectlArgs("exec", "-it", pod.Name, "-c", "main", "--", "sh")), " ")
		c := w.Client.Command(ctx, "script", "--quiet", "--return", "--command", cmd, "/dev/null")
		c.Stdin = strings.NewReader("tty; echo typed-$((6*7))\nexit\n")
		b, err := c.CombinedOutput()
		out := string(b)
		// tty names the container's terminal; the shell computed 42.
		if err != nil || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "typed-42") {
			t.Errorf("kubectl exec -it: %v: %q", err, out)
		}
		t.Logf("kubectl exec -it on a terminal: %q", out)
	})

	t.Run("Attach", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		in, typing := io.Pipe()
		defer typing.Close()
		a := kubectlArgs("attach", "-i", pod.Name, "-c", "echo")
		cmd := w.Client.Command(ctx, a[0], a[1:]...)
		cmd.Stdin = in
		lines := startLines(t, ctx, cmd)
		// The line may be typed before the stream is attached: type it
		// until the container echoes it.
		got := make(chan string, 1)
		go func() {
			for l := range lines {
				if strings.HasPrefix(l, "echo: ") {
					got <- l
					return
				}
			}
			close(got)
		}()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Fprintln(typing, "attached")
			select {
			case l, ok := <-got:
				if !ok || l != "echo: attached" {
					t.Errorf("kubectl attach -i: got %q (ended: %v)", l, !ok)
				}
				return
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal("kubectl attach: no echo before the test's deadline")
			}
		}
	})

	t.Run("PortForward", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		a := kubectlArgs("port-forward", "pod/"+pod.Name, "18080:8080")
		lines := startLines(t, ctx, w.Client.Command(ctx, a[0], a[1:]...))
		for l := range lines {
			if strings.HasPrefix(l, "Forwarding from 127.0.0.1:18080") {
				break
			}
		}
		out, err := w.Client.Command(ctx, "curl", "--silent", "--show-error", "--fail", "--max-time", "20", "http://127.0.0.1:18080/index.html").CombinedOutput()
		if err != nil || string(out) != "served from "+pod.Name+"\n" {
			t.Errorf("GET through kubectl port-forward: %v: %q", err, out)
		}
	})

	t.Run("Copy", func(t *testing.T) {
		data := make([]byte, 300<<10)
		rand.Read(data)
		local := filepath.Join(w.Dir, "cp-in.bin")
		if err := os.WriteFile(local, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := kubectl(nil, "cp", "-c", "main", local, "default/"+pod.Name+":/tmp/cp.bin"); err != nil {
			t.Fatalf("kubectl cp to the pod: %v: %s", err, out)
		}
		sum := sha256.Sum256(data)
		out, err := kubectl(nil, "exec", pod.Name, "-c", "main", "--", "sha256sum", "/tmp/cp.bin")
		if err != nil || !strings.HasPrefix(out, hex.EncodeToString(sum[:])+" ") {
			t.Errorf("sha256sum in the pod: %v: %q, want %x", err, out, sum)
		}
		back := filepath.Join(w.Dir, "cp-out.bin")
		if out, err := kubectl(nil, "cp", "-c", "main", "default/"+pod.Name+":/tmp/cp.bin", back); err != nil {
			t.Fatalf("kubectl cp from the pod: %v: %s", err, out)
		}
		if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
			t.Errorf("copied back %d bytes (%v), differ from the %d sent", len(got), err, len(data))
		}
	})

	t.Run("LogsFollow", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// One line from the log so far, then lines written while
		// following: consecutive ticks.
		a := kubectlArgs("logs", "--follow", "--tail", "1", pod.Name, "-c", "main")
		lines := startLines(t, ctx, w.Client.Command(ctx, a[0], a[1:]...))
		var ticks []int
		for l := range lines {
			var n int
			if _, err := fmt.Sscanf(l, "tick %d", &n); err != nil {
				t.Fatalf("log line %q", l)
			}
			if ticks = append(ticks, n); len(ticks) == 4 {
				break
			}
		}
		for i := 1; i < len(ticks); i++ {
			if ticks[i] != ticks[i-1]+1 {
				t.Errorf("followed ticks %v, want consecutive", ticks)
			}
		}
		if len(ticks) != 4 {
			t.Errorf("followed ticks %v, want 4", ticks)
		}
	})

	t.Run("ThroughTheTunnel", func(t *testing.T) {
		// Each kubectl command above (exec twice, attach, port-forward,
		// the two copies and the sha256sum, logs) made kube-apiserver
		// open a connection to the kubelet, which came through the
		// gateway and the tunnel: edge-1 accepted a stream for each.
		const least = 8
		if n := tunnelStreams() - streamsBefore; n < least {
			t.Errorf("edge-1 accepted %v tunnel streams during the kubectl commands, want at least %d", n, least)
		} else {
			t.Logf("edge-1 accepted %v tunnel streams during the kubectl commands", n)
		}
	})

	t.Run("KubeletCertificateVerified", func(t *testing.T) {
		// edge-2's "kubelet" holds a certificate of another CA, for the
		// right address and name: kube-apiserver refuses it.
		rogue := world.StartKubelet(t, other.Host, other.Name, testenv.MustCA(t, "rogue-kubelet-ca"))
		c := w.CP.Client.CoreV1().Pods("default")
		elsewhere := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"},
			Spec: corev1.PodSpec{NodeName: other.Name, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "main", Image: testenv.BusyboxImage}}},
		}
		if _, err := c.Create(ctx, elsewhere, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, err := kubectl(nil, "logs", elsewhere.Name, "-c", "main")
		if err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
			t.Errorf("kubectl logs from a kubelet of another CA: %v: %q, want a verification failure", err, out)
		}
		t.Logf("kubectl logs from a kubelet of another CA: %s", strings.TrimSpace(out))
		if n := rogue.Requests.Load(); n != 0 {
			t.Errorf("the rogue kubelet served %d requests", n)
		}
	})
}

// quoteAll quotes each argument for sh.
func quoteAll(args []string) []string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return q
}

// startLines starts cmd (made with ctx, which ends it) and returns its
// stdout's lines; the channel closes when stdout does or ctx ends.
func startLines(t *testing.T, ctx context.Context, cmd *exec.Cmd) <-chan string {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Wait()
		if t.Failed() {
			t.Logf("stderr of %v: %s", cmd.Args, stderr.String())
		}
	})
	return lines
}

// startBusyboxPod creates, on node, a pod of two busybox containers and
// waits until it runs: "main" serves /www on :8080 with httpd and logs a
// numbered tick every 200 ms; "echo" echoes what it reads on its stdin
// (for attach).
func startBusyboxPod(t *testing.T, ctx context.Context, w *world.World, node string) *corev1.Pod {
	t.Helper()
	c := w.CP.Client.CoreV1()
	if _, err := c.ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "busybox", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  ptr.To(false),
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{
				{
					Name: "main", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "mkdir -p /www && echo served from $(hostname) > /www/index.html && httpd -p 8080 -h /www && i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"},
				},
				{
					Name: "echo", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "while read l; do echo \"echo: $l\"; done"},
					Stdin:   true,
				},
			},
		},
	}
	if _, err := c.Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	testenv.EventuallyWithin(t, 2*time.Minute, "pod "+pod.Name+" Running", func() bool {
		p, err := c.Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning
	})
	return pod
}
