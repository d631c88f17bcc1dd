package world

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/internal/testenv"
)

// RealKubeletUser is the name in the apiserver's client certificate
// toward real kubelets.
const RealKubeletUser = "kube-apiserver-kubelet-client"

// kubeletClientArgs makes KubeletClientCA and the apiserver's client
// certificate, writes the files the apiserver reads before it starts,
// and returns the flags that make it reach kubelets by InternalIP (the
// address the gateway carries into the tunnel), authenticate with that
// certificate and verify the kubelets' serving certificates by KubeletCA.
func (w *World) kubeletClientArgs(t testenv.T) []string {
	t.Helper()
	w.KubeletClientCA = testenv.MustCA(t, "kubelet-client-ca")
	kp, err := w.KubeletClientCA.ClientCert(RealKubeletUser)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cert, key, err := kp.WriteFiles(w.Dir, "apiserver-kubelet-client")
	if err != nil {
		t.Fatalf("%v", err)
	}
	ca, err := w.KubeletCA.WriteFile(w.Dir, "kubelet-ca")
	if err != nil {
		t.Fatalf("%v", err)
	}
	return []string{
		"--kubelet-client-certificate=" + cert,
		"--kubelet-client-key=" + key,
		"--kubelet-certificate-authority=" + ca,
		"--kubelet-preferred-address-types=InternalIP",
	}
}

// RealKubelet is a full kubelet with containerd and runc on an edge node.
type RealKubelet struct {
	Edge    *Edge
	Runtime *testenv.Containerd
	Cmd     *exec.Cmd
	// Dir holds the kubelet's configuration, certificates and root
	// directory, and the runtime's files.
	Dir string
	// ManifestDir is the kubelet's staticPodPath: a pod manifest written
	// there runs as a static pod (empty unless a test writes one).
	ManifestDir string
	w           *World
	args        []string
}

// RealKubeletOptions configure StartRealKubelet.
type RealKubeletOptions struct {
	// PodCIDR is the range of the node's pods; default the Node's
	// (Edge.PodCIDR, with Options.PodCIDRs), else 10.88.0.0/24.
	PodCIDR netip.Prefix
}

// StartRealKubelet starts containerd and a full kubelet (v1.36, from
// testenv.Binaries) on e, which the world made without a stand-in
// (Options.RealKubelets). The kubelet's apiserver is tether-edge's proxy
// on 127.0.0.1:10261 (start the edge with ProxyArgs): it acts as the node
// through it. Its serving certificate is issued by KubeletCA for the
// node's address and name; it accepts only client certificates of
// KubeletClientCA (x509 authentication, anonymous and webhook off) and
// authorizes whatever they ask (AlwaysAllow: the one holder is the
// apiserver). On this machine's cgroup v1 it runs with failCgroupV1 off,
// the cgroupfs driver and no QoS cgroups or node allocatable
// enforcement, so it creates no cgroup of its own. It returns once the
// node is Ready.
func (w *World) StartRealKubelet(t testenv.T, e *Edge, opts RealKubeletOptions) *RealKubelet {
	t.Helper()
	if e.Kubelet != nil {
		t.Fatalf("%s runs a stand-in kubelet: list it in Options.RealKubelets", e.Name)
	}
	if w.KubeletClientCA == nil {
		t.Fatalf("the world has no kubelet client CA: list %s in Options.RealKubelets", e.Name)
	}
	dir := w.Path(e.Name + "-kubelet")
	runtimeDir := filepath.Join(dir, "containerd")
	if err := os.MkdirAll(runtimeDir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	k := &RealKubelet{Edge: e, Dir: dir, ManifestDir: filepath.Join(dir, "manifests"), w: w}
	if err := os.MkdirAll(k.ManifestDir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	if !opts.PodCIDR.IsValid() {
		opts.PodCIDR = e.PodCIDR
	}
	k.Runtime = testenv.StartContainerd(t, e.Host, testenv.ContainerdOptions{Dir: runtimeDir, PodCIDR: opts.PodCIDR})

	serving, err := w.KubeletCA.ServerCert(e.Name, e.Host.Addr.String(), e.Name, e.Name+"."+Zone)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cert, key, err := serving.WriteFiles(dir, "serving")
	if err != nil {
		t.Fatalf("%v", err)
	}
	clientCA, err := w.KubeletClientCA.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatalf("%v", err)
	}
	config := map[string]any{
		"kind":                     "KubeletConfiguration",
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupsPerQOS":            false,
		"enforceNodeAllocatable":   []string{},
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + k.Runtime.Socket,
		"port":                     KubeletPort,
		"readOnlyPort":             0,
		"healthzPort":              0,
		"tlsCertFile":              cert,
		"tlsPrivateKeyFile":        key,
		"authentication": map[string]any{
			"x509":      map[string]any{"clientCAFile": clientCA},
			"webhook":   map[string]any{"enabled": false},
			"anonymous": map[string]any{"enabled": false},
		},
		"authorization": map[string]any{"mode": "AlwaysAllow"},
		// Test pods on a shared disk: never evict them, never collect
		// the imported images (a registry to pull them again is absent).
		"evictionHard":                map[string]string{},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"volumePluginDir":             filepath.Join(dir, "volume-plugins"),
		"nodeStatusUpdateFrequency":   "2s",
		"syncFrequency":               "10s",
		"staticPodPath":               k.ManifestDir,
	}
	configJSON, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		t.Fatalf("%v", err)
	}
	configFile := filepath.Join(dir, "config.json")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	for file, data := range map[string][]byte{
		configFile: configJSON,
		kubeconfig: []byte(`apiVersion: v1
kind: Config
clusters: [{name: edge, cluster: {server: "http://127.0.0.1:10261"}}]
contexts: [{name: edge, context: {cluster: edge, user: node}}]
users: [{name: node, user: {}}]
current-context: edge
`),
	} {
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatalf("%v", err)
		}
	}
	k.args = []string{
		"--config", configFile,
		"--kubeconfig", kubeconfig,
		"--root-dir", filepath.Join(dir, "root"),
		"--hostname-override", e.Name,
		"--node-ip", e.Host.Addr.String(),
		"--v", "2",
	}
	k.Cmd = k.Runtime.Start(t, testenv.Binaries(t).Kubelet, k.args...)

	ctx := context.Background()
	var why string
	testenv.EventuallyWithin(t, 2*time.Minute, "node "+e.Name+" Ready with its real kubelet", func() bool {
		if e.Host.Exited(k.Cmd) {
			return true
		}
		n, err := w.CP.Client.CoreV1().Nodes().Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				why = fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue
			}
		}
		why = "no Ready condition"
		return false
	})
	if e.Host.Exited(k.Cmd) {
		t.Fatalf("kubelet on %s exited:\n%s", e.Name, e.Host.Log(k.Cmd))
	}
	t.Logf("node %s Ready with a real kubelet (%s)", e.Name, why)
	return k
}

