package apiproxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestHollowKubeletOfflineRestart runs the kubelet's own code (kubemark's
// hollow kubelet) through the proxy: started online, it registers its Node
// and CSINode; killed and started again while the cloud is unreachable
// (a wiped node, as after a power cut), it registers against the cached
// Node (409) and writes its node status into the queue; after
// kube-controller-manager's Unknown and the heal, the node is Ready
// upstream from the replay.
func TestHollowKubeletOfflineRestart(t *testing.T) {
	testenv.RequireRoot(t) // a mount namespace gives each kubemark its own /tmp
	bins := testenv.Binaries(t)
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const node = "hollow-offline"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline,
		components: append([]string{"hollow-kubelet"}, DefaultComponents...)})
	e.waitHealthy(true, 30*time.Second)

	dir := t.TempDir()
	kubeconfig := fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: edge, cluster: {server: "http://%s"}}]
users: [{name: kubelet, user: {}}]
contexts: [{name: edge, context: {cluster: edge, user: kubelet}}]
current-context: edge
`, e.Addr)
	start := func(run int) *exec.Cmd {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		tmp := filepath.Join(dir, "tmp"+strconv.Itoa(run))
		// tmp is the process's /tmp: its kubeconfig goes there too.
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "kubelet.kubeconfig"), kubeconfig, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /tmp && exec "$@"`, tmp,
			bins.Kubemark, "--morph=kubelet", "--name", node, "--kubeconfig", "/tmp/kubelet.kubeconfig", "--use-host-image-service=false",
			"--kubelet-port", strconv.Itoa(port), "--kubelet-read-only-port", "0", "--v=2")
		cmd.Env = append(os.Environ(), "TMPDIR=/tmp")
		logf, err := os.Create(filepath.Join(dir, "kubemark"+strconv.Itoa(run)+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("kubemark run %d, end of its log:\n%s", run, b)
			}
		})
		return cmd
	}
	nodeReady := func() (corev1.ConditionStatus, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status, nil
			}
		}
		return "", nil
	}

	first := start(1)
	testenv.EventuallyWithin(t, 2*time.Minute, "the hollow kubelet's node Ready upstream", func() bool {
		s, _ := nodeReady()
		return s == corev1.ConditionTrue
	})
	testenv.EventuallyNoError(t, "its Node and CSINode cached", func() error {
		for _, gvr := range [...]struct {
			name string
			o    func() bool
		}{
			{"node", func() bool { o, _ := e.Store.Get("hollow-kubelet", nodesGVR, "", node); return o != nil }},
			{"csinode", func() bool { o, _ := e.Store.Get("hollow-kubelet", csiNodesGVR, "", node); return o != nil }},
		} {
			if !gvr.o() {
				return fmt.Errorf("%s not cached", gvr.name)
			}
		}
		return nil
	})

	// The power cut: the cloud goes, the kubelet is killed and started
	// again, a wiped node.
	offline.set(true)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	queuedBefore := e.Proxy.queue.Len()
	start(2)
	testenv.EventuallyWithin(t, 2*time.Minute, "the restarted kubelet registered (409) and its node status queued", func() bool {
		return e.metric("tether_edge_apiserver_requests_total", "component", "hollow-kubelet", "verb", "create", "served", "local") >= 1 &&
			e.Proxy.queue.Len() > queuedBefore
	})

	// kube-controller-manager's node lifecycle marks the silent node.
	kcmCfg := rest.CopyConfig(cp.Admin)
	kcmCfg.UserAgent = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/abc"
	kcm, err := kubernetes.NewForConfig(kcmCfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := kcm.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		c.Status, c.Reason, c.Message, c.LastTransitionTime = corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status.", metav1.Now()
	}
	if _, err := kcm.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Offline it never had a create or an update refused: its CSINode
	// was read from the cache, owned by the cached Node, so not written.
	for _, verb := range []string{"create", "update"} {
		if n := e.metric("tether_edge_apiserver_requests_total", "component", "hollow-kubelet", "verb", verb, "served", "refused"); n != 0 {
			t.Errorf("%v %ss of the restarted kubelet refused offline", n, verb)
		}
	}

	heal := time.Now()
	offline.set(false)
	testenv.EventuallyWithin(t, time.Minute, "the node Ready upstream after the heal", func() bool {
		s, _ := nodeReady()
		return s == corev1.ConditionTrue
	})
	t.Logf("Ready upstream %v after the heal", time.Since(heal).Round(100*time.Millisecond))
	testenv.Eventually(t, "the queue replayed", func() bool { return e.Proxy.queue.Len() == 0 })
	if r := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "rebased"); r < 1 {
		t.Errorf("%v node status writes rebased, want at least 1", r)
	}
	l, err := e.Store.Ledger()
	if err != nil || !l.Balanced() {
		t.Errorf("ledger: %v, %v", l, err)
	}
}
