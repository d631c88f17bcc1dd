package world

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-edge/tether/internal/testenv"
)

// HollowKubeletPort is the port of a hollow kubelet's server (plain HTTP);
// the stand-in kubelet keeps KubeletPort on the same host.
const HollowKubeletPort = 10350

// HollowComponents is the --cache-components value an edge needs for a
// hollow kubelet: kubemark's kubelet says "hollow-kubelet" in its
// User-Agent where the real one says "kubelet".
const HollowComponents = "kubelet,hollow-kubelet,kube-proxy,coredns"

// HollowKubelet is kubemark's hollow node on an edge host: the kubelet's
// own code (pod workers, volume manager, token manager, node status, the
// Lease, CSINode) over a fake in-memory container runtime. Every start is
// a reboot: the runtime and the root directory are new, so every pod is
// admitted, mounted and started again from what the API answers.
type HollowKubelet struct {
	Edge *Edge
	// Straight is set when the kubelet talks to kube-apiserver itself
	// rather than through tether-edge.
	Straight bool

	w   *World
	cmd *exec.Cmd
	dir string
}

// StartHollowKubelet starts a hollow kubelet named after e on e's host,
// talking to tether-edge's apiserver proxy (127.0.0.1:10261) as a real
// node's kubelet does, or, with straight, to kube-apiserver with the
// node's certificate (the baseline tether-edge is measured against).
func (w *World) StartHollowKubelet(t testenv.T, e *Edge, straight bool) *HollowKubelet {
	t.Helper()
	k := &HollowKubelet{Edge: e, Straight: straight, w: w, dir: w.Path(e.Name + "-hollow")}
	if err := os.MkdirAll(filepath.Join(k.dir, "tmp"), 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	kubeconfig, err := k.writeKubeconfig()
	if err != nil {
		t.Fatalf("hollow kubelet of %s: %v", e.Name, err)
	}
	// kubemark makes its fake runtime's socket in /tmp whatever TMPDIR
	// says (bound under a temporary name, then renamed) and never removes
	// it: it runs in a mount namespace of its own whose /tmp is the
	// world's tmp dir for it, removed with the world. The world's own
	// directory, if it is in /tmp, is bound back in place.
	tmp := filepath.Join(k.dir, "tmp")
	world := ""
	if rel, ok := strings.CutPrefix(w.Dir, "/tmp/"); ok {
		world = rel
	}
	k.cmd = e.Host.Start(t, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`set -e; tmp=$1 world=$2; shift 2
		if [ -n "$world" ]; then mkdir -p "$tmp/$world"; mount --bind "/tmp/$world" "$tmp/$world"; fi
		mount --rbind "$tmp" /tmp
		exec "$@"`, "sh", tmp, world,
		"env", "TMPDIR=/tmp", testenv.Binaries(t).Kubemark,
		"--morph=kubelet", "--name", e.Name, "--kubeconfig", kubeconfig,
		"--use-host-image-service=false",
		"--kubelet-port", fmt.Sprint(HollowKubeletPort), "--kubelet-read-only-port", "0",
		"--v=2")
	return k
}

// writeKubeconfig writes the kubeconfig of the hollow kubelet: tether-edge
// on loopback without credentials (tether-edge speaks for the node with
// its certificate), or kube-apiserver with the node's certificate.
func (k *HollowKubelet) writeKubeconfig() (string, error) {
	cfg := clientcmdapi.NewConfig()
	cluster := &clientcmdapi.Cluster{Server: "http://127.0.0.1:10261"}
	user := &clientcmdapi.AuthInfo{}
	if k.Straight {
		cluster = &clientcmdapi.Cluster{Server: k.w.CP.URL, CertificateAuthority: k.w.Path("cluster-ca.crt")}
		user = &clientcmdapi.AuthInfo{ClientCertificate: k.Edge.CertFile, ClientKey: k.Edge.KeyFile}
	}
	cfg.Clusters["cloud"] = cluster
	cfg.AuthInfos["node"] = user
	cfg.Contexts["node"] = &clientcmdapi.Context{Cluster: "cloud", AuthInfo: "node"}
	cfg.CurrentContext = "node"
	path := filepath.Join(k.dir, "kubelet.kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// Kill ends the hollow kubelet with SIGKILL, as a power cut does.
func (k *HollowKubelet) Kill() error {
	if err := syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := k.Edge.Host.Wait(ctx, k.cmd)
	if ctx.Err() != nil {
		return fmt.Errorf("hollow kubelet of %s did not exit after SIGKILL", k.Edge.Name)
	}
	_ = err // killed: the exit status says so
	return nil
}

// Restart kills the hollow kubelet and starts a new one like it: a node
// rebooted.
func (k *HollowKubelet) Restart(t testenv.T) *HollowKubelet {
	t.Helper()
	if err := k.Kill(); err != nil {
		t.Fatalf("%v", err)
	}
	return k.w.StartHollowKubelet(t, k.Edge, k.Straight)
}

// Log is the hollow kubelet's output so far.
func (k *HollowKubelet) Log() string { return k.Edge.Host.Log(k.cmd) }

// Exited reports whether the hollow kubelet has exited.
func (k *HollowKubelet) Exited() bool { return k.Edge.Host.Exited(k.cmd) }

// RunningPods asks the hollow kubelet's own server which pods its runtime
// runs (GET /runningpods/), by namespace/name: what the node does, whether
// or not the cloud has heard of it.
func (k *HollowKubelet) RunningPods(ctx context.Context) (map[string]types.UID, error) {
	url := fmt.Sprintf("http://%s/runningpods/", net.JoinHostPort(k.Edge.Host.Addr.String(), fmt.Sprint(HollowKubeletPort)))
	body, err := Get(ctx, k.Edge.Host, url)
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		return nil, fmt.Errorf("running pods of %s: %w (%.200s)", k.Edge.Name, err, body)
	}
	pods := map[string]types.UID{}
	for _, p := range list.Items {
		pods[p.Namespace+"/"+p.Name] = p.UID
	}
	return pods, nil
}