// Log is the kubelet's output so far.
func (k *RealKubelet) Log() string { return k.Edge.Host.Log(k.Cmd) }

// Exited reports whether the kubelet has exited.
func (k *RealKubelet) Exited() bool { return k.Edge.Host.Exited(k.Cmd) }

// PowerCut ends the node as a power cut does: the kubelet gets SIGKILL,
// then the runtime and every container go (Containerd.PowerOff). The
// kubelet's root directory and the runtime's disk stay for Boot.
func (k *RealKubelet) PowerCut() error {
	if err := syscall.Kill(-k.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill the kubelet of %s: %w", k.Edge.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = k.Edge.Host.Wait(ctx, k.Cmd) // killed: the exit status says so
	if ctx.Err() != nil {
		return fmt.Errorf("the kubelet of %s did not exit after SIGKILL", k.Edge.Name)
	}
	return k.Runtime.PowerOff()
}

// Boot starts containerd and the kubelet again, as they were configured,
// on what PowerCut left: the node rebooted. It returns the new kubelet
// once it runs, without waiting for the cloud (which may be away); k must
// not be used any more.
func (k *RealKubelet) Boot(t testenv.T) *RealKubelet {
	t.Helper()
	n := *k
	n.Runtime = k.Runtime.Boot(t)
	n.Cmd = n.Runtime.Start(t, testenv.Binaries(t).Kubelet, n.args...)
	return &n
}

// RunningPods asks the kubelet's own server which pods its runtime runs
// (GET /runningpods/ on its HTTPS port, with a client certificate of
// KubeletClientCA as the apiserver's, its serving certificate verified by
// KubeletCA), by namespace/name: what the node does, whether or not the
// cloud has heard of it. A static pod has the UID the kubelet gave it,
// not its mirror pod's.
func (k *RealKubelet) RunningPods(ctx context.Context) (map[string]types.UID, error) {
	client, err := k.w.kubeletClient(k.Edge)
	if err != nil {
		return nil, err
	}
	url := "https://" + net.JoinHostPort(k.Edge.Host.Addr.String(), fmt.Sprint(KubeletPort)) + "/runningpods/"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	var list corev1.PodList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("running pods of %s: %w (%.200s)", k.Edge.Name, err, body)
	}
	pods := map[string]types.UID{}
	for _, p := range list.Items {
		pods[p.Namespace+"/"+p.Name] = p.UID
	}
	return pods, nil
}

// kubeletClient is an HTTPS client to e's real kubelet as the apiserver
// is one: dialled in e's namespace, with a client certificate of
// KubeletClientCA, verifying the kubelet's by KubeletCA.
func (w *World) kubeletClient(e *Edge) (*http.Client, error) {
	kp, err := w.KubeletClientCA.ClientCert(RealKubeletUser)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     e.Host.DialContext,
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{kp.TLS}, RootCAs: w.KubeletCA.Pool()},
	}}, nil
}
